"""proxy.engine.watchdog: the one-timer watchdog keeps mitmproxy's idle rule, side by side with it."""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from mitmproxy.proxy import server

from proxy.engine import watchdog

TIMEOUT = 0.3  # seconds of idleness before a watchdog fires
LATE = 1.0  # how late after its rule's time a firing may come on a loaded machine


class _Boom(Exception):
    pass


Schedule = Callable[[Any], Awaitable[float]]  # drives one watchdog; returns when the rule allows firing


async def _hold(dog: Any, seconds: float) -> float:
    """A hook that runs ``seconds``: as in ``server_event``, the event that starts it stamps activity."""
    dog.register_activity()
    with dog.disarm():
        await asyncio.sleep(seconds)
    return time.time()


async def _idle(dog: Any) -> float:
    return dog.last_activity + TIMEOUT


async def _busy(dog: Any) -> float:
    for _ in range(10):  # 0.5 s of activity, every gap shorter than the timeout
        dog.register_activity()
        await asyncio.sleep(0.05)
    dog.register_activity()
    return time.time() + TIMEOUT


async def _held_past_timeout(dog: Any) -> float:
    return await _hold(dog, 0.7) + TIMEOUT


async def _held_after_start(dog: Any) -> float:
    await asyncio.sleep(0.1)  # the clock runs, then a hook holds it longer than the timeout
    return await _hold(dog, 0.7) + TIMEOUT


async def _nested_one_raising(dog: Any) -> float:
    dog.register_activity()
    with dog.disarm():
        with pytest.raises(_Boom), dog.disarm():
            await asyncio.sleep(0.2)
            raise _Boom
        await asyncio.sleep(0.3)  # still held by the outer disarm: 0.5 s in all
    return time.time() + TIMEOUT


async def _hook_then_activity(dog: Any) -> float:
    await _hold(dog, 0.2)
    await asyncio.sleep(0.2)
    dog.register_activity()
    return time.time() + TIMEOUT


SCHEDULES = [_idle, _busy, _held_past_timeout, _held_after_start, _nested_one_raising, _hook_then_activity]


async def _run(make: Callable[..., Any], schedule: Schedule) -> tuple[list[float], float]:
    fired: list[float] = []

    async def callback() -> None:
        fired.append(time.time())

    dog = make(TIMEOUT, callback)
    task = asyncio.create_task(dog.watch())
    rule = await schedule(dog)
    deadline = rule + LATE
    while not fired and time.time() < deadline:
        await asyncio.sleep(0.02)
    with dog.disarm():  # a hook after the firing (the connection is being closed) ...
        pass
    await asyncio.sleep(TIMEOUT + 0.1)  # ... and a second firing would show here
    task.cancel()
    if isinstance(dog, watchdog.Watchdog):
        dog.stop()
    return fired, rule


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: s.__name__.strip("_"))
def test_fires_once_no_earlier_than_mitmproxys_rule_side_by_side(schedule: Schedule) -> None:
    async def both() -> list[tuple[list[float], float]]:
        return list(await asyncio.gather(_run(watchdog.STOCK, schedule), _run(watchdog.Watchdog, schedule)))

    for name, (fired, rule) in zip(("mitmproxy's", "ours"), asyncio.run(both()), strict=True):
        assert len(fired) == 1, (name, fired)
        assert rule - 0.02 <= fired[0] <= rule + LATE, (name, fired[0] - rule)


def test_a_stopped_watchdog_never_fires_and_holds_no_timer() -> None:
    async def go() -> tuple[list[str], tuple[bool, ...]]:
        fired: list[str] = []

        async def callback() -> None:
            fired.append("fired")

        running = watchdog.Watchdog(TIMEOUT, callback)
        await running.watch()
        armed = running.armed
        running.stop()
        held = watchdog.Watchdog(TIMEOUT, callback)
        await held.watch()
        with held.disarm():
            held.stop()  # stopped while a hook runs: the hook's end must not set a timer again
        await asyncio.sleep(TIMEOUT + 0.3)
        return fired, (armed, running.armed, held.armed)

    fired, armed = asyncio.run(go())
    assert fired == []
    assert armed == (True, False, False)


class _Owner:
    """Stands for the connection handler a watchdog's callback belongs to."""

    async def on_timeout(self) -> None:
        return None


def test_a_stopped_watchdog_is_not_kept_alive_by_the_loop() -> None:
    async def go() -> tuple[bool, bool]:
        pending_owner, stopped_owner = _Owner(), _Owner()
        pending = watchdog.Watchdog(60, pending_owner.on_timeout)
        await pending.watch()
        kept = weakref.ref(pending_owner)
        del pending, pending_owner  # its timer is still set: the loop holds it and its owner
        stopped = watchdog.Watchdog(60, stopped_owner.on_timeout)
        await stopped.watch()
        stopped.stop()
        gone = weakref.ref(stopped_owner)
        del stopped, stopped_owner
        return kept() is not None, gone() is None

    assert asyncio.run(go()) == (True, True)


def test_disarm_propagates_the_body_exception_and_counts_nesting() -> None:
    async def go() -> list[Any]:
        async def callback() -> None:
            return None

        dog = watchdog.Watchdog(60, callback)
        await dog.watch()
        seen: list[Any] = []
        with dog.disarm() as got:
            seen.append((got, dog.blocker, dog.armed))
            with pytest.raises(_Boom), dog.disarm():
                seen.append(dog.blocker)
                raise _Boom
            seen.append(dog.blocker)
        seen.append((dog.blocker, dog.armed))
        dog.stop()
        return seen

    assert asyncio.run(go()) == [(None, 1, True), 2, 1, (0, True)]


class _Handler:
    """What the ``handle_client`` wrapper touches of a ``ConnectionHandler``."""

    def __init__(self, dog: watchdog.Watchdog) -> None:
        self.timeout_watchdog = dog


@pytest.mark.parametrize("ending", ["return", "raise", "cancel"])
def test_the_handle_client_wrapper_stops_the_timer_however_it_ends(ending: str) -> None:
    gate = asyncio.Event()

    async def original(self: _Handler) -> None:
        await self.timeout_watchdog.watch()
        if ending == "cancel":
            await asyncio.sleep(60)
        await gate.wait()
        if ending == "raise":
            raise _Boom

    async def go() -> tuple[bool, bool]:
        async def callback() -> None:
            return None

        handler = _Handler(watchdog.Watchdog(60, callback))
        task = asyncio.create_task(watchdog._stop_on_return(original)(handler))
        await asyncio.sleep(0.05)
        armed = handler.timeout_watchdog.armed
        if ending == "cancel":
            task.cancel()
        gate.set()
        raised = pytest.raises((_Boom, asyncio.CancelledError))
        with raised if ending != "return" else contextlib.nullcontext():
            await task
        return armed, handler.timeout_watchdog.armed

    assert asyncio.run(go()) == (True, False)


def test_install_is_idempotent_and_puts_the_timer_watchdog_in_place() -> None:
    watchdog.install()
    wrapped = server.ConnectionHandler.handle_client
    watchdog.install()
    assert server.TimeoutWatchdog is watchdog.Watchdog
    assert server.ConnectionHandler.handle_client is wrapped
    inner = getattr(wrapped, "__wrapped__", None)
    assert inner is not None and not hasattr(inner, "__wrapped__")
