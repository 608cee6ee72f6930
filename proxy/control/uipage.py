# ruff: noqa: E501 - the HTML templates keep one element per line
"""The approvals page's HTML (issue 16): Jinja2 templates with autoescaping on for every value, so
a hostile sandbox's path, host or preview (the request head) is shown as text, never markup. No build step.

The page holds one ``<style>``, a constant admitted by its hash (:data:`STYLE_SOURCE`), and one
``<script>`` with the response's CSP nonce. Not a nonce for the style: the script parses each
re-fetched page (DOMParser), whose style carries that response's nonce, and Chromium checks it
against the live page's policy, logging a CSP violation on every re-render (found by
tests/e2e/test_approvals_browser.py); a hash holds for every copy of the constant. The
script only listens on ``/ui/stream`` (EventSource, WHATWG HTML §9.2) and, on each event,
re-fetches the page and swaps its three lists in. Without JavaScript every button still works:
each is a plain form POST answered by a 303 back to the page.

Shapes: :func:`render_page` and :func:`render_login` return ``str``; a notice or error is one of
the fixed sentences of :data:`NOTICES` (chosen by a key from the query), never text from input.
"""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass

from jinja2 import DictLoader, Environment, StrictUndefined
from markupsafe import Markup

from proxy.store.base import ApprovalRecord, GrantRecord

NOTICES = {
    "approved": "Approved.",
    "denied": "Denied.",
    "revoked": "Grant revoked.",
    "not_pending": "That request was already decided, withdrawn or timed out.",
    "not_found": "No such request or grant.",
    "bad_scope": "That scope is not offered for this request, or its duration is malformed.",
    "bad_login": "That is not the operator token.",
    "signed_out": "Signed out.",
}

# The choices of a scope's select (value, label); "for" takes the duration field.
SCOPE_CHOICES = {"once": "once", "session": "this session", "for": "for…", "always": "always"}

_STYLE = Markup("""
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;width:100%;margin-bottom:1.5em}
th,td{border:1px solid #ccc;padding:.3em .5em;text-align:left;vertical-align:top}
th{background:#f3f3f3} pre{margin:0;max-width:40em;max-height:12em;overflow:auto;white-space:pre-wrap;word-break:break-all}
code{word-break:break-all} .notice{background:#eef6ee;border:1px solid #8b8;padding:.4em}
.error{background:#fbeaea;border-color:#c88} form{display:inline} button{margin:.1em}
input[name=duration]{width:4em} .muted{color:#777}
""")  # a constant, not input
# the CSP source that admits _STYLE (CSP Level 3 §2.3.1 hash-source: base64 SHA-256 of its text)
STYLE_SOURCE = "'sha256-" + base64.b64encode(hashlib.sha256(_STYLE.encode()).digest()).decode() + "'"

