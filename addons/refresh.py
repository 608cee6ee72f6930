"""refresh: one OAuth refresh of a credential at a time, on every node of the store together.

A request of a store claim to the token endpoint a credential declares (:mod:`proxy.core.oauth`;
host and canonical path, as :mod:`addons.oauth` matches it) first takes the store's lease
``oauth-refresh:<digest of claim id and credential name>`` (:mod:`proxy.store.leases`: across
every worker and, on PostgreSQL, every node). Decided:

- **The holder** goes on to the endpoint; :mod:`addons.oauth` captures the tokens into the store
  as today, and the lease is given back when the response is done (or the flow fails).
- **A request that finds the lease held waits** for it (at most :data:`WAIT` seconds). Once it
  holds it, it re-reads the versions of the credentials the endpoint writes (the refresh token
  and those receiving ``access_token`` / ``id_token``): when one moved since the request came
  in, a refresh finished meanwhile, so the endpoint is **not** called again (it would spend the
  refresh token just rotated, or return a second set of tokens). The request is answered by the
  proxy: ``200``, ``Cache-Control: no-store``, a JSON token response (RFC 6749 §5.1) of the
  placeholders of the receiving credentials (``access_token``, ``refresh_token``, ``id_token``
  where a credential receives it), ``token_type: Bearer`` and ``expires_in`` from the access
  token credential's expiry when it has one: exactly the shape of the holder's own answer, since
  placeholders do not change with a capture. When nothing moved (the holder's refresh failed),
  it calls the endpoint itself, as holder.
- A lease not had within :data:`WAIT` (a holder still running), or a store that cannot be read,
  refuses with ``503 credential_unavailable`` before anything is sent: fail closed. A holder
  that dies loses the lease :data:`TTL` seconds after taking it (below :data:`WAIT`, so its
  waiters take over); a refresh that runs past :data:`TTL` is no longer exclusive.
- **A waiter waits on the event loop** (r-fleet), a thread taken only for each one-statement
  try: the blocking ``store.lease(..., wait=WAIT)`` in ``asyncio.to_thread`` pinned a thread of
  the loop's shared default pool (``min(32, cpus + 4)`` threads) for the whole wait, so one
  claim's few waiting refreshes queued every other claim's refresh (and its holder's own
  give-back) behind them for up to :data:`WAIT` seconds.
- **The holder's request must be complete before its lease can expire** (r-fleet): the lease is
  taken at the request's headers and the body streams after, at the client's pace, so a client
  that sends its body slowly (a slow-loris) used to hold the lease past :data:`TTL`, a waiter
  then took it and called the endpoint, and the late body completed a second refresh with the
  same refresh token (one a rotating provider treats as reuse: RFC 6819 §5.2.2.3). Now a body
  byte that arrives later than :data:`SEND_BY` seconds after the lease was taken aborts the
  client and upstream connections (an incomplete request upstream, never processed) and the
  flow is audited ``credential_unavailable``; a body read whole (signed) is checked in
  ``request``, before anything is sent. What bounds the hold is then the endpoint's answer time.

- **Only a POST is answered from another's refresh** (r-fleet): the token endpoint takes POST
  only (RFC 6749 §3.2). Any method to the endpoint path still takes the lease (a provider that
  accepts another stays one at a time), but a GET (or any non-POST) that waited through a
  refresh is refused ``503 credential_unavailable`` (retry), never given a made-up token
  response, and never sent with the values substituted into its head before the wait.

Rules-file claims cannot declare a capture (:mod:`proxy.core.oauth`): nothing to do for them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from contextlib import AbstractContextManager
from typing import Any

from mitmproxy import http

from addons import facts
from addons.substitute import _close as abort_flow
from proxy.core.decide import Action, Decision, Reason, deny
from proxy.core.policy import Claim, Credential
from proxy.engine.state import State
from proxy.store.base import CredentialStore

TTL = 30.0  # seconds a holder keeps the lease at most (a token endpoint answers in far less)
WAIT = 35.0  # seconds a request waits for another's refresh: past TTL, so a dead holder's waiters go on
_FIRST_NAP, _LAST_NAP = 0.01, 0.2  # a waiter's naps between tries, as proxy.store.leases waits
SEND_BY = TTL - 5.0  # seconds after taking the lease by which the holder's request is all sent
LEASE = "surrogate.refresh.lease"  # flow.metadata: the held lease, given back when the flow ends


DEADLINE = "surrogate.refresh.send_by"  # flow.metadata: monotonic time the request must be sent by


def _late(flow: http.HTTPFlow, cred: Credential) -> None:
    why = (f"the refresh of credential {cred.name!r} was not sent within {SEND_BY:g} s of taking "
           "its lease (a slow request body): aborted, so the refresh stays one at a time")  # fmt: skip
    flow.metadata[facts.DECISION] = deny(Reason.CREDENTIAL_UNAVAILABLE, why, status=503)


async def _take(store: CredentialStore, key: str) -> AbstractContextManager[bool] | None:
    """The held lease ``key``, or None when another kept it for :data:`WAIT` seconds. Waits on
    the event loop, a thread only per try: a waiter never pins a thread of the shared pool."""
    deadline, nap = time.monotonic() + WAIT, _FIRST_NAP
    while True:
        lease: AbstractContextManager[bool] = store.lease(key, TTL, 0.0)
        if await asyncio.to_thread(lease.__enter__):
            return lease
        await asyncio.to_thread(lease.__exit__, None, None, None)  # held nothing: closes the try
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        await asyncio.sleep(min(nap, left))
        nap = min(nap * 2, _LAST_NAP)


def lease_key(claim_id: str, name: str) -> str:
    """The lease of one credential's refresh (a digest: ids and names of any length fit)."""
    return "oauth-refresh:" + hashlib.sha256(f"{claim_id}\0{name}".encode()).hexdigest()


