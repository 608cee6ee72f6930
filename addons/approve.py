"""approve: a request an ask rule covers waits for an operator's decision (issue 16).

An egress rule with ``approve:`` (:class:`proxy.core.approvals.Ask`) allows the requests its
``methods``/``paths`` cover only once an operator approves them. After policy and fence allowed
such a request, and no active grant covers it (:meth:`proxy.store.base.CredentialStore.matching_grant`:
claim, host, port, method, path, the credentials bound to the host, the claim's session), it is
HELD before any upstream connection, where depends on its body (decision, issue 16: "the body
is read up to a bound"):

- a declared ``Content-Length`` of at most :data:`proxy.core.preview.BODY_BOUND` (64 KiB): held in
  ``request``, its body read, so the preview shows it. In ``requestheaders`` approve answers it
  for the time being (every later addon passes an answered flow by, and mitmproxy reads the body
  rather than stream it, so no upstream connection opens); in ``request`` the answer is taken
  back, the request held, and once approved :func:`addons.approvebody.after` runs the later
  addons' ``requestheaders`` and the body stream they set up. Nothing past approve saw the
  request before the decision (no swap, no budget spent, no token minted, no address pinned);
- anything else (longer, chunked, HTTP/2 without a length, no body): held in ``requestheaders``,
  before its body is read; its client connection is not read meanwhile (HTTP/1; HTTP/2 when a
  body may follow: the whole connection waits; :class:`addons.holdio.Unread`), so the client's
  send blocks and memory stays flat; the preview says ``[body not read: N bytes]``.

Either way:

- an approval is written to the credential store (so any control process can list and decide
  it) and audited ``approval_asked``; the hook then awaits, without blocking the event loop: it
  is woken in-process when this node's control listener decides it
  (:func:`proxy.control.approvals.wait_for`), and polls the store every
  :data:`POLL_SECONDS` otherwise (a decision made by another process or node);
- the hold happens before substitute, sign and stream run: the proxy runs with
  ``connection_strategy=lazy`` (proxy/engine/master.py), so no upstream TCP or TLS exists until
  this hook returns, and no secret has been swapped in;
- approved: the registry is read again; a claim deleted or changed meanwhile (407), a stale
  store copy (503 ``store_stale``), a client gone, or a credential newly bound to the host
  (``approval_denied``) refuses it; otherwise the request goes on with the claim's credentials
  as they are now, and the policy is decided again as of now (the rules in force now, the same
  function policy uses); allowed, the request continues, once; refused, it is refused with that
  reason (review r-approve);
- denied: 403 ``approval_denied``; no decision before the rule's ``timeout``: the approval is
  closed ``timed_out`` and the request refused 403 ``approval_timeout``; the client gone (the
  hook cancelled) or a failure: the approval is closed ``withdrawn`` (a failure refuses, fail
  closed).

The approval's ``preview`` (:mod:`proxy.core.preview`) is the request as the sandbox sent it:
head and, when read, body, placeholders kept, every live secret of the claim scrubbed out, a
body that is not text shown as its byte count, at most 64 KiB.

The request's own audit event carries ``approval``: ``{id, verdict, scope}`` for a held one,
``{grant}`` for one a standing grant let through.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
import time
from typing import Any

from mitmproxy import http

from addons import facts, holdio, scrubpairs
from addons.approvebody import after as _after
from addons.notify import Notifier
from addons.policy import Policy
from proxy import audit
from proxy.control import approvals as service
from proxy.core import methods, preview
from proxy.core.approvals import Ask, offered
from proxy.core.decide import Reason, deny
from proxy.core.policy import EgressRule
from proxy.core.scrub import Scrubber
from proxy.engine.state import State
from proxy.store.approvals import PendingLimit
from proxy.store.base import ApprovalRecord, CredentialStore, new_id

APPROVAL = "surrogate.approval"  # the request's audit event's ``approval``
POLL_SECONDS = 0.2  # the contract: a decision made elsewhere is seen within 250 ms
_BODY = "surrogate.approval_body"  # requestheaders → request: held once its body is read
RUN_ID = secrets.token_hex(8)  # this proxy process: a "session" grant lasts as long


class _Gone(Exception):
    """The client closed its connection while its request was held."""


class Approve:
    def __init__(self, state: State, policy: Policy) -> None:
        self.state = state
        self.policy = policy
        self.notifier = Notifier()  # the rules' approvals.notify command (addons/notify.py)

    def done(self) -> None:
        self.notifier.done()

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
        ask, headers = rule.approve, flow.request.headers
        readings = flow.metadata.get(facts.METHODS) or methods.method_readings(method, headers, target)
        one_method = len(readings) == 1
        probe = False  # a POST whose body may name another method: asks only if it does
        if not ask.asks(method, target, readings):
            if not (ask.body_may_ask(method) and ask.reaches(target) and holdio.has_body(flow)):
                return
            if not preview.reads_body(headers.get("content-length")) or "content-encoding" in headers:
                one_method = False  # its body cannot be read first: asks, as any method
            else:
                probe = True
        if probe or preview.reads_body(headers.get("content-length")):
            # held in `request`, once its body is read; until then every later addon passes it
            # by (they skip an answered flow) and, should it never get there, it is refused
            flow.metadata[_BODY] = (rule, decision, method, target, one_method, probe)
            facts.refuse(flow, deny(Reason.INTERNAL_ERROR, "the held request's body did not arrive", 400))
            return
        # its connection is not read while held (back-pressure), from before any await: every
        # HTTP/1 one; an HTTP/2 one when a body may follow (its whole connection waits)
        h1 = flow.request.http_version.startswith("HTTP/1")
        unread = holdio.Unread(flow) if h1 or holdio.has_body(flow) else None
        try:
            await self._hold(flow, rule, ask, method, target, None, unread, one_method)
        except _Gone:
            self._gone(flow)
        except Exception as e:  # fail closed: a request an ask rule covers never passes unasked
            self._failed(flow, e)
        finally:
            if unread is not None:
                unread.release()

    async def request(self, flow: http.HTTPFlow) -> None:
        held = flow.metadata.pop(_BODY, None)
        if held is None or flow.error:
            return
        rule, allowed, method, target, one_method, probe = held
        flow.response = None
        flow.metadata[facts.DECISION] = allowed
        body = flow.request.raw_content or b""
        try:
            if not probe or methods.body_names_method(body):
                await self._hold(
                    flow, rule, rule.approve, method, target, body, None, not probe and one_method
                )
            if flow.response or flow.error:
                return
            await _after(self, flow)
        except _Gone:
            self._gone(flow)
        except Exception as e:  # fail closed, as above
            self._failed(flow, e)

    @staticmethod
    def _gone(flow: http.HTTPFlow) -> None:
        """The client went away while its request was held (its approval is withdrawn): audited
        ``client_closed``, not a failure of surrogate's (a newcomer saw ``internal_error``)."""
        why = "the client went away while its request was held; its approval was withdrawn"
        facts.refuse(flow, deny(Reason.CLIENT_CLOSED, why))

    @staticmethod
    def _failed(flow: http.HTTPFlow, e: Exception) -> None:
        facts.log.error("approve failed with %s; request %s refused", type(e).__name__,
                        flow.metadata.get(facts.REQUEST_ID, flow.id))  # fmt: skip
        facts.refuse(flow, deny(Reason.INTERNAL_ERROR, "surrogate could not hold this request", 503))

    async def _hold(
        self, flow: http.HTTPFlow, rule: EgressRule, ask: Ask, method: str, target: str,
        body: bytes | None, unread: holdio.Unread | None, one_method: bool,
    ) -> None:  # fmt: skip
        """Hold ``flow`` until an operator decides (module docstring). ``one_method``: False when a
        server may read the request as another method too: no grant covers it, approved once."""
        store = self.state.registry.store
        if store is None:
            raise RuntimeError("no credential store to keep approvals in")
        claim = flow.metadata[facts.CLAIM]
        host: str = flow.metadata[facts.HOST]
        port = flow.request.port
        names = sorted(c.name for c in claim.credentials if c.bound_to(host))
        session = self._session(claim.id)
        now = time.time()
        grant = (
            await asyncio.to_thread(
                store.matching_grant, claim.id, host, method, target, names, now, port=port, session=session
            )
            if one_method
            else None
        )
        if grant is not None:
            flow.metadata[APPROVAL] = {"grant": grant.id}
            return
        record = ApprovalRecord(
            id=new_id(), claim_id=claim.id, pool=claim.pool, method=method, host=host,
            port=port, path=target, credentials=tuple(names), preview=_preview(flow, claim, now, body),
            rule=rule.id, scopes=offered(target, ask.scopes, one_method), created_at=now,
            expires_at=now + ask.timeout,
            session=session, request_id=flow.metadata.get(facts.REQUEST_ID, flow.id),
        )  # fmt: skip
        bound = self.state.policy.pools[claim.pool].limits.approvals
        try:
            await asyncio.to_thread(store.add_approval, record, max_pending=bound)
        except PendingLimit:  # a sandbox holding many requests fills neither the store nor the page
            why = f"claim {claim.id!r} already has {bound} requests waiting for approval (limits.approvals)"
            facts.refuse(flow, deny(Reason.APPROVAL_LIMIT, why, 429), {"Retry-After": "1"})
            return
        audit.logger().info("approval_asked", approval=record.id, request_id=record.request_id,
                            claim=claim.id, host=host, method=method, path=audit.redact_path(target),
                            rule=rule.id, expires_at=record.expires_at)  # fmt: skip
        service.notify(record)
        self.notifier.send(record, self.state.policy.notify)
        flow.metadata[APPROVAL] = {"id": record.id, "verdict": None, "scope": None}
        try:
            decided = await self._wait(flow, store, record, unread)
        except (asyncio.CancelledError, _Gone, Exception):
            with contextlib.suppress(Exception):
                await asyncio.shield(asyncio.to_thread(store.withdraw_approval, record.id, "client gone"))
            raise
        if unread is not None:
            unread.release()  # read again: an approved body goes out, a refused one's connection closes
        self._resume(flow, record, decided)

    def _session(self, claim_id: str) -> str:
        """The claim's session: this process and the store claim's generation (its version AND
        creation time: a claim deleted and created again under its id is at version 1 again);
        ``rules`` for a rules-file claim (it lasts as long as this process)."""
        generation = self.state.registry.generation(claim_id)
        return f"{RUN_ID}:{'rules' if generation is None else f'{generation[0]}:{generation[1]!r}'}"

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
        claim = flow.metadata[facts.CLAIM]
        if flow.client_conn.timestamp_end is not None:  # approved for nobody: nothing goes out
            facts.refuse(flow, deny(Reason.CLIENT_CLOSED, f"approval {record.id}: the client went away"))
            return
        # the claim deleted, or changed (token rotated, made again), while its request was held:
        # the claim object this flow holds is revoked; its credentials must not go out. The
        # registry is read now (identify's poll may not have run since the control API acked)
        registry = self.state.registry
        registry.refresh()  # identify's poll still closes the claim's tunnels: it compares generations
        if claim.origin == "store" and registry.stale() is not None:
            why = f"approval {record.id}: this node's copy of the credential store is not current"
            facts.refuse(flow, deny(Reason.STORE_STALE, why, 503), {"Retry-After": "1"})
            return
        fresh = registry.claim(claim.id)
        if fresh is None or self._session(claim.id) != record.session:
            why = f"approval {record.id}: claim {claim.id!r} was revoked or changed while it was held"
            facts.refuse(flow, deny(Reason.PROXY_AUTH_REQUIRED, why, 407))
            return
        # its credentials as they are now (a value replaced, hosts narrowed while it was held):
        # substitute must not swap in what this flow's old claim object still holds, and none
        # may join the ones the operator saw
        if {c.name for c in fresh.credentials if c.bound_to(record.host)} - set(record.credentials):
            why = f"approval {record.id}: the credentials bound to {record.host} changed while it was held"
            facts.refuse(flow, deny(Reason.APPROVAL_DENIED, why))
            return
        flow.metadata[facts.CLAIM] = claim = fresh
        # the rules in force now decide again: a reload while it was held may refuse it
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
        self, flow: http.HTTPFlow, store: CredentialStore, record: ApprovalRecord,
        unread: holdio.Unread | None,
    ) -> ApprovalRecord | None:  # fmt: skip
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
                if current is None:  # gone from the store (restored, removed): refused, not polled on
                    return dataclasses.replace(record, state="withdrawn", decided_by="the store")
                if current.state != "pending":
                    return current
                if flow.client_conn.timestamp_end is not None or (unread is not None and unread.gone()):
                    raise _Gone
                if unread is not None:
                    unread.pause()
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


def _preview(flow: http.HTTPFlow, claim: Any, now: float, body: bytes | None = None) -> str:
    """The request as the sandbox sent it (:mod:`proxy.core.preview`), scrubbed with the response
    scrubber's own pairs (every live value of the claim's credentials, an aws_sigv4 key's parts
    each: review r-approve)."""
    req = flow.request
    line = f"{req.data.method.decode('ascii', 'replace')} {req.path} {req.http_version}"
    pairs = scrubpairs.pairs(claim, now)
    undeclared = "content-length" not in req.headers and (
        "transfer-encoding" in req.headers
        if req.http_version.startswith("HTTP/1")
        else req.method.upper() in ("POST", "PUT", "PATCH")
    )
    scrub = Scrubber(pairs).scrub
    return preview.preview(line, list(req.headers.items(multi=True)), body, scrub, undeclared=undeclared)
