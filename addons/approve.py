"""approve: a request an ask rule covers waits for an operator's decision (issue 16).

An egress rule with ``approve:`` (:class:`proxy.core.approvals.Ask`) allows the requests its
``methods``/``paths`` cover only once an operator approves them. After policy and fence allowed
such a request, and no active grant covers it (:meth:`proxy.store.base.CredentialStore.matching_grant`:
claim, host, port, method, path, the credentials bound to the host, the claim's session), it is
HELD in ``requestheaders``:

- an approval is written to the credential store (so any control process can list and decide
  it) and audited ``approval_asked``; the hook then awaits, without blocking the event loop: it
  is woken in-process when this node's control listener decides it
  (:func:`proxy.control.approvals.wait_for`), and polls the store every
  :data:`POLL_SECONDS` otherwise (a decision made by another process or node);
- the hold happens before substitute, sign and stream run and before the body is read: the
  proxy runs with ``connection_strategy=lazy`` (proxy/engine/master.py), so no upstream TCP or
  TLS exists until this hook returns, and no secret has been swapped in;
- approved: the policy is decided again as of now (the rules in force now, the same function
  policy uses); allowed, the request continues, once; refused, it is refused with that reason;
- denied: 403 ``approval_denied``; no decision before the rule's ``timeout``: the approval is
  closed ``timed_out`` and the request refused 403 ``approval_timeout``; the client gone (the
  hook cancelled) or a failure: the approval is closed ``withdrawn`` (a failure refuses, fail
  closed).

Decision (written down here and in rules/README.md): the approval's ``preview`` is the request
HEAD (request line and header fields, placeholders kept, every live secret of the claim scrubbed
out, at most 64 KiB), not the body: holding before the body is read is what keeps substitution
and streaming unchanged for a held request, and the sandbox holds only placeholders anyway.

The request's own audit event carries ``approval``: ``{id, verdict, scope}`` for a held one,
``{grant}`` for one a standing grant let through.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from typing import Any

from mitmproxy import http

from addons import facts
from addons.policy import Policy
from proxy import audit
from proxy.control import approvals as service
from proxy.core.approvals import Ask
from proxy.core.decide import Reason, deny
from proxy.core.policy import EgressRule
from proxy.core.scrub import Scrubber
from proxy.engine.state import State
from proxy.store.base import ApprovalRecord, CredentialStore, new_id
from proxy.store.live import live_values

APPROVAL = "surrogate.approval"  # the request's audit event's ``approval``
POLL_SECONDS = 0.2  # the contract: a decision made elsewhere is seen within 250 ms
MAX_PREVIEW = 64 * 1024
RUN_ID = secrets.token_hex(8)  # this proxy process: a "session" grant lasts as long


class _Gone(Exception):
    """The client closed its connection while its request was held."""


class Approve:
    def __init__(self, state: State, policy: Policy) -> None:
        self.state = state
        self.policy = policy

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error:
            return
        decision = flow.metadata.get(facts.DECISION)
        rule = decision.rule if decision is not None and decision.allowed else None
        if rule is None or rule.approve is None:
            return
        method = flow.request.data.method.decode("ascii", "replace")
        path = flow.metadata.get(facts.PATH)
        target = path.target if path is not None else flow.request.path
        if not rule.approve.asks(method, target):
            return
        try:
            await self._hold(flow, rule, rule.approve, method, target)
        except Exception as e:  # fail closed: a request an ask rule covers never passes unasked
            facts.log.error("approve.requestheaders failed with %s; request %s refused", type(e).__name__,
                            flow.metadata.get(facts.REQUEST_ID, flow.id))  # fmt: skip
            facts.refuse(flow, deny(Reason.INTERNAL_ERROR, "surrogate could not hold this request", 503))

    async def _hold(self, flow: http.HTTPFlow, rule: EgressRule, ask: Ask, method: str, target: str) -> None:
        store = self.state.registry.store
        if store is None:
            raise RuntimeError("no credential store to keep approvals in")
        claim = flow.metadata[facts.CLAIM]
        host: str = flow.metadata[facts.HOST]
        port = flow.request.port
        names = sorted(c.name for c in claim.credentials if c.bound_to(host))
        generation = self.state.registry.generation(claim.id)
        session = f"{RUN_ID}:{generation[0] if generation else 0}"
        now = time.time()
        grant = await asyncio.to_thread(
            store.matching_grant, claim.id, host, method, target, names, now, port=port, session=session
        )
        if grant is not None:
            flow.metadata[APPROVAL] = {"grant": grant.id}
            return
        record = ApprovalRecord(
            id=new_id(), claim_id=claim.id, pool=claim.pool, method=method, host=host,
            port=port, path=target, credentials=tuple(names), preview=_preview(flow, claim, now),
            rule=rule.id, scopes=ask.scopes, created_at=now, expires_at=now + ask.timeout,
            session=session, request_id=flow.metadata.get(facts.REQUEST_ID, flow.id),
        )  # fmt: skip
        await asyncio.to_thread(store.add_approval, record)
        audit.logger().info("approval_asked", approval=record.id, request_id=record.request_id,
                            claim=claim.id, host=host, method=method, path=audit.redact_path(target),
                            rule=rule.id, expires_at=record.expires_at)  # fmt: skip
        service.notify(record)
        flow.metadata[APPROVAL] = {"id": record.id, "verdict": None, "scope": None}
        try:
            decided = await self._wait(flow, store, record)
        except (asyncio.CancelledError, _Gone, Exception):
            with contextlib.suppress(Exception):
                await asyncio.shield(asyncio.to_thread(store.withdraw_approval, record.id, "client gone"))
            raise
        self._resume(flow, record, decided)

    def _resume(self, flow: http.HTTPFlow, record: ApprovalRecord, decided: ApprovalRecord | None) -> None:
        if decided is None or decided.state == "timed_out":
            flow.metadata[APPROVAL] = {"id": record.id, "verdict": "timed_out", "scope": None}
            why = f"nobody approved this request within {record.expires_at - record.created_at:g} s"
            facts.refuse(flow, deny(Reason.APPROVAL_TIMEOUT, f"approval {record.id}: {why}"))
            return
        verdict = "approve" if decided.state == "approved" else "deny"
        flow.metadata[APPROVAL] = {"id": record.id, "verdict": verdict, "scope": decided.scope}
        if decided.state != "approved":
            why = f"approval {record.id}: {decided.state} by {decided.decided_by or 'the proxy'}"
            facts.refuse(flow, deny(Reason.APPROVAL_DENIED, why))
            return
        # the rules in force now decide again: a reload while it was held may refuse it
        claim = flow.metadata[facts.CLAIM]
        try:
            again = self.policy.recheck(flow, claim.pool)
        except KeyError:
            again = deny(Reason.NO_RULE, f"claim {claim.id!r}: its pool {claim.pool!r} is no longer defined")
        flow.metadata[facts.DECISION] = again
        if not again.allowed:
            facts.refuse(flow, again)
            return
        flow.metadata[facts.ALLOWED_BY] = again.rule

    async def _wait(
        self, flow: http.HTTPFlow, store: CredentialStore, record: ApprovalRecord
    ) -> ApprovalRecord | None:
        """The decided record, or None at the timeout (then closed ``timed_out`` in the store;
        a decision that won the race against the timeout is kept)."""
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()

        def wake(_record: ApprovalRecord) -> None:
            loop.call_soon_threadsafe(woken.set)

        stop = service.wait_for(record.id, wake)
        try:
            while True:
                left = record.expires_at - time.time()
                if left > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(woken.wait(), min(POLL_SECONDS, left))
                    woken.clear()
                current = await asyncio.to_thread(store.approval, record.id)
                if current is not None and current.state != "pending":
                    return current
                if flow.client_conn.timestamp_end is not None:
                    raise _Gone
                if left <= 0:
                    closed = await asyncio.to_thread(
                        store.withdraw_approval, record.id, "timeout", "timed_out"
                    )
                    if closed is not None:
                        service.notify(closed)
                        audit.logger().info("approval_decided", approval=record.id, who="proxy",
                                            request_id=record.request_id, claim=record.claim_id,
                                            verdict="timed_out", scope=None)  # fmt: skip
                        return None
        finally:
            stop()


def _preview(flow: http.HTTPFlow, claim: Any, now: float) -> str:
    """The request head, every live secret of the claim scrubbed out, at most MAX_PREVIEW bytes."""
    req = flow.request
    head = [f"{req.data.method.decode('ascii', 'replace')} {req.path} {req.http_version}"]
    head += [f"{k}: {v}" for k, v in req.headers.items(multi=True)]
    pairs = [
        (s.reveal().encode(), c.placeholder.encode()) for c in claim.credentials for s in live_values(c, now)
    ]
    text = Scrubber(pairs).scrub("\n".join(head).encode("utf-8", "surrogateescape"))
    return text[:MAX_PREVIEW].decode("utf-8", "replace")
