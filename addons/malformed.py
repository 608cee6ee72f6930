"""malformed: request framing that two parsers could read differently is refused at once.

mitmproxy 12.3 reads a chunked HTTP/1 request body with h11's ``ChunkedReader``, which is
lenient: a chunk size of up to 20 hex digits (``ffffffffffffffff1`` is past 2**64, and other
parsers wrap it, cap it or refuse it), whitespace before the line end, any bytes in a chunk
extension, and a chunk-size line of any length held until its CRLF. And the request head
reaches the upstream (hooks, then the head is written) before the body is read at all, even when
both came in one read. :func:`install` wraps mitmproxy's HTTP/1 request reader once per process:

- every chunk-size line must match RFC 9112 §7.1 exactly (``chunk-size [ chunk-ext ] CRLF``:
  1 to 16 hex digits, at most 2**63 - 1 (what nginx and Go accept), extensions as tokens or
  quoted strings with optional whitespace around ``;`` and ``=``), within 4096 bytes; a trailer
  section within 64 KiB. Past that the sandbox gets ``400 bad_request_body`` (JSON) and the
  connection is closed;
- when the head arrives with body bytes already behind it, those are checked (a dry run of the
  same strict reader over a copy) before the head goes anywhere: a bad chunk in the first read
  means no hook runs and nothing is forwarded. A bad chunk that arrives later closes the
  connection to the upstream too, which then holds the head and whole chunks only, never a
  complete request (the body streams; it is not held back to be checked first).

HTTP/2: a request whose pseudo-header fields mitmproxy cannot parse (an ``:authority`` that is
no host, a missing field) was answered with a GOAWAY that ends every stream of the connection;
it now gets ``400 bad_request_head`` on its own stream. Fields that parse but hold a byte no
HTTP/1 request line may hold are refused by hygiene (:func:`proxy.core.hygiene.check_request_line`).
What the h2 library itself refuses as malformed (NUL, CR, LF, surrounding whitespace: RFC 9113
§8.2.1) stays a connection error (PROTOCOL_ERROR), as that RFC allows.

This reaches into mitmproxy's and h11's internals (pinned below mitmproxy 12.4);
tests/adversarial/test_framing.py fails if the wrapped methods stop refusing.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Generator
from typing import Any

import h2.errors
import h2.events
import h11
from h11._readers import ChunkedReader
from h11._receivebuffer import ReceiveBuffer
from mitmproxy import http
from mitmproxy.net.http import http1
from mitmproxy.proxy import commands, events
from mitmproxy.proxy.layers.http import _http1, _http2
from mitmproxy.proxy.layers.http._base import ReceiveHttp
from mitmproxy.proxy.layers.http._events import ErrorCode, RequestHeaders, RequestProtocolError

from addons import refusals
from proxy.core.decide import Reason, deny

log = logging.getLogger("surrogate")

MAX_CHUNK_LINE = 4096  # bytes of one chunk-size line with its extensions
MAX_TRAILERS = 64 * 1024  # bytes of a trailer section
MAX_CHUNK_SIZE = 2**63 - 1

_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"  # RFC 9110 §5.6.2
_QUOTED = rb'"(?:[\t \x21\x23-\x5b\x5d-\x7e]|\\[\t \x21-\x7e])*"'  # RFC 9110 §5.6.4, ASCII only
_EXT = rb"[ \t]*;[ \t]*" + _TOKEN + rb"(?:[ \t]*=[ \t]*(?:" + _TOKEN + rb"|" + _QUOTED + rb"))?"
_CHUNK_LINE = re.compile(rb"([0-9A-Fa-f]{1,16})(?:" + _EXT + rb")*\r\n")

_MARK = "_surrogate_malformed"

State = Callable[[Any, Any], Generator[Any, Any, Any]]


class Malformed(Exception):
    """A chunked request body two parsers could read differently. Not an h11 error on purpose:
    mitmproxy would turn that into a bare close, and the sandbox is owed a 400."""


class StrictChunkedReader(ChunkedReader):
    """h11's reader, with each chunk-size line checked before h11 reads it."""

    def __call__(self, buf: ReceiveBuffer) -> Any:
        if self._reading_trailer:
            if len(buf) > MAX_TRAILERS and b"\r\n\r\n" not in bytes(buf)[: MAX_TRAILERS + 4]:
                raise Malformed(f"trailer section larger than {MAX_TRAILERS} bytes")
        elif self._bytes_in_chunk == 0:
            # h11 first drops the CRLF that ends the previous chunk, then reads the next line
            _check_line(buf, len(self._bytes_to_discard))
        return super().__call__(buf)


