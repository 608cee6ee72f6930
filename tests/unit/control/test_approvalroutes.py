"""The approval routes (proxy.control.approvalroutes) over a real store: list, approve with a
scope, deny, a second decision 409, grants and revoke, the SSE stream, bad input."""

from __future__ import annotations

import asyncio
import json
import secrets
import time

import httpx

from proxy.control import approvals as service
from proxy.control.approvalroutes import _events
from proxy.control.service import Control
from proxy.store.base import ApprovalRecord
from proxy.store.sqlite import Store
from unit.control.world import problem


def _ask(store: Store, offset: float = 0.0) -> ApprovalRecord:
    now = time.time() + offset
    a = ApprovalRecord(
        id=secrets.token_urlsafe(16), claim_id="c1", pool="p", method="POST", host="api.test", port=443,
        path="/v1/x", credentials=("k",), preview="{}", rule="r", scopes=("once", "for", "always"),
        created_at=now, expires_at=now + 60,
    )  # fmt: skip
    store.add_approval(a)
    return a


async def test_approve_deny_and_grants(api: httpx.AsyncClient, store: Store) -> None:
    a, b = _ask(store), _ask(store, 0.001)
    listed = (await api.get("/approvals")).json()
    assert [r["id"] for r in listed] == [a.id, b.id] and listed[0]["credentials"] == ["k"]
    r = await api.post(f"/approvals/{a.id}/approve", json={"scope": "for:10m"})
    assert r.status_code == 200, r.text
    grant = r.json()["grant"]
    assert r.json()["approval"]["state"] == "approved" and grant["scope"] == "for"
    problem(await api.post(f"/approvals/{a.id}/deny"), 409, "approval_not_pending")
    assert (await api.post(f"/approvals/{b.id}/deny")).json()["approval"]["state"] == "denied"
    assert [g["id"] for g in (await api.get("/grants")).json()] == [grant["id"]]
    assert (await api.delete(f"/grants/{grant['id']}")).status_code == 204
    assert (await api.get("/grants")).json() == [] and len((await api.get("/grants?all=true")).json()) == 1
    assert [r["id"] for r in (await api.get("/approvals?state=all")).json()] == [a.id, b.id]


async def test_bad_requests_are_specific(api: httpx.AsyncClient, store: Store) -> None:
    a = _ask(store)
    problem(await api.post(f"/approvals/{a.id}/approve", json={"scope": "session"}), 422, "bad_scope")
    problem(
        await api.post(f"/approvals/{a.id}/approve", json={"scope": "once", "x": 1}), 422, "invalid_request"
    )
    problem(await api.post("/approvals/short/approve"), 422, "invalid_request")
    problem(await api.post(f"/approvals/{'n' * 22}/deny"), 404, "not_found")
    problem(await api.delete(f"/grants/{'n' * 22}"), 404, "not_found")
    problem(await api.get("/approvals?state=maybe"), 422, "bad_state")
    assert store.approval(a.id) == a


async def test_the_stream_sends_new_and_decided_approvals(control: Control, store: Store) -> None:
    """The stream's generator itself (httpx's ASGI transport buffers a whole response)."""
    events = _events(control)
    assert await anext(events) == b": stream of approvals\n\n"
    a = _ask(store)  # asked by "another process": seen by the poll
    async with asyncio.timeout(10):
        first = await anext(events)
        service.decide(store, a.id, "deny", None, "op")  # this process: seen at once
        second = await anext(events)
    await events.aclose()
    got = [json.loads(e.decode().split("data: ", 1)[1]) for e in (first, second)]
    assert first.startswith(b"event: approval\n")
    assert [(e["id"], e["state"]) for e in got] == [(a.id, "pending"), (a.id, "denied")]


async def test_the_streams_poll_reads_pending_approvals_only_and_sees_decisions_made_elsewhere(
    control: Control, store: Store, monkeypatch: object
) -> None:
    """Every poll read every approval ever asked (a sandbox asking and going away at its rate
    limit leaves thousands an hour); now only the pending ones, and by id the ones that left."""
    for _ in range(50):  # closed rows the poll must not read
        store.withdraw_approval(_ask(store).id, "client gone")
    asked: list[str | None] = []
    real = store.approvals

    def approvals(state: str | None = "pending") -> list[ApprovalRecord]:
        asked.append(state)
        return real(state)

    monkeypatch.setattr(store, "approvals", approvals)  # type: ignore[attr-defined]
    events = _events(control)
    assert await anext(events) == b": stream of approvals\n\n"
    a = _ask(store)
    async with asyncio.timeout(10):
        first = await anext(events)
        store.decide_approval(a.id, "deny", None, "another process", time.time())  # no notify here
        second = await anext(events)
    await events.aclose()
    got = [json.loads(e.decode().split("data: ", 1)[1]) for e in (first, second)]
    assert [(e["id"], e["state"]) for e in got] == [(a.id, "pending"), (a.id, "denied")]
    assert asked and set(asked) == {"pending"}, asked
