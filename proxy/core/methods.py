"""A request's method as servers may read it: the method identity every matcher uses.

Many servers act on another method than the request line's when the request names one
elsewhere: an override header (``X-HTTP-Method-Override``: Google APIs, Rack's
``MethodOverride`` and most REST toolkits; ``X-HTTP-Method``: OData, Microsoft Graph;
``X-Method-Override``) or a ``_method`` parameter (Rails/Rack, Laravel, Symfony: a form field,
or the query). So a ``GET`` carrying ``X-HTTP-Method-Override: DELETE`` is a DELETE to them.

Decided: each such name is a *reading* of the request's method (:func:`method_readings`,
computed once per request by ``addons/policy.py`` into ``facts.METHODS``), and every matcher
reads them all, each its own way round:

- an egress rule's ``methods`` (an allow-list, :func:`proxy.core.decide.decide_request`): every
  reading must be listed, so a GET-only rule refuses that GET (``method_not_allowed``);
- a hook route's and an ask rule's ``methods`` (catches, :mod:`proxy.core.hooks`,
  :mod:`proxy.core.approvals`): any listed reading catches it.

A ``_method`` in a request *body* is read only where a body is read before the decision (an
ask rule, :func:`body_names_method`); an egress rule's ``methods`` does not hold every POST's body
to look (an operator who must stop a POST acting as DELETE leaves POST out or asks for it).
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import parse_qsl, unquote_to_bytes, urlsplit

OVERRIDE_HEADERS = ("x-http-method-override", "x-http-method", "x-method-override")
# CGI-style servers (WSGI, Rack) read ``_`` in a field name as ``-``: X_HTTP_Method_Override counts
_OVERRIDE_NAMES = frozenset(n.encode() for n in OVERRIDE_HEADERS)
# a parameter name PHP turns into ``_method`` (``.``, a space, an unmatched ``[`` become ``_``)
_PARAM_PREFIX = str.maketrans({".": "_", " ": "_", "[": "_"})
_BODY_METHOD = re.compile(rb"(?i)(?<![a-z0-9])(?:_|\\u005f|[.\[ +])method")


def _is_method_param(name: str) -> bool:
    """``_method`` as Rails, Laravel or Symfony read a parameter name: any case, PHP's renaming
    of ``.``/space/``[`` to ``_``, a trailing ``[]``."""
    return name.lower().strip().removesuffix("[]").translate(_PARAM_PREFIX) == "_method"


def _params(text: str) -> list[tuple[str, str]]:
    """A query or form's fields, ``;`` taken as a separator too (Rack 2, old Python)."""
    return parse_qsl(text.replace(";", "&"), keep_blank_values=True)


def method_readings(method: str, headers: Any, target: str) -> frozenset[str]:
    """Every method a server may take a request for, upper-cased: ``method`` (as sent), each
    comma-separated value of an override header (:data:`OVERRIDE_HEADERS`, ``_`` read as ``-``;
    ``headers``: mitmproxy's ``Headers``, read through its raw ``fields``) and each ``_method``
    parameter of ``target``'s query (:func:`_is_method_param`, its name percent-decoded)."""
    found = {method.upper()}
    for name, raw in headers.fields:  # one pass over the raw fields: get_all per name costs 10x
        if name.lower().replace(b"_", b"-") in _OVERRIDE_NAMES:
            found.update(v.strip().upper() for v in raw.decode("latin-1").split(",") if v.strip())
    _, mark, query = target.partition("?")
    if mark and ("%" in query or "method" in query.lower()):  # else no query parse: none named
        query = urlsplit(target).query
        found.update(v.strip().upper() for k, v in _params(query) if _is_method_param(k))
    found.discard("")
    return frozenset(found)


def body_names_method(body: bytes) -> bool:
    """Whether a request body names ``_method`` in any spelling a form, multipart part or JSON
    gives it (``_method``, ``%5Fmethod``, ``_%6Dethod``, ``.method``, ``\\u005fmethod``, a
    multipart ``name*=UTF-8''_%6Dethod`` or ``name="_\\method"``, JSON behind a BOM; any case):
    read as asking for every method. Searched as sent, percent-decoded and with backslashes
    dropped; a body in another charset (UTF-16) is not decoded (decided: no server found reads it)."""
    for form in (body, unquote_to_bytes(body), body.replace(b"\\", b"")):
        if _BODY_METHOD.search(form):
            return True
    text = body.decode("utf-8", "replace").lstrip("\ufeff")
    if any(_is_method_param(k) for k, _ in _params(text)):
        return True
    try:
        doc = json.loads(text)
    except ValueError:
        return False
    return isinstance(doc, dict) and any(_is_method_param(str(k)) for k in doc)
