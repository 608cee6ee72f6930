"""The cached addon dispatch (proxy/engine/dispatch.py) calls exactly what mitmproxy's own manager calls,
in the same order, with the same error handling, and sees chain changes."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from mitmproxy import exceptions, hooks, http, options
from mitmproxy.master import Master
from mitmproxy.proxy import server_hooks
from mitmproxy.proxy.layers.http import _hooks as http_hooks
from mitmproxy.test import tflow

from proxy.engine.dispatch import CachedAddonManager, LeanMaster, cache_hook_args, drop_debug_typechecks


class Rec:
    """Records every call of the hooks it was given (name → behaviour)."""

    def __init__(self, name: str, log: list[str], **hooks_: str) -> None:
        self.name = name
        for hook, how in hooks_.items():
            setattr(self, hook, self._hook(hook, how, log))

    def _hook(self, hook: str, how: str, log: list[str]) -> Any:
        if how == "async":

            async def ahook(*args: Any) -> None:
                await asyncio.sleep(0)
                log.append(f"{self.name}.{hook}")

            return ahook

        def hook_(*args: Any) -> None:
            log.append(f"{self.name}.{hook}")
            if how == "raise":
                raise RuntimeError("boom")
            if how == "halt":
                raise exceptions.AddonHalt

        return hook_


class Parent:
    """A top-level addon with sub-addons (like mitmproxy's script loader)."""

    def __init__(self, name: str, log: list[str], children: list[Any], **hooks_: str) -> None:
        self.name = name
        self.addons = children
        self._own = Rec(name + "-self", log, **hooks_)
        for hook in hooks_:
            setattr(self, hook, getattr(self._own, hook))


def _chain(log: list[str]) -> list[Any]:
    return [
        Rec("a", log, request="sync", response="sync"),
        Rec("b", log, request="raise", response="sync"),
        Rec("c", log, request="async", error="sync"),
        Parent("p", log, [Rec("p1", log, request="sync"), Rec("p2", log, request="raise")], request="sync"),
        Rec("d", log, request="sync", response="halt"),
        Rec("e", log, request="sync", response="sync", update="sync"),
    ]


async def _run(master_cls: Any, events: list[hooks.Hook]) -> list[str]:
    log: list[str] = []
    opts = options.Options()
    master = master_cls(opts) if master_cls is LeanMaster else master_cls(opts, with_termlog=False)
    master.addons.add(*_chain(log))
    for event in events:
        await master.addons.handle_lifecycle(event)
    return log


def _events() -> list[hooks.Hook]:
    from mitmproxy.addons.proxyserver import Proxyserver  # noqa: F401  # registers hook classes
    from mitmproxy.proxy.layers import http

    f = tflow.tflow(resp=True)
    return [
        http.HttpRequestHook(f),
        http.HttpResponseHook(f),
        http.HttpErrorHook(f),
        server_hooks.ClientConnectedHook(f.client_conn),
    ]


async def test_same_calls_in_the_same_order_as_mitmproxy(caplog: pytest.LogCaptureFixture) -> None:
    events = _events()
    with caplog.at_level(logging.ERROR):
        stock = await _run(Master, events)
        stock_errors = [r.getMessage() for r in caplog.records]
        caplog.clear()
        lean = await _run(LeanMaster, events)
        lean_errors = [r.getMessage() for r in caplog.records]
    assert lean == stock
    assert lean_errors == stock_errors
    # What that order is: b's and p2's exceptions skip only their own tree; d's AddonHalt stops
    # the response event before e; update follows each flow event (e implements it).
    assert lean == [
        "a.request", "b.request", "c.request", "p-self.request", "p1.request", "p2.request",
        "d.request", "e.request", "e.update",
        "a.response", "b.response", "d.response", "e.update",
        "c.error", "e.update",
    ]  # fmt: skip
    assert lean_errors == ["Addon error: boom", "Addon error: boom"]


async def test_an_event_reaches_exactly_its_implementers_in_order() -> None:
    log: list[str] = []
    master = LeanMaster(options.Options())
    master.addons.add(Rec("x", log, request="sync"), Rec("y", log), Rec("z", log, request="async"))
    assert isinstance(master.addons, CachedAddonManager)
    assert len(master.addons.implementers("request")) == 2  # y has no request hook
    await master.addons.trigger_event(_events()[0])
    assert log == ["x.request", "z.request"]
    assert master.addons.implementers("update") == ()


@pytest.mark.parametrize("change", ["add", "remove", "clear", "register"])
async def test_a_chain_change_is_seen_by_the_next_event(change: str) -> None:
    log: list[str] = []
    master = LeanMaster(options.Options())
    first = Rec("first", log, request="sync")
    master.addons.add(first)
    event = _events()[0]
    await master.addons.trigger_event(event)  # builds the cache
    if change == "add":
        master.addons.add(Rec("late", log, request="sync"))
        expected = ["first.request", "late.request"]
    elif change == "register":  # what an addon that manages sub-addons calls
        master.addons.register(Rec("reg", log, request="sync"))
        master.addons.chain.append(master.addons.get("reg"))
        master.addons.invalidate()  # registered but added to the chain by hand: say so
        expected = ["first.request", "reg.request"]
    elif change == "remove":
        master.addons.remove(first)
        expected = []
    else:
        master.addons.clear()
        expected = []
    log.clear()
    await master.addons.trigger_event(event)
    assert log == expected


async def test_sub_addons_changed_behind_the_managers_back_are_seen() -> None:
    log: list[str] = []
    master = LeanMaster(options.Options())
    parent = Parent("p", log, [])
    master.addons.add(parent)
    event = _events()[0]
    await master.addons.trigger_event(event)
    parent.addons.append(Rec("child", log, request="sync"))
    await master.addons.trigger_event(event)
    assert log == ["child.request"]


async def test_options_reach_configure_once() -> None:
    seen: list[set[str]] = []

    class Conf:
        def configure(self, updated: set[str]) -> None:
            seen.append(set(updated))

    master = LeanMaster(options.Options())
    master.addons.add(Conf())
    seen.clear()
    master.options.update(http3=False)
    assert seen == [{"http3"}]


def _badly_typed_response() -> http.Response:
    return http.Response(
        http_version=b"HTTP/1.1",
        status_code=200,
        reason=b"OK",
        headers=http.Headers(),
        content=b"",
        trailers=None,
        timestamp_start="not a number",  # type: ignore[arg-type]
        timestamp_end=None,
    )


def test_the_debug_typecheck_of_messages_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    # restored after the test: other tests in this process get mitmproxy as shipped
    monkeypatch.setattr(http.MessageData, "__post_init__", http.MessageData.__post_init__)
    with pytest.raises(TypeError):
        _badly_typed_response()  # mitmproxy as shipped checks every field (it costs ~5% CPU)
    drop_debug_typechecks()
    drop_debug_typechecks()  # idempotent
    assert _badly_typed_response().timestamp_start == "not a number"
    assert http.Request.make("GET", "https://example.test/").host == "example.test"


_ORIGINAL_ARGS = hooks.Hook.args
_HTTP_HOOKS = [http_hooks.HttpRequestHeadersHook, http_hooks.HttpRequestHook, http_hooks.HttpResponseHook]


def test_hook_args_are_the_same_with_cached_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hooks.Hook, "args", hooks.Hook.args)  # restored after the test
    f = tflow.tflow(resp=True)
    data = server_hooks.ServerConnectionHookData(f.server_conn, f.client_conn)
    events = [hooks.UpdateHook([f]), server_hooks.ServerConnectHook(data), *(h(f) for h in _HTTP_HOOKS)]
    before = [e.args() for e in events]
    cache_hook_args()
    cache_hook_args()  # idempotent
    assert hooks.Hook.args is not _ORIGINAL_ARGS
    assert [e.args() for e in events] == before == [e.args() for e in events]