def _check_line(buf: ReceiveBuffer, start: int) -> None:
    data: bytearray = buf._data  # h11's buffer, read in place: a read may hold many small chunks
    end = data.find(b"\n", start, start + MAX_CHUNK_LINE)
    if end == -1:
        if len(data) - start >= MAX_CHUNK_LINE:
            raise Malformed(f"chunk-size line longer than {MAX_CHUNK_LINE} bytes")
        return  # not complete yet
    m = _CHUNK_LINE.fullmatch(data, start, end + 1)
    if m is None:
        raise Malformed("chunk-size line is not a hex size and extensions (RFC 9112 §7.1)")
    if int(m[1], 16) > MAX_CHUNK_SIZE:
        raise Malformed(f"chunk size larger than {MAX_CHUNK_SIZE}")


def _dry_run(buf: ReceiveBuffer) -> str | None:
    """Why the body bytes already in ``buf`` are refused, reading a copy; None when fine so far."""
    copy = ReceiveBuffer()
    copy += bytes(buf)
    reader = StrictChunkedReader()
    try:
        while (event := reader(copy)) is not None and not isinstance(event, h11.EndOfMessage):
            pass
    except Malformed as e:
        return str(e)
    except h11.ProtocolError:
        return "chunked body is malformed (RFC 9112 §7.1)"
    return None


def _refusal(message: str, reason: Reason) -> http.Response:
    # no flow exists yet, so no request id
    return refusals.answer(deny(reason, message, status=400), None)


def _refuse_h1(self: Any, message: str) -> Generator[Any, Any, None]:
    log.warning("malformed chunked request body refused: %s; connection closed", message)
    if self.response is None:  # nothing of a response was sent on this connection yet
        response = _refusal(f"request body refused: {message}", Reason.BAD_REQUEST_BODY)
        response.headers["Connection"] = "close"
        yield commands.SendData(self.conn, http1.assemble_response(response))
    yield commands.CloseConnection(self.conn)
    self.state = self.done


def _strict_body(original: State) -> State:
    @functools.wraps(original)
    def read_body(self: Any, event: events.Event) -> Generator[Any, Any, None]:
        if type(self.body_reader) is ChunkedReader:  # made by read_headers just now: fresh
            self.body_reader = StrictChunkedReader()
        try:
            yield from original(self, event)
        except Malformed as e:
            yield from _refuse_h1(self, str(e))
            if self.stream_id is not None:  # the upstream is closed: it never gets a whole request
                yield ReceiveHttp(
                    RequestProtocolError(self.stream_id, str(e), ErrorCode.GENERIC_CLIENT_ERROR)
                )

    setattr(read_body, _MARK, True)
    return read_body


def _checked_head(original: State) -> State:
    @functools.wraps(original)
    def read_headers(self: Any, event: events.Event) -> Generator[Any, Any, None]:
        gen = original(self, event)
        for cmd in gen:
            if (
                isinstance(cmd, ReceiveHttp)
                and isinstance(cmd.event, RequestHeaders)
                and not cmd.event.end_stream
                and "chunked" in cmd.event.request.headers.get("transfer-encoding", "").lower()
                and (why := _dry_run(self.buf)) is not None
            ):
                gen.close()
                yield from _refuse_h1(self, why)
                return
            yield cmd

    setattr(read_headers, _MARK, True)
    return read_headers


def _h2_request(original: State) -> State:
    @functools.wraps(original)
    def handle_h2_event(self: Any, event: h2.events.Event) -> Generator[Any, Any, bool]:
        if isinstance(event, h2.events.RequestReceived) and event.stream_id is not None:
            try:
                _http2.parse_h2_request_headers(event.headers or [])
            except ValueError:
                sid = event.stream_id
                why = "HTTP/2 request pseudo-header fields are malformed (RFC 9113 §8.3.1)"
                log.warning("%s; stream refused", why)
                r = _refusal(why, Reason.BAD_REQUEST_HEAD)
                fields = [(b":status", b"400"), *((n.lower(), v) for n, v in r.headers.fields)]
                self.h2_conn.send_headers(sid, fields)
                self.h2_conn.send_data(sid, r.raw_content or b"", end_stream=True)
                if not event.stream_ended:
                    self.h2_conn.reset_stream(sid, h2.errors.ErrorCodes.NO_ERROR)
                yield commands.SendData(self.conn, self.h2_conn.data_to_send())
                return False
        stop: bool = yield from original(self, event)
        return stop

    setattr(handle_h2_event, _MARK, True)
    return handle_h2_event


def install() -> None:
    """Wrap mitmproxy's request readers (once per process; later calls do nothing)."""
    server: Any = _http1.Http1Server
    if not getattr(server.read_body, _MARK, False):
        server.read_body = _strict_body(server.read_body)
    if not getattr(server.read_headers, _MARK, False):
        server.read_headers = _checked_head(server.read_headers)
    h2server: Any = _http2.Http2Server
    if not getattr(h2server.handle_h2_event, _MARK, False):
        h2server.handle_h2_event = _h2_request(h2server.handle_h2_event)
