"""stream: never buffer a body.

mitmproxy buffers request and response bodies (headers of a response included) unless told
otherwise, so an SSE stream would deliver nothing until it ends. This addon sets a pass-through
stream callable on both directions of every allowed flow: each read is forwarded as it arrives
(an SSE event included) and memory stays flat however large the body. The callable also counts
the bytes for the audit event; WebSocket messages are counted and not kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from mitmproxy import http

from addons import facts


def _counter(counts: list[int], index: int) -> Callable[[bytes], bytes]:
    def count(chunk: bytes) -> bytes:
        counts[index] += len(chunk)
        return chunk

    return count


Chunks = Callable[[bytes], bytes | Iterable[bytes]]


def _counting(counts: list[int], inner: Chunks) -> Callable[[bytes], list[bytes]]:
    """Count what ``inner`` (substitute's body swap) returns: the bytes that go upstream."""

    def count(chunk: bytes) -> list[bytes]:
        got = inner(chunk)
        pieces = [got] if isinstance(got, bytes) else list(got)
        counts[0] += sum(len(p) for p in pieces)
        return [p for p in pieces if p]

    return count


class Stream:
    @facts.fail_closed
    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error or facts.HOOK in flow.metadata:  # a hook reads its body whole
            return
        if flow.metadata.get(facts.WHOLE_BODY) or "surrogate.sigv4_hold" in flow.metadata:
            # a signed body is read whole, bounded (addons/sign.py, addons/sigv4.py)
            flow.metadata.setdefault(facts.BYTES, [0, 0])
            return
        counts = flow.metadata.setdefault(facts.BYTES, [0, 0])
        inner = flow.request.stream
        flow.request.stream = _counting(counts, inner) if callable(inner) else _counter(counts, 0)

    @facts.fail_closed
    def websocket_message(self, flow: http.HTTPFlow) -> None:
        # mitmproxy keeps every message of a WebSocket flow in flow.websocket.messages, so a long
        # session grows without bound. Count it and let it go: the layer forwards the message
        # object it already holds.
        assert flow.websocket is not None
        counts = flow.metadata.setdefault(facts.BYTES, [0, 0])
        for message in flow.websocket.messages:
            counts[0 if message.from_client else 1] += len(message.content)
        flow.websocket.messages.clear()

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        assert flow.response is not None
        counts = flow.metadata.setdefault(facts.BYTES, [0, 0])
        flow.response.stream = _counter(counts, 1)
