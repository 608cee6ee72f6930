"""errorpage: mitmproxy's own error answers become surrogate's refusals.

mitmproxy 12.3 answers an upstream it cannot reach (connection refused, a TLS certificate that
does not verify, an upstream that closes or answers garbage), and a request it cannot read, with
an HTML page and ``Server: mitmproxy``: ``Http1Server.send`` writes ``make_error_response`` and
``Http2Server`` sends the same page on the stream, for every ``ResponseProtocolError`` an
``HttpStream`` sends toward the client (``mitmproxy/proxy/layers/http/__init__.py``:
``handle_protocol_error``, ``check_invalid``, ``check_body_size``). No hook can answer instead:
the ``error`` hook runs before the page is written and mitmproxy ignores a response set there.
:func:`install` wraps these once per process:

- ``HttpStream.handle_event``: each such error toward the client is given its answer, built from
  the flow (request id, Content-Type, the refusal already decided if there is one) by
  :func:`addons.refusals.answer`; an upstream failure is ``502 upstream_error`` with the RFC 9209
  type of its kind (``connection_refused``, ``tls_certificate_error``…), and a gRPC request gets
  ``UNAVAILABLE`` (:mod:`proxy.core.refusals`);
- ``Http1Server.send`` and ``Http2Server._handle_event`` write that answer where mitmproxy wrote
  its page (HTTP/1: then the connection closes, as before);
- ``HttpStream.check_invalid`` and ``check_body_size``: a request mitmproxy refuses itself
  (framing read two ways, a body too large) is recorded as that refusal before the ``error``
  hook, so the audit event and metrics say what the sandbox is told (review r-refusals);
- ``_http1.make_error_response`` (what is left: a request head mitmproxy cannot parse, before any
  flow) becomes the same JSON refusal without a request id.

The answer holds only surrogate's words: a sentence chosen by the kind of failure, never
mitmproxy's message, which may quote the upstream's bytes (it stays in the audit event, which
addons/scrub.py ``error`` checked first). A killed flow (``flow.kill()``, or scrub withholding an
error that quoted a secret) has no page, and still none. Pinned below mitmproxy 12.4;
tests/e2e/test_refusals.py fails if the wrapped methods stop answering.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator
from typing import Any

from mitmproxy import http
from mitmproxy.connection import ConnectionState
from mitmproxy.net.http import http1
from mitmproxy.proxy import commands
from mitmproxy.proxy.layers import http as http_layers
from mitmproxy.proxy.layers.http import _http1, _http2
from mitmproxy.proxy.layers.http._events import ErrorCode, ResponseProtocolError
from mitmproxy.proxy.layers.http._hooks import HttpErrorHook

from addons import facts, framing, refusals
from proxy.core.decide import Decision, Reason, deny
from proxy.core.refusals import upstream_failure

log = logging.getLogger("surrogate")

_MARK = "_surrogate_errorpage"

Method = Callable[[Any, Any], Generator[Any, Any, None]]
Check = Callable[[Any, bool], Generator[Any, Any, bool]]

# mitmproxy's error codes for a request it refuses itself (the rest are the upstream's failures)
_CLIENT_SIDE: dict[ErrorCode, tuple[Reason, str, str]] = {
    ErrorCode.GENERIC_CLIENT_ERROR: (
        Reason.BAD_REQUEST_HEAD,
        "the request is not valid HTTP",
        "http_request_error",
    ),
    ErrorCode.REQUEST_VALIDATION_FAILED: (
        Reason.BAD_REQUEST_HEAD,
        "the request's framing headers could be read two ways",
        "http_request_error",
    ),
    ErrorCode.DESTINATION_UNKNOWN: (
        Reason.BAD_REQUEST_HEAD,
        "the request names no destination (no Host header)",
        "destination_not_found",
    ),
    ErrorCode.REQUEST_TOO_LARGE: (
        Reason.BAD_REQUEST_BODY,
        "the request body is too large",
        "http_request_error",
    ),
}
# HttpStream's checks of a request that refuse it themselves: (reason, sentence, status, the
# message of that refusal when the check may yield other error hooks; mitmproxy 12.3's words)
_CHECKS: dict[str, tuple[Reason, str, int, str | None]] = {
    "check_invalid": (*_CLIENT_SIDE[ErrorCode.REQUEST_VALIDATION_FAILED][:2], 400, None),
    "check_body_size": (
        *_CLIENT_SIDE[ErrorCode.REQUEST_TOO_LARGE][:2],
        413,
        "Request body exceeds mitmproxy's body_size_limit.",
    ),
}
# connection-specific fields, which HTTP/2 forbids (RFC 9113 §8.2.2)
_H2_DROPPED = {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"}


class Answered(ResponseProtocolError):
    """A ``ResponseProtocolError`` toward the client with the answer to write instead of
    mitmproxy's page. Where the answer cannot be written (a response already started), the
    connection layers treat it as the error it is."""

    def __init__(self, error: ResponseProtocolError, response: http.Response) -> None:
        super().__init__(error.stream_id, error.message, error.code)
        self.response = response


def answer_for(flow: http.HTTPFlow, error: ResponseProtocolError, status: int) -> http.Response:
    """The answer to ``flow`` for mitmproxy's ``error`` (whose page would have had ``status``).
    A flow no hook saw (mitmproxy refused it before any: no Host) has no audit event, so its
    answer has no request id."""
    request_id = flow.metadata.get(facts.REQUEST_ID)
    decided: Decision | None = flow.metadata.get(facts.DECISION)
    kind = None
    if decided is not None and not decided.allowed:
        decision = decided  # refused already (e.g. addons/framing.py closed the upstream)
    elif error.message.startswith(framing.BROKEN):
        sentence = "the request body disagrees with the length its head declares"
        decision, kind = deny(Reason.BAD_REQUEST_BODY, sentence, status), "http_request_error"
    elif error.code in _CLIENT_SIDE:
        reason, sentence, kind = _CLIENT_SIDE[error.code]
        decision = deny(reason, sentence, status)
    else:
        kind, sentence = upstream_failure(error.message, error.code is ErrorCode.CONNECT_FAILED)
        where = flow.metadata.get(facts.HOST, flow.request.host)
        rule = decided.rule if decided is not None else None
        decision = deny(Reason.UPSTREAM_ERROR, f"{where}:{flow.request.port}: {sentence}", status, rule)
    return refusals.answer(decision, request_id, flow.request, error=kind)


def _refused_by_mitmproxy(flow: http.HTTPFlow, reason: Reason, sentence: str, status: int) -> None:
    """Record, before the ``error`` hook (audit, metrics), the refusal the sandbox will be told
    (:func:`answer_for` answers with it), unless one was decided already."""
    decided: Decision | None = flow.metadata.get(facts.DECISION)
    if decided is None or decided.allowed:
        rule = decided.rule if decided is not None else None
        flow.metadata[facts.DECISION] = deny(reason, sentence, status, rule)
        flow.metadata[facts.ANSWERED] = status


def _deciding(original: Check, reason: Reason, sentence: str, status: int, own: str | None) -> Check:
    """``HttpStream.check_invalid`` / ``check_body_size`` (``request``: the client's side),
    recording their refusal of a request as the decision before the error hook they yield runs
    (review r-refusals: the sandbox was told ``400 bad_request_head`` and the audit event with
    its request id said ``error upstream_error 502``). ``own``: the message of the check's own
    refusal, where the check can also run other steps whose error hooks are not its refusal
    (``check_body_size`` starts streaming past ``stream_large_bodies``, which connects upstream
    and may fail there)."""

    def check(self: Any, request: bool) -> Generator[Any, Any, bool]:
        if not request:  # the response's side: mitmproxy's as it is (delegated in C)
            return (yield from original(self, request))
        steps = original(self, request)
        reply = None
        while True:
            try:
                command = steps.send(reply)
            except StopIteration as done:
                return bool(done.value)
            if isinstance(command, HttpErrorHook) and (
                own is None or (command.flow.error is not None and command.flow.error.msg == own)
            ):
                _refused_by_mitmproxy(self.flow, reason, sentence, status)
            reply = yield command

    setattr(check, _MARK, True)
    return check


def _answering(original: Method) -> Method:
    def handle_event(self: Any, event: Any) -> Generator[Any, Any, None]:
        for command in original(self, event):
            if (
                isinstance(command, HttpErrorHook)
                and type(event) is ResponseProtocolError
                and event.message.startswith(framing.BROKEN)
            ):  # surrogate's own words (addons/framing.py): the request's body, not the upstream
                sentence = "the request body disagrees with the length its head declares"
                _refused_by_mitmproxy(command.flow, Reason.BAD_REQUEST_BODY, sentence, 502)
            elif (
                isinstance(command, http_layers.SendHttp)
                and type(command.event) is ResponseProtocolError
                and command.connection is self.context.client
                and (status := command.event.code.http_status_code()) is not None
                and getattr(self, "flow", None) is not None
            ):
                try:
                    response = answer_for(self.flow, command.event, status)
                except Exception as e:  # fail closed: a refusal without the flow's facts
                    log.error("errorpage failed with %s; a bare refusal sent", type(e).__name__)
                    response = refusals.answer(
                        deny(Reason.INTERNAL_ERROR, "surrogate could not process this request", status), None
                    )
                command = http_layers.SendHttp(Answered(command.event, response), command.connection)
            yield command

    setattr(handle_event, _MARK, True)
    return handle_event


def _final_sent(response: http.Response | None) -> bool:
    """Whether the HTTP/1 connection already carries this request's answer: a final response,
    or a ``101`` (the connection switched protocols). mitmproxy answers ``Expect: 100-continue``
    itself before it connects upstream (curl sends it with every upload over 1 MiB), so a ``100``
    is no answer: without this, an upstream that failed after it got the client nothing at all
    (review r-refusals)."""
    return response is not None and (response.status_code >= 200 or response.status_code == 101)


def _h1_writing(original: Method) -> Method:
    def send(self: Any, event: Any) -> Generator[Any, Any, None]:
        if (
            isinstance(event, Answered)
            and self.conn.state & ConnectionState.CAN_WRITE
            and not _final_sent(self.response)
        ):
            event.response.headers["Connection"] = "close"
            yield commands.SendData(self.conn, http1.assemble_response(event.response))
            yield commands.CloseConnection(self.conn)
            return
        yield from original(self, event)

    setattr(send, _MARK, True)
    return send


def _h2_writing(original: Method) -> Method:
    def _handle_event(self: Any, event: Any) -> Generator[Any, Any, None]:
        sid = getattr(event, "stream_id", None)
        if (
            isinstance(event, Answered)
            and not self.is_closed(sid)
            and self.is_open_for_us(sid)
            and not self.h2_conn.streams[sid].state_machine.headers_sent
        ):
            r = event.response
            fields = [(b":status", b"%d" % r.status_code)]
            fields += [(n.lower(), v) for n, v in r.headers.fields if n.lower() not in _H2_DROPPED]
            body = r.raw_content or b""
            self.h2_conn.send_headers(sid, fields, end_stream=not body)
            if body:
                self.h2_conn.send_data(sid, body, end_stream=True)
            yield commands.SendData(self.conn, self.h2_conn.data_to_send())
            return
        yield from original(self, event)

    setattr(_handle_event, _MARK, True)
    return _handle_event


def _error_response(status_code: int, message: str = "") -> bytes:
    """``_http1.make_error_response``'s replacement: the JSON refusal (``message``, mitmproxy's,
    is not quoted)."""
    if status_code >= 500:
        decision = deny(Reason.UPSTREAM_ERROR, "the upstream failed", status_code)
    elif status_code == 413:
        decision = deny(Reason.BAD_REQUEST_BODY, "the request body is too large", status_code)
    else:
        decision = deny(Reason.BAD_REQUEST_HEAD, "the request is not valid HTTP/1.1", status_code)
    response = refusals.answer(decision, None, headers={"Connection": "close"})
    raw: bytes = http1.assemble_response(response)
    return raw


setattr(_error_response, _MARK, True)


def install() -> None:
    """Wrap the methods above (once per process; later calls do nothing)."""
    stream: Any = http_layers.HttpStream
    if not getattr(stream.handle_event, _MARK, False):
        stream.handle_event = _answering(stream.handle_event)
    h1: Any = _http1.Http1Server
    if not getattr(h1.send, _MARK, False):
        h1.send = _h1_writing(h1.send)
    h2: Any = _http2.Http2Server
    if not getattr(h2._handle_event, _MARK, False):
        h2._handle_event = _h2_writing(h2._handle_event)
    for name, (reason, sentence, status, own) in _CHECKS.items():
        if not getattr(getattr(stream, name), _MARK, False):
            setattr(stream, name, _deciding(getattr(stream, name), reason, sentence, status, own))
    if not getattr(_http1.make_error_response, _MARK, False):
        _http1.make_error_response = _error_response