def _versions(store: CredentialStore, claim_id: str, names: list[str]) -> tuple[int | None, ...]:
    return tuple(None if (r := store.get_credential(claim_id, n)) is None else r.version for n in names)


class RefreshLease:
    def __init__(self, state: State) -> None:
        self.state = state

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        claim, host = flow.metadata.get(facts.CLAIM), flow.metadata.get(facts.HOST)
        decision = flow.metadata.get(facts.DECISION)
        if flow.response or flow.error or claim is None or host is None or claim.origin != "store":
            return
        if decision is not None and not decision.allowed:
            return
        path = flow.metadata.get(facts.PATH) or flow.request.path
        cred = next((c for c in claim.oauth if c.oauth and c.oauth.matches(host, path)), None)
        store = self.state.registry.store
        if cred is None or cred.oauth is None or store is None:
            return
        names = [cred.name] + [
            n for f, n in cred.oauth.targets(cred.name).items() if n and f != "refresh_token"
        ]
        try:
            await self._hold(flow, store, claim, cred, names)
        except Exception as e:  # the store unreachable, or anything else: refuse, never call twice
            facts.log.warning("refresh lease for claim %s failed with %s", claim.id, type(e).__name__)
            await self._give_back(flow)
            why = f"cannot coordinate the refresh of credential {cred.name!r}: the store cannot be read"
            facts.refuse(flow, deny(Reason.CREDENTIAL_UNAVAILABLE, why, status=503))

    async def _hold(self, flow: http.HTTPFlow, store: CredentialStore, claim: Claim, cred: Credential,
                    names: list[str]) -> None:  # fmt: skip
        seen = await asyncio.to_thread(_versions, store, claim.id, names)
        lease = await _take(store, lease_key(claim.id, cred.name))
        if lease is None:
            facts.refuse(flow, deny(Reason.CREDENTIAL_UNAVAILABLE, f"another refresh of credential "
                                    f"{cred.name!r} is still running", status=503))  # fmt: skip
            return
        flow.metadata[LEASE] = lease
        now = await asyncio.to_thread(_versions, store, claim.id, names)
        if now != seen:  # a refresh finished while this one waited: answer from its tokens
            await self._give_back(flow)
            if flow.request.method.upper() != "POST":  # not a token request (RFC 6749 §3.2)
                method = flow.request.method[:16]
                why = (f"a refresh of credential {cred.name!r} finished while this {method} waited; "
                       "only a POST is answered with its tokens: retry")  # fmt: skip
                facts.refuse(flow, deny(Reason.CREDENTIAL_UNAVAILABLE, why, status=503))
                return
            await self._answer(flow, store, claim, cred)
            return
        self._send_by(flow, cred, time.monotonic() + SEND_BY)

    @staticmethod
    def _send_by(flow: http.HTTPFlow, cred: Credential, deadline: float) -> None:
        """Abort the flow when a byte of its body comes past ``deadline`` (the lease may be gone)."""
        flow.metadata[DEADLINE] = (deadline, cred)
        if flow.metadata.get(facts.WHOLE_BODY) or "surrogate.sigv4_hold" in flow.metadata:
            return  # read whole, then checked in `request` before it is sent
        inner = flow.request.stream

        def bounded(chunk: bytes) -> Any:
            if time.monotonic() > deadline:
                _late(flow, cred)
                abort_flow(flow)
                return b""
            return inner(chunk) if callable(inner) else chunk

        flow.request.stream = bounded

    def request(self, flow: http.HTTPFlow) -> None:
        held = flow.metadata.get(DEADLINE)
        if held is None or flow.response or flow.error or callable(flow.request.stream):
            return
        deadline, cred = held
        if time.monotonic() > deadline:
            flow.metadata.pop(facts.USED, None)  # nothing was sent
            _late(flow, cred)
            facts.refuse(flow, flow.metadata[facts.DECISION])

    async def _answer(
        self, flow: http.HTTPFlow, store: CredentialStore, claim: Claim, cred: Credential
    ) -> None:
        assert cred.oauth is not None
        by_name = {c.name: c for c in claim.credentials}
        body: dict[str, Any] = {"token_type": "Bearer"}
        for field, target in cred.oauth.targets(cred.name).items():
            if target is not None and target in by_name:
                body[field] = by_name[target].placeholder
        if cred.oauth.access_token:
            access = await asyncio.to_thread(store.get_credential, claim.id, cred.oauth.access_token)
            if access is not None and access.expires_at is not None:
                body["expires_in"] = max(0, int(access.expires_at - time.time()))
        flow.request.stream = False  # mitmproxy cannot answer a flow that streams its request
        flow.metadata.pop(facts.USED, None)  # nothing was sent
        headers = {"content-type": "application/json", "cache-control": "no-store",
                   facts.REQUEST_ID_HEADER: flow.metadata.get(facts.REQUEST_ID, flow.id)}  # fmt: skip
        flow.response = http.Response.make(200, json.dumps(body).encode(), headers)
        allowed = flow.metadata.get(facts.DECISION)
        flow.metadata[facts.DECISION] = Decision(
            Action.ALLOW, Reason.ALLOWED, f"answered from the tokens a concurrent refresh of credential "
            f"{cred.name!r} captured", allowed.rule if allowed else None, 200,
        )  # fmt: skip

    @staticmethod
    async def _give_back(flow: http.HTTPFlow) -> None:
        lease = flow.metadata.pop(LEASE, None)
        if lease is not None:
            await asyncio.to_thread(lease.__exit__, None, None, None)

    async def response(self, flow: http.HTTPFlow) -> None:
        await self._give_back(flow)

    async def error(self, flow: http.HTTPFlow) -> None:
        await self._give_back(flow)
