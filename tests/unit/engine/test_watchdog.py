"""proxy.engine.watchdog: the class-based disarm does what mitmproxy's generator-based one does."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from mitmproxy.proxy import server

from proxy.engine import watchdog


class _Boom(Exception):
    pass


def _trace(dog: server.TimeoutWatchdog) -> list[Any]:
    """One sequence of nested disarms, a raising body among them; the watchdog's state after each
    step (activity stamps replaced by whether they moved)."""
    seen: list[Any] = []
    stamp = [dog.last_activity]

    def look(step: str) -> None:
        moved = dog.last_activity != stamp[0]
        stamp[0] = dog.last_activity
        seen.append((step, dog.blocker, dog.can_timeout.is_set(), moved))

    dog.last_activity = -1.0
    stamp[0] = -1.0
    with dog.disarm() as got:
        seen.append(("value", got))
        look("outer in")
        with dog.disarm():
            look("inner in")
        look("inner out")
        with pytest.raises(_Boom), dog.disarm():
            look("raising in")
            raise _Boom
        look("raising out")
    look("outer out")
    try:
        with dog.disarm():
            raise _Boom
    except _Boom as e:
        seen.append(("propagated", type(e)))
    look("after raise")
    return seen


def test_disarm_does_what_mitmproxys_does(monkeypatch: pytest.MonkeyPatch) -> None:
    async def both() -> tuple[list[Any], list[Any]]:
        async def never() -> None:
            return None

        monkeypatch.setattr(server.TimeoutWatchdog, "disarm", watchdog.STOCK_DISARM)  # restored after
        monkeypatch.delattr(server.TimeoutWatchdog, watchdog._MARK, raising=False)
        before = _trace(server.TimeoutWatchdog(60, never))
        watchdog.install()
        watchdog.install()  # idempotent
        assert server.TimeoutWatchdog.disarm is not watchdog.STOCK_DISARM
        return before, _trace(server.TimeoutWatchdog(60, never))

    before, after = asyncio.run(both())
    assert after == before
    assert ("outer out", 0, True, True) in after and ("inner out", 1, False, False) in after
