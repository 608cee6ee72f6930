"""proxy/engine/layerqueue.py: a layer's paused-event queue behaves as the deque it replaces (every
operation mitmproxy uses, against a deque), and a paused layer still replays, in order, what came
while it waited (issue 19)."""

from __future__ import annotations

import collections
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from mitmproxy import connection
from mitmproxy.proxy import commands, context, events, layer
from mitmproxy.test import taddons

from proxy.engine.layerqueue import EventQueue, lazy_event_queues


@given(st.lists(st.one_of(st.integers(), st.none())))
def test_every_operation_answers_as_a_deque(ops: list[int | None]) -> None:
    """Each int appends itself, each None pops the oldest; after each step the two agree."""
    ours, theirs = EventQueue(), collections.deque[int]()
    for op in ops:
        if op is None:
            try:
                want: Any = theirs.popleft()
            except IndexError:
                want = IndexError
            try:
                got: Any = ours.popleft()
            except IndexError:
                got = IndexError
            assert got == want
        else:
            ours.append(op)
            theirs.append(op)
        assert bool(ours) == bool(theirs) and len(ours) == len(theirs) and list(ours) == list(theirs)


def test_an_empty_queue_holds_no_deque() -> None:
    q = EventQueue()
    assert q._events is None
    q.append(1)
    q.popleft()
    assert q._events is None


class _Waits(layer.Layer):
    """Opens a connection (a blocking command) on its first data, then records each event."""

    def __init__(self, ctx: context.Context) -> None:
        super().__init__(ctx)
        self.seen: list[bytes] = []

    def _handle_event(self, event: events.Event) -> layer.CommandGenerator[None]:
        if isinstance(event, events.DataReceived):
            if not self.seen:
                self.seen.append(b"open:" + event.data)
                yield commands.OpenConnection(self.context.server)
            else:
                self.seen.append(event.data)


def test_a_paused_layer_replays_what_came_while_it_waited_in_order() -> None:
    lazy_event_queues()
    with taddons.context() as tctx:
        client = connection.Client(peername=("127.0.0.1", 1), sockname=("127.0.0.1", 8080), timestamp_start=0)
        lay = _Waits(context.Context(client, tctx.options))
    assert isinstance(lay._paused_event_queue, EventQueue)
    (open_cmd,) = list(lay.handle_event(events.DataReceived(client, b"a")))
    assert isinstance(open_cmd, commands.OpenConnection) and lay._paused is not None
    for chunk in (b"b", b"c", b"d"):
        assert list(lay.handle_event(events.DataReceived(client, chunk))) == []
    assert len(lay._paused_event_queue) == 3 and lay.seen == [b"open:a"]
    list(lay.handle_event(events.OpenConnectionCompleted(open_cmd, None)))
    assert lay.seen == [b"open:a", b"b", b"c", b"d"]
    assert not lay._paused_event_queue and lay._paused_event_queue._events is None  # type: ignore[attr-defined]
