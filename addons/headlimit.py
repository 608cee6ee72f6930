"""headlimit: a bound on an HTTP/1 head that has not ended yet, in both directions.

mitmproxy 12.3 collects an HTTP/1 head until its blank line with no size limit (``Http1Server``
and ``Http1Client.read_headers`` in ``mitmproxy/proxy/layers/http/_http1.py`` say "FIXME:
protect against header size DoS"), so a sandbox that never ends its request head, or an upstream
that never ends its response head, grows the proxy's memory without bound: 100 MiB of one
unterminated header grew it by 103 MiB, which was not returned after the close. No hook sees
those bytes (``requestheaders`` runs once the head is complete), so :func:`install` wraps the two
``read_headers`` state methods once per process: after each read that leaves the head
unfinished, a buffer past the limit ends the connection: the sandbox gets ``431 Request Header
Fields Too Large`` (RFC 6585 §5; surrogate's JSON refusal, ``bad_request_head``) and the
connection is closed; an upstream's connection is closed
and the flow fails with a protocol error (the sandbox gets a 502).

The limits sit above :data:`proxy.core.hygiene.MAX_HEAD_BYTES` (64 KiB of header fields, checked on
the complete head by the hygiene addon with a specific message), leaving room for the request
line. HTTP/2 heads are bounded by the h2 library (header list size, CONTINUATION frames).

This reaches into mitmproxy's protocol layer (the dependency is pinned below 12.4); a test in
tests/adversarial/test_header_hygiene.py fails if the wrapped methods stop bounding memory.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

from mitmproxy.net.http import http1
from mitmproxy.proxy import commands, events
from mitmproxy.proxy.layers.http import _http1
from mitmproxy.proxy.layers.http._base import ReceiveHttp
from mitmproxy.proxy.layers.http._events import ErrorCode, ResponseProtocolError

from addons import refusals
from proxy.core.decide import Reason, deny

REQUEST_HEAD_LIMIT = 128 * 1024  # bytes of an unfinished request head held per connection
RESPONSE_HEAD_LIMIT = 256 * 1024  # bytes of an unfinished response head held per connection

_MARK = "_surrogate_head_limit"

StateMethod = Callable[[Any, events.Event], Generator[Any, Any, None]]


def _still_reading(layer: Any, original: StateMethod) -> bool:
    return getattr(layer.state, "__func__", None) in (original, getattr(type(layer), "read_headers", None))


def _bounded_request(original: StateMethod) -> StateMethod:
    def read_headers(self: Any, event: events.Event) -> Generator[Any, Any, None]:
        yield from original(self, event)
        if (
            isinstance(event, events.DataReceived)
            and len(self.buf) > REQUEST_HEAD_LIMIT
            and _still_reading(self, original)
        ):
            self.buf.maybe_extract_at_most(len(self.buf))  # drop what was held
            why = f"request head larger than {REQUEST_HEAD_LIMIT} bytes without its end"
            closing = {"Connection": "close"}
            refusal = refusals.answer(deny(Reason.BAD_REQUEST_HEAD, why, 431), None, headers=closing)
            yield commands.SendData(self.conn, http1.assemble_response(refusal))
            yield commands.CloseConnection(self.conn)
            self.state = self.done

    setattr(read_headers, _MARK, True)
    return read_headers


def _bounded_response(original: StateMethod) -> StateMethod:
    def read_headers(self: Any, event: events.Event) -> Generator[Any, Any, None]:
        yield from original(self, event)
        if (
            isinstance(event, events.DataReceived)
            and self.stream_id is not None
            and len(self.buf) > RESPONSE_HEAD_LIMIT
            and _still_reading(self, original)
        ):
            self.buf.maybe_extract_at_most(len(self.buf))
            yield commands.CloseConnection(self.conn)
            why = f"upstream response head larger than {RESPONSE_HEAD_LIMIT} bytes without its end"
            yield ReceiveHttp(ResponseProtocolError(self.stream_id, why, ErrorCode.GENERIC_SERVER_ERROR))
            self.state = self.done

    setattr(read_headers, _MARK, True)
    return read_headers


def install() -> None:
    """Wrap mitmproxy's HTTP/1 head readers (once per process; later calls do nothing)."""
    pairs: list[tuple[Any, Callable[[StateMethod], StateMethod]]] = [
        (_http1.Http1Server, _bounded_request),
        (_http1.Http1Client, _bounded_response),
    ]
    for cls, wrap in pairs:
        current = cls.read_headers
        if not getattr(current, _MARK, False):
            cls.read_headers = wrap(current)
