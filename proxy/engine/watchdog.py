"""mitmproxy's connection watchdog disarmed without a generator per hook (issue 19).

``ConnectionHandler.handle_hook`` (mitmproxy 12.3 ``proxy/mode_servers.py``) runs every hook of
every request inside ``with self.timeout_watchdog.disarm():``, a ``contextlib.contextmanager``:
a generator and a ``_GeneratorContextManager`` per hook, about 6.6 per request. Measured with
bench/cprof.py at c=16: 1.4% of the proxy's CPU in contextlib.

:func:`install` makes ``TimeoutWatchdog.disarm`` return a small class-based context manager
doing the same: on enter, ``can_timeout`` cleared and ``blocker`` incremented; on exit (also
when the body raises, which then propagates: nothing is suppressed), ``blocker`` decremented
and, at zero, ``register_activity()`` and ``can_timeout`` set. Nested disarms count as before.
``tests/unit/engine/test_watchdog.py`` runs the same sequences through mitmproxy's and this one.
Idempotent.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from mitmproxy.proxy import server

_MARK = "_surrogate_disarm"
STOCK_DISARM = server.TimeoutWatchdog.disarm  # mitmproxy's, for the equivalence tests


class _Disarmed:
    __slots__ = ("_dog",)

    def __init__(self, dog: server.TimeoutWatchdog) -> None:
        self._dog = dog

    def __enter__(self) -> None:
        dog = self._dog
        dog.can_timeout.clear()
        dog.blocker += 1

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        dog = self._dog
        dog.blocker -= 1
        if dog.blocker == 0:
            dog.register_activity()
            dog.can_timeout.set()


def _disarm(self: server.TimeoutWatchdog) -> Any:
    return _Disarmed(self)


def install() -> None:
    """Put the class-based ``disarm`` on mitmproxy's ``TimeoutWatchdog``. Idempotent."""
    if getattr(server.TimeoutWatchdog, _MARK, False):
        return
    server.TimeoutWatchdog.disarm = _disarm  # type: ignore[method-assign]
    setattr(server.TimeoutWatchdog, _MARK, True)
