"""The control API's approval routes (issue 16; the contract's paths), each one call into
:mod:`proxy.control.approvals`:

- ``GET /approvals?state=pending`` (``all`` for every one) → a list of approval records;
- ``GET /approvals/stream`` → server-sent events (``text/event-stream``, WHATWG HTML §9.2):
  ``event: approval`` with the record's JSON, one per new pending or decided approval, whichever
  process asked or decided it (this process's at once, others' by a store poll every
  :data:`POLL_SECONDS`); a ``: keepalive`` comment every 15 s;
- ``POST /approvals/{id}/approve`` body ``{"scope": "once"|"session"|"for:10m"|"always"}``
  (no body: ``once``) → ``{"approval": record, "grant": record|null}``;
- ``POST /approvals/{id}/deny`` → the same shape, grant null;
- ``GET /grants`` (``?all=true``: revoked and expired ones too); ``DELETE /grants/{id}`` → 204.

Like every control route, these need the operator token on TCP (or the 0600 socket) and are
never reachable through the proxy (:mod:`proxy.control.api`'s Host check refuses a browser page
under another name, so a sandbox cannot approve its own request by CSRF either).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Annotated, Any

from fastapi import Body, FastAPI, Path, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from proxy.control import approvals as service
from proxy.control.models import ErrorOut
from proxy.control.service import Control
from proxy.store.base import ApprovalRecord, CredentialStore

POLL_SECONDS = 0.5
KEEPALIVE_SECONDS = 15.0
ApprovalId = Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{16,64}$")]


class Decision(BaseModel):
    model_config = ConfigDict(extra="forbid")
    scope: str = Field(default="once", max_length=32)


def _answer(record: ApprovalRecord, grant: Any) -> dict[str, Any]:
    return {"approval": service.public(record), "grant": None if grant is None else service.public(grant)}


def _sse(record: ApprovalRecord) -> bytes:
    return f"event: approval\ndata: {json.dumps(service.public(record))}\n\n".encode()


def add_approval_routes(app: FastAPI, control: Control, who: str) -> None:
    """Add the approval routes over ``control.store`` to ``app``; ``who`` decides, in the audit."""
    store = control.store
    # every answer documented (the OpenAPI schema is checked against the server by schemathesis)
    errors: dict[int | str, dict[str, Any]] = {
        s: {"model": ErrorOut} for s in (400, 401, 403, 404, 409, 413, 422, 503)
    }
    sse: dict[int | str, dict[str, Any]] = {
        200: {"content": {"text/event-stream": {"schema": {"type": "string"}}},
              "description": "server-sent events: `event: approval` with the approval's JSON"},
        **errors,
    }  # fmt: skip

    @app.get("/approvals", responses=errors)
    async def list_approvals(state: str = "pending") -> list[dict[str, Any]]:
        return [service.public(r) for r in service.list_approvals(store, state)]

    @app.post("/approvals/{approval_id}/approve", responses=errors)
    async def approve(
        approval_id: ApprovalId, body: Annotated[Decision | None, Body()] = None
    ) -> dict[str, Any]:
        record, grant = service.decide(store, approval_id, "approve", (body or Decision()).scope, who)
        return _answer(record, grant)

    @app.post("/approvals/{approval_id}/deny", responses=errors)
    async def deny(approval_id: ApprovalId) -> dict[str, Any]:
        record, grant = service.decide(store, approval_id, "deny", None, who)
        return _answer(record, grant)

    @app.get("/grants", responses=errors)
    async def grants(all: bool = False) -> list[dict[str, Any]]:  # noqa: A002 - the query's name
        return [service.public(g) for g in service.list_grants(store, active=not all)]

    @app.delete("/grants/{grant_id}", status_code=204, responses=errors)
    async def revoke(grant_id: ApprovalId) -> Response:
        service.revoke_grant(store, grant_id, who)
        return Response(status_code=204)

    @app.get("/approvals/stream", response_class=StreamingResponse, responses=sse)
    async def stream() -> StreamingResponse:
        return StreamingResponse(_events(control), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store"})  # fmt: skip


def _changed(store: CredentialStore, pending: dict[str, ApprovalRecord]) -> list[ApprovalRecord]:
    """Approvals pending now that ``pending`` lacks, and the ones of ``pending`` that are no
    longer (as they are now). Reads the pending ones only, not every approval ever asked: a
    sandbox asking and going away at its rate limit leaves thousands of closed rows an hour,
    which each stream read whole every poll (review r-approve)."""
    now = store.approvals("pending")
    ids = {r.id for r in now}
    out = [r for r in now if r.id not in pending]
    for gone in [i for i in pending if i not in ids]:
        record = store.approval(gone)
        out.append(record if record is not None else replace(pending[gone], state="withdrawn"))
    return out


async def _events(control: Control) -> AsyncIterator[bytes]:
    """New pending and decided approvals, as they come; ends when the client goes away."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[ApprovalRecord] = asyncio.Queue(maxsize=1000)

    def put(record: ApprovalRecord) -> None:
        loop.call_soon_threadsafe(lambda: None if queue.full() else queue.put_nowait(record))

    stop = service.watch(put)
    pending = {r.id: r for r in await asyncio.to_thread(control.store.approvals, "pending")}
    last_beat = time.monotonic()
    try:
        yield b": stream of approvals\n\n"
        while True:
            try:
                record = await asyncio.wait_for(queue.get(), POLL_SECONDS)
                fresh = [record]
            except TimeoutError:
                fresh = await asyncio.to_thread(_changed, control.store, pending)
            for r in fresh:
                if r.state == "pending":
                    if r.id in pending:
                        continue
                    pending[r.id] = r
                elif pending.pop(r.id, None) is None and r.state == "withdrawn":
                    continue  # asked and gone between two polls: nothing to show or decide
                yield _sse(r)
            if time.monotonic() - last_beat > KEEPALIVE_SECONDS:
                last_beat = time.monotonic()
                yield b": keepalive\n\n"
    finally:
        stop()
