"""h1read: two gaps in mitmproxy 12.3's HTTP/1 readers, closed where the bytes are read.

- **Trailers** (RFC 9112 §7.1.2): ``Http1Connection.read_body`` raises ``NotImplementedError``
  when a chunked body ends with trailer fields, in either direction; the flow dies inside the
  layer and the client waits for the idle timeout. Trailers on HTTP/1 are dropped here: the body
  ends as if the last chunk had none (mitmproxy's ``Http1Server`` and ``Http1Client`` could not
  send them on anyway). Nothing in them reaches the sandbox or the upstream, so nothing in them
  needs scrubbing or substitution. HTTP/2 trailers are passed (scrubbed: addons/scrub.py).
- **Informational responses** (1xx other than 101, RFC 9110 §15.2): ``Http1Client.read_headers``
  takes a ``103 Early Hints`` (or ``100 Continue``, ``102``) for the final response, sends it to
  the client as such and drops the real response that follows. Such a head is dropped here
  before mitmproxy reads it, as mitmproxy's own HTTP/2 layer does (``Swallowing HTTP/2
  informational response``), so the final response is the one the client gets, and no byte of a
  1xx head reaches the sandbox unscrubbed. (mitmproxy answers ``Expect: 100-continue`` itself.)

:func:`install` wraps the two methods once per process (like addons/headlimit.py); the head is
parsed by mitmproxy's own ``read_response_head``. The dependency is pinned below 12.4; tests in
tests/e2e/test_response_paths.py fail if the wrapping stops working.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import h11
from h11._receivebuffer import ReceiveBuffer
from mitmproxy import http
from mitmproxy.net.http import http1
from mitmproxy.net.http.http1 import read
from mitmproxy.proxy import events
from mitmproxy.proxy.layers.http import _http1

_MARK = "_surrogate_h1read"

StateMethod = Callable[[Any, events.Event], Generator[Any, Any, None]]


class _NoTrailers:
    """An h11 body reader whose end of message never carries trailer fields."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    @staticmethod
    def _strip(event: Any) -> Any:
        if isinstance(event, h11.EndOfMessage) and event.headers:
            return h11.EndOfMessage()
        return event

    def __call__(self, buf: Any) -> Any:
        return self._strip(self.inner(buf))

    def read_eof(self) -> Any:
        return self._strip(self.inner.read_eof())


def _dropping_trailers(original: StateMethod) -> StateMethod:
    def read_body(self: Any, event: events.Event) -> Generator[Any, Any, None]:
        if not isinstance(self.body_reader, _NoTrailers):
            self.body_reader = _NoTrailers(self.body_reader)
        yield from original(self, event)

    setattr(read_body, _MARK, True)
    return read_body


def _is_informational(lines: list[bytearray]) -> bool:
    """Whether a complete response head is a 1xx other than 101 (parsed by mitmproxy).

    The status line is read first with the reader ``read_response_head`` itself starts with: a
    final status (nearly every head) needs no parse of its header fields and no Response object
    (about 1% of a small request's CPU, issue 19). A 1xx head is parsed whole, as before, so a
    malformed one is still left to mitmproxy's reader, which reports it."""
    try:
        status = read._read_response_line(bytes(lines[0]))[1]
        if not (100 <= status < 200 and status != 101):
            return False
        status = http1.read_response_head([bytes(x) for x in lines]).status_code
    except ValueError:
        return False  # mitmproxy's reader reports it
    return 100 <= status < 200 and status != 101


def _skipping_informational(original: StateMethod) -> StateMethod:
    def read_headers(self: Any, event: events.Event) -> Generator[Any, Any, None]:
        if isinstance(event, events.DataReceived) and self.request is not None:
            # every complete 1xx head of the read, however many (each is discarded: memory stays
            # flat, and the read bounds their number): a cap here (64) left the next one to
            # mitmproxy, which took it for the final response (review r4)
            while True:
                # h11's buffer finds the blank line incrementally: an unfinished head is not
                # searched again from its start on every read
                lines = self.buf.maybe_extract_lines()
                if lines is None:
                    break
                if lines and _is_informational(lines):
                    continue  # dropped
                # not one: put the head back as mitmproxy's reader will find it (line ends CRLF)
                rest = bytes(self.buf)
                self.buf = ReceiveBuffer()
                self.buf += b"\r\n".join(bytes(x) for x in lines) + b"\r\n\r\n" if lines else b"\r\n"
                self.buf += rest
                break
        yield from original(self, event)

    setattr(read_headers, _MARK, True)
    return read_headers


def install() -> None:
    """Wrap mitmproxy's HTTP/1 body reader and response head reader (once per process)."""
    pairs: list[tuple[Any, str, Callable[[StateMethod], StateMethod]]] = [
        (_http1.Http1Connection, "read_body", _dropping_trailers),
        (_http1.Http1Client, "read_headers", _skipping_informational),
    ]
    for cls, name, wrap in pairs:
        current = getattr(cls, name)
        if not getattr(current, _MARK, False):
            setattr(cls, name, wrap(current))


class Framing:
    """What mitmproxy's HTTP/1 writers cannot frame, fixed in the hooks before they write it.

    - ``Transfer-Encoding`` on a response that has no body (a 304, or the 1xx/204 mitmproxy
      would have refused), toward an HTTP/1 client: ``Http1Server`` writes a last chunk after
      it, and the client reads those bytes as the next response ("Received HTTP/0.9"). Dropped
      (RFC 9112 §6.1: such a response carries no body). A HEAD response keeps it: mitmproxy
      writes no last chunk there, and it says what the GET would have had.

    Trailers where they cannot be passed on, dropped:

    - Request trailers, always: a placeholder in one would reach the upstream unsubstituted, and
      mitmproxy's ``Http1Client`` cannot send them (an ``AssertionError`` inside the layer).
    - Response trailers toward an HTTP/1 client (from an HTTP/2 upstream): ``Http1Server``
      cannot send them either. Toward an HTTP/2 client they are passed, scrubbed (addons/scrub.py).
    """

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        if (
            response is not None
            and flow.request.http_version.startswith("HTTP/1")
            and flow.request.method.upper() != "HEAD"
            and (100 <= response.status_code < 200 or response.status_code in (204, 304))
            and any(n.lower() == b"transfer-encoding" for n, _ in response.headers.fields)
        ):
            response.headers.fields = tuple(
                (n, v) for n, v in response.headers.fields if n.lower() != b"transfer-encoding"
            )

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.request.trailers:
            flow.request.trailers = None

    def response(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        if response is not None and response.trailers and flow.request.http_version.startswith("HTTP/1"):
            response.trailers = None
