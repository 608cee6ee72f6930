"""layerqueue: a mitmproxy layer's queue of events received while it is paused, made when first
needed (issue 19).

Every ``mitmproxy.proxy.layer.Layer`` makes, in ``__init__``, a ``collections.deque`` for the
events that arrive while it waits for a blocking command's reply (a hook, a connection being
opened). An empty deque costs about 630 bytes (its first block of 64 slots is allocated with it),
and an idle tunnel holds about nine layers (proxy mode, CONNECT, TLS, HTTP, each HTTP connection
and stream): about 5 KiB of Python heap per idle tunnel, measured with bench/idle.py ``--heap``,
for queues that stay empty unless a layer is paused while events arrive.

:func:`lazy_event_queues` has every layer use an :class:`EventQueue` instead: the deque's face for
what mitmproxy does with that attribute (``append``, ``popleft``, truth, ``len``, iteration in
order), that holds no deque while empty. The events, their order and when they are replayed are
unchanged (``mitmproxy/proxy/layer.py`` ``handle_event`` and ``__continue``; the HTTP layer's
``check_killed`` iterates the queue). Idempotent.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

from mitmproxy.proxy import layer


class EventQueue:
    """A FIFO of events that allocates its deque on the first append and drops it once empty."""

    __slots__ = ("_events",)

    def __init__(self) -> None:
        self._events: collections.deque[Any] | None = None

    def append(self, event: Any) -> None:
        if self._events is None:
            self._events = collections.deque()
        self._events.append(event)

    def popleft(self) -> Any:
        """The oldest event; IndexError when empty (as ``deque.popleft``)."""
        if self._events is None:
            raise IndexError("pop from an empty EventQueue")
        event = self._events.popleft()
        if not self._events:
            self._events = None
        return event

    def __bool__(self) -> bool:
        return self._events is not None

    def __len__(self) -> int:
        return 0 if self._events is None else len(self._events)

    def __iter__(self) -> Iterator[Any]:
        return iter(()) if self._events is None else iter(self._events)


_original_init = layer.Layer.__init__


def _init(self: layer.Layer, context: Any) -> None:
    _original_init(self, context)
    self._paused_event_queue = EventQueue()  # type: ignore[assignment]


def lazy_event_queues() -> None:
    """Every mitmproxy layer made from now on queues its paused events in an :class:`EventQueue`."""
    layer.Layer.__init__ = _init  # type: ignore[method-assign]
