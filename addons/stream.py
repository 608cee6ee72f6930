"""stream: never buffer a body.

mitmproxy buffers request and response bodies (headers of a response included) unless told
otherwise, so an SSE stream would deliver nothing until it ends. This addon sets a pass-through
stream callable on both directions of every allowed flow: each read is forwarded as it arrives
(an SSE event included) and memory stays flat however large the body. The callable also counts
the bytes for the audit event; WebSocket messages are counted and not kept.
"""

from __future__ import annotations

from collections.abc import Callable

from mitmproxy import http

from addons import facts


def _counter(counts: list[int], index: int) -> Callable[[bytes], bytes]:
    def count(chunk: bytes) -> bytes:
        counts[index] += len(chunk)
        return chunk

    return count


class Stream:
    @facts.fail_closed
    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error or facts.HOOK in flow.metadata:  # a hook reads its body whole
            return
        counts = flow.metadata.setdefault(facts.BYTES, [0, 0])
        flow.request.stream = _counter(counts, 0)

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
