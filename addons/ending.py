"""How a flow ended, in one vocabulary: the decision and the credentials that the audit event
(:mod:`addons.audit`) and the metrics (:mod:`addons.metrics`) both report.

**The decision** is the last one an addon made (``surrogate.decision``), with two corrections:

- A refusal made after the egress rules allowed the request (resolve's ``unresolvable``,
  ``special_address``, ``own_listener``; a hook route's refusal; a budget; a failed check; an
  unscannable response) keeps the rule that allowed it (``surrogate.allowed_by``, from policy),
  so ``rule`` is null only where no egress rule allowed anything.
- A flow that ends in an error where the decision was to allow is classified by who ended it
  (:func:`client_hung_up`) and where (:func:`at_boundary`):

  ======================================================  ==========  =================
  how it ended                                            decision    reason
  ======================================================  ==========  =================
  the client went away after the response head, at a      ``allow``   ``client_closed``
  boundary: no byte of an event (or line) it received
  was cut off
  the client went away before the response head, or       ``error``   ``client_closed``
  mid-event, mid-line or mid-body
  anything else: the upstream (or the connection to it)   ``error``   ``upstream_error``
  failed
  ======================================================  ==========  =================

  A boundary: every byte the proxy forwarded of a ``text/event-stream`` body ends an event (the
  last bytes are a blank line, ``\\n\\n``, ``\\r\\n\\r\\n`` or ``\\r\\r``: WHATWG HTML §9.2.6
  dispatches an event there), or of an ``application/x-ndjson`` / ``application/jsonl`` body
  ends a line; nothing forwarded yet counts too (no event was cut). A client that stops reading
  a stream there, as the OpenAI and Anthropic SDKs do after ``data: [DONE]`` or their last event,
  got every event whole: its request was served as allowed, and ``client_closed`` says who ended
  it. Any other body the client leaves before its end (a download, a JSON document) was cut
  short: an error, but the client's, never ``upstream_error``. A response that the upstream
  ended is ``allowed`` whatever the client did afterwards (mitmproxy reports no error then).

**The credentials used** are those whose secret left the proxy: substitute records what it
swapped or injected into the head and body (``surrogate.used``); a refusal before the request
was sent (:func:`addons.facts.refuse` in a request hook) clears them, and so does an upstream
failure before the upstream's TLS was up (nothing was written to it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from mitmproxy import flow as mflow
from mitmproxy import http
from mitmproxy.connection import ConnectionState

from addons import facts
from proxy.core.decide import Action, Decision, Reason

TAIL = "surrogate.forwarded_tail"  # the last bytes forwarded of a streamed event body (watch)

_EVENT_END = (b"\n\n", b"\r\r", b"\r\n\r\n")  # an SSE event ends with a blank line
_LINE_END = (b"\n",)
_STREAMS = {
    "text/event-stream": _EVENT_END,
    "application/x-ndjson": _LINE_END,
    "application/jsonl": _LINE_END,
}


def _boundaries(response: http.Response) -> tuple[bytes, ...] | None:
    media = (facts.header(response.headers.fields, b"content-type") or "").split(";", 1)[0]
    return _STREAMS.get(media.strip().lower())


def watch(flow: http.HTTPFlow) -> None:
    """Keep the last bytes forwarded of an event-stream body (``responseheaders``, after every
    addon that wraps the stream: what this sees is what the client was sent)."""
    response = flow.response
    if response is None or not callable(response.stream) or _boundaries(response) is None:
        return
    inner: Callable[[bytes], bytes | Iterable[bytes]] = response.stream
    flow.metadata[TAIL] = b""

    def forward(chunk: bytes) -> list[bytes]:
        got = inner(chunk)
        pieces = [got] if isinstance(got, bytes) else list(got)
        for piece in pieces:
            if piece:
                flow.metadata[TAIL] = (flow.metadata[TAIL] + piece)[-4:]
        return pieces

    response.stream = forward


def client_hung_up(flow: http.HTTPFlow) -> bool:
    """Whether the client ended the flow: mitmproxy 12.3's message says so ("Client
    disconnected." from its HTTP/1 server side, "stream reset by client (...)" from its HTTP/2
    one), or the client's connection was already closed for reading when the error came (an
    HTTP/2 client's GOAWAY or close: "HTTP/2 connection closed: ...", "peer closed connection",
    which an upstream's HTTP/2 connection also says)."""
    msg = flow.error.msg if flow.error else ""
    if msg == "Client disconnected." or msg.startswith("stream reset by client"):
        return True
    if msg == mflow.Error.KILLED_MESSAGE:
        return False  # surrogate ended it (a refusal, a revoked token, a withheld error)
    return not flow.client_conn.state & ConnectionState.CAN_READ


def at_boundary(flow: http.HTTPFlow) -> bool:
    """Whether everything forwarded of the response body so far ends at an event (or line)
    boundary, so that the client received no event cut off (see the module docstring)."""
    response = flow.response
    if response is None:
        return False
    ends = _boundaries(response)
    tail = flow.metadata.get(TAIL)
    return ends is not None and tail is not None and (tail == b"" or tail.endswith(ends))


def decision(flow: http.HTTPFlow) -> Decision | None:
    """The decision the audit event and the metrics report (module docstring)."""
    found: Decision | None = flow.metadata.get(facts.DECISION)
    allowed_by = flow.metadata.get(facts.ALLOWED_BY)
    if found is not None and found.rule is None and allowed_by is not None:
        found = dataclasses.replace(found, rule=allowed_by)
    if not flow.error or (found is not None and not found.allowed):
        return found
    rule = found.rule if found else allowed_by
    would_deny = found.would_deny if found else None
    if client_hung_up(flow):
        status = flow.response.status_code if flow.response else 0
        if at_boundary(flow):
            return Decision(Action.ALLOW, Reason.CLIENT_CLOSED, flow.error.msg, rule, status, would_deny)
        return Decision(Action.ERROR, Reason.CLIENT_CLOSED, flow.error.msg, rule, status, would_deny)
    return Decision(Action.ERROR, Reason.UPSTREAM_ERROR, flow.error.msg, rule, 502, would_deny)


def used(flow: http.HTTPFlow) -> dict[str, int]:
    """The credentials (name → version) whose secret left the proxy (module docstring)."""
    found: dict[str, int] = flow.metadata.get(facts.USED, {})
    if found and flow.error and not flow.server_conn.timestamp_tls_setup and flow.request.scheme == "https":
        return {}  # the upstream's TLS never completed: no secret left the proxy
    return found