_LAYOUT = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="referrer" content="same-origin">
<title>{% block title %}surrogate{% endblock %}</title>
<style>{{ style }}</style></head>
<body>{% if notice %}<p class="notice{% if error %} error{% endif %}" role="status">{{ notice }}</p>{% endif %}
{% block body %}{% endblock %}</body></html>
"""

_LOGIN = """{% extends "layout" %}{% block title %}surrogate — sign in{% endblock %}{% block body %}
<h1>surrogate approvals</h1>
<form method="post" action="/ui/login">
<label>Operator token <input type="password" name="token" autocomplete="current-password" required></label>
<button type="submit">Sign in</button></form>
{% endblock %}
"""

_PAGE = """{% extends "layout" %}{% block title %}surrogate — approvals{% endblock %}{% block body %}
<h1>surrogate approvals</h1>
<form method="post" action="/ui/logout"><input type="hidden" name="csrf" value="{{ csrf }}">
<button type="submit">Sign out</button></form>
<section id="pending"><h2>Pending requests ({{ pending|length }})</h2>
{% if pending %}<table><thead><tr><th>asked</th><th>claim</th><th>request</th><th>credentials</th>
<th>preview (head, and a body up to 64 KiB)</th><th>rule</th><th>decide</th></tr></thead><tbody>
{% for a in pending %}<tr id="approval-{{ a.id }}" data-approval="{{ a.id }}">
<td>{{ when(a.created_at) }}<br><span class="muted">times out {{ when(a.expires_at) }}</span></td>
<td><code>{{ a.claim_id }}</code><br><span class="muted">pool {{ a.pool }}</span></td>
<td><code>{{ a.method }} {{ a.host }}:{{ a.port }}{{ a.path }}</code></td>
<td>{% for c in a.credentials %}<code>{{ c }}</code> {% else %}<span class="muted">none</span>{% endfor %}</td>
<td><pre>{{ a.preview }}</pre></td><td><code>{{ a.rule }}</code></td>
<td><form method="post" action="/ui/approvals/{{ a.id }}/approve">
<input type="hidden" name="csrf" value="{{ csrf }}">
<select name="scope" aria-label="scope">{% for s in a.scopes %}<option value="{{ s }}">{{ choices.get(s, s) }}</option>{% endfor %}</select>
{% if "for" in a.scopes %}<input name="duration" value="10m" aria-label="duration (for…)" pattern="[0-9]{1,9}[smhd]?">{% endif %}
<button type="submit" name="verdict" value="approve">Approve</button></form>
<form method="post" action="/ui/approvals/{{ a.id }}/deny"><input type="hidden" name="csrf" value="{{ csrf }}">
<button type="submit" name="verdict" value="deny">Deny</button></form></td></tr>
{% endfor %}</tbody></table>{% else %}<p class="muted">Nothing is waiting.</p>{% endif %}</section>
<section id="grants"><h2>Active grants ({{ grants|length }})</h2>
{% if grants %}<table><thead><tr><th>claim</th><th>covers</th><th>credentials</th><th>scope</th>
<th>approved</th><th></th></tr></thead><tbody>
{% for g in grants %}<tr id="grant-{{ g.id }}"><td><code>{{ g.claim_id }}</code></td>
<td><code>{{ g.method }} {{ g.host }}:{{ g.port }}{{ g.path_prefix }}</code> and below</td>
<td>{% for c in g.credentials %}<code>{{ c }}</code> {% endfor %}</td>
<td>{{ g.scope }}{% if g.expires_at %} until {{ when(g.expires_at) }}{% endif %}</td>
<td>{{ when(g.created_at) }} by {{ g.approved_by }}</td>
<td><form method="post" action="/ui/grants/{{ g.id }}/revoke"><input type="hidden" name="csrf" value="{{ csrf }}">
<button type="submit">Revoke</button></form></td></tr>
{% endfor %}</tbody></table>{% else %}<p class="muted">No active grant.</p>{% endif %}</section>
<section id="decided"><h2>Last decisions</h2>
{% if decided %}<table><thead><tr><th>decided</th><th>claim</th><th>request</th><th>outcome</th><th>by</th></tr></thead><tbody>
{% for a in decided %}<tr><td>{{ when(a.decided_at or a.created_at) }}</td><td><code>{{ a.claim_id }}</code></td>
<td><code>{{ a.method }} {{ a.host }}:{{ a.port }}{{ a.path }}</code></td>
<td>{{ a.state }}{% if a.scope %} ({{ a.scope }}){% endif %}{% if a.reason %}: {{ a.reason }}{% endif %}</td>
<td>{{ a.decided_by or "" }}</td></tr>
{% endfor %}</tbody></table>{% else %}<p class="muted">None yet.</p>{% endif %}</section>
<script nonce="{{ nonce }}">
(function () {
  if (!window.EventSource || !window.fetch || !window.DOMParser) return;
  var busy = false, again = false;
  function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    fetch("/ui/approvals", {credentials: "same-origin", cache: "no-store"}).then(function (r) {
      return r.ok ? r.text() : null;
    }).then(function (text) {
      if (text === null) return;
      var doc = new DOMParser().parseFromString(text, "text/html");
      ["pending", "grants", "decided"].forEach(function (id) {
        var now = document.getElementById(id), fresh = doc.getElementById(id);
        if (now && fresh) now.replaceWith(fresh);
      });
    }).finally(function () { busy = false; if (again) { again = false; refresh(); } });
  }
  new EventSource("/ui/stream").addEventListener("approval", refresh);
})();
</script>
{% endblock %}
"""

_env = Environment(
    loader=DictLoader({"layout": _LAYOUT, "login": _LOGIN, "page": _PAGE}),
    autoescape=True,  # every template, whatever its name
    undefined=StrictUndefined,
)


def when(ts: float | None) -> str:
    """A timestamp as the operator reads it (UTC, seconds)."""
    return "" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


@dataclass(frozen=True, slots=True)
class Notice:
    text: str
    error: bool


def notice(key: str | None) -> Notice | None:
    """The fixed sentence a query key names (``?done=approved``, ``?error=not_pending``)."""
    text = NOTICES.get(key or "")
    return None if text is None else Notice(text, key not in ("approved", "denied", "revoked", "signed_out"))


def render_login(nonce: str, note: Notice | None = None) -> str:
    return _env.get_template("login").render(
        nonce=nonce, style=_STYLE, notice=note and note.text, error=bool(note and note.error)
    )


def render_page(
    nonce: str,
    csrf: str,
    pending: Sequence[ApprovalRecord],
    grants: Sequence[GrantRecord],
    decided: Sequence[ApprovalRecord],
    note: Notice | None = None,
) -> str:
    """The approvals page: ``pending`` (oldest first), active ``grants``, the last ``decided``."""
    return _env.get_template("page").render(
        nonce=nonce, csrf=csrf, style=_STYLE, pending=pending, grants=grants, decided=decided,
        when=when, choices=SCOPE_CHOICES, notice=note and note.text, error=bool(note and note.error),
    )  # fmt: skip
