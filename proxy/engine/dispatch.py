"""A mitmproxy Master whose addon manager remembers, per event, which addons implement it.

mitmproxy 12.3's ``AddonManager.trigger_event`` walks the whole addon tree for every event and
calls ``getattr(addon, event.name)`` on each addon, inside a ``safecall`` context manager, and
``handle_lifecycle`` then sends an ``update`` event for every flow event. With ~290 hook calls per
request most of those lookups find nothing. Measured in issue 7: caching the implementers took a
lean Master from 1.56× to 1.81× bare mitmdump's requests/s.

:class:`CachedAddonManager` keeps mitmproxy's semantics, which ``tests/unit/engine/test_dispatch.py``
checks against the stock manager:

- addons are called in chain order, each top-level addon's sub-addons (``addon.addons``) right
  after it, depth first;
- an exception in a hook is logged as mitmproxy logs it ("Addon error: ...") and skips the rest
  of that top-level addon's tree for this event, never the following addons; ``AddonHalt`` stops
  the event; ``OptionsError`` propagates;
- a hook that returns an awaitable is awaited before the next one runs;
- ``update`` is sent after a flow event only when some addon implements it.

The cache is emptied whenever the chain changes through the manager (``add``, ``register``,
``remove``, ``clear``). A top-level addon that has sub-addons (an ``addons`` attribute, e.g.
mitmproxy's script loader, which edits that list without telling the manager) is never cached:
its tree is walked on every event as mitmproxy does. A hook method assigned to an instance after
its first event is not seen; call :meth:`CachedAddonManager.invalidate` after such a change.
Configure events and other synchronous ``trigger`` calls (rare) use mitmproxy's own path.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import sys
import types
from collections.abc import Callable
from typing import Any

from mitmproxy import exceptions, flow, hooks, http, options
from mitmproxy.addonmanager import AddonManager, cut_traceback, traverse
from mitmproxy.master import Master

logger = logging.getLogger("mitmproxy.addonmanager")  # where mitmproxy logs addon errors

# One entry per top-level addon that takes part in an event: a tuple of the hooks of its (static)
# tree, or the addon itself when its tree may change under us and must be walked live.
_Group = Any


class CachedAddonManager(AddonManager):
    def __init__(self, master: Master) -> None:
        super().__init__(master)
        self._groups: dict[str, tuple[_Group, ...]] = {}

    def invalidate(self) -> None:
        """Forget every cached implementer list (the next event of each kind rebuilds its own)."""
        self._groups.clear()

    def register(self, addon: Any) -> Any:
        self.invalidate()
        try:
            return super().register(addon)
        finally:
            self.invalidate()

    def add(self, *addons: Any) -> None:
        try:
            super().add(*addons)
        finally:
            self.invalidate()

    def remove(self, addon: Any) -> None:
        try:
            super().remove(addon)
        finally:
            self.invalidate()

    def clear(self) -> None:
        try:
            super().clear()
        finally:
            self.invalidate()

    def implementers(self, name: str) -> tuple[_Group, ...]:
        """The groups of hooks called for event ``name``, in order (built on first use)."""
        groups = self._groups.get(name)
        if groups is None:
            groups = self._groups[name] = tuple(self._build(name))
        return groups

    def _build(self, name: str) -> list[_Group]:
        groups: list[_Group] = []
        for top in self.chain:
            if hasattr(top, "addons"):
                groups.append(top)  # a tree that may change: walked live, as mitmproxy does
                continue
            funcs: list[Callable[..., Any]] = []
            for a in traverse([top]):
                func = getattr(a, name, None)
                if not func or isinstance(func, types.ModuleType):
                    continue  # mitmproxy skips a module imported under a hook's name, too
                funcs.append(func if callable(func) else _not_callable(name, a))
            if funcs:
                groups.append(tuple(funcs))
        return groups

    async def trigger_event(self, event: hooks.Hook) -> None:
        """Call ``event`` on every addon implementing it (mitmproxy's semantics, see module doc)."""
        args = _cached_args(event)
        for group in self.implementers(event.name):
            try:
                if type(group) is tuple:
                    for func in group:
                        res = func(*args)
                        if res is not None and inspect.isawaitable(res):
                            await res
                else:
                    await self.invoke_addon(group, event)
            except exceptions.AddonHalt:
                return
            except exceptions.OptionsError:
                raise
            except Exception:
                _log_addon_error()

    async def handle_lifecycle(self, event: hooks.Hook) -> None:
        await self.trigger_event(event)
        if self.implementers("update"):
            message = _cached_args(event)[0]
            if isinstance(message, flow.Flow):
                await self.trigger_event(hooks.UpdateHook([message]))


def _not_callable(name: str, addon: Any) -> Callable[..., Any]:
    def fail(*_: Any) -> None:
        raise exceptions.AddonManagerError(f"Addon handler {name} ({addon}) not callable")

    return fail


def _log_addon_error() -> None:
    # mitmproxy's safecall(), without a context manager per addon per event.
    etype, value, tb = sys.exc_info()
    tb = cut_traceback(tb, "trigger_event")
    tb = cut_traceback(tb, "invoke_addon")
    assert etype is not None and value is not None
    logger.error(f"Addon error: {value}", exc_info=(etype, value, tb))


def drop_debug_typechecks() -> None:
    """Skip the type check mitmproxy runs on every request and response it builds.

    ``mitmproxy.http.MessageData.__post_init__`` checks each field's type against its annotation
    (``typecheck.check_option_type``), under ``if __debug__:``, so it is gone when Python runs
    with ``-O``. surrogate runs without ``-O`` (its own ``assert`` statements stay) and turns
    only this check off: measured on the bench, it was 5.6% of the proxy's CPU (issue 7). The
    messages are built by mitmproxy's parsers and by ``Response.make``, whose types are fixed.
    Idempotent.
    """
    http.MessageData.__post_init__ = _no_check  # type: ignore[method-assign]


def _no_check(self: Any) -> None:
    return None


_HOOK_FIELDS: dict[type, tuple[str, ...]] = {}


def cache_hook_args() -> None:
    """Have ``mitmproxy.hooks.Hook.args`` (called for every hook of every request by the
    connection handler, ``mode_servers.ProxyConnectionHandler.handle_hook``) look up each hook
    class's dataclass fields once instead of on every call, as this module's manager does.
    Same result; idempotent."""
    hooks.Hook.args = _cached_args  # type: ignore[method-assign]


def _cached_args(self: hooks.Hook) -> list[Any]:
    names = _HOOK_FIELDS.get(type(self))
    if names is None:
        names = _HOOK_FIELDS[type(self)] = tuple(f.name for f in dataclasses.fields(self))  # type: ignore[arg-type]
    return [getattr(self, n) for n in names]


class LeanMaster(Master):
    """mitmproxy's Master with :class:`CachedAddonManager` and no terminal log."""

    def __init__(self, opts: options.Options, event_loop: Any = None) -> None:
        super().__init__(opts, event_loop, with_termlog=False)
        # The stock manager subscribed to option changes in its constructor; only ours may.
        opts.changed.disconnect(self.addons._configure_all)
        self.addons = CachedAddonManager(self)
