"""mint: credentials of kind ``oauth_client`` get their access token from the token endpoint.

Before substitute injects it, a request toward a host of such a credential (over TLS) needs a
fresh token (:func:`proxy.core.mint.fresh`): when the credential's slot holds none, this addon
asks the token endpoint for one — once per credential however many requests wait (an
``asyncio.Lock`` per credential in this process: single flight per worker; a fleet-wide lease
is not used for rules-file credentials) — and stores it in the slot, which is the credential's
value source. A store credential of grant ``refresh_token`` mints under the store's lease for it
(one minter at a time on every worker and node: the refresh token is spent by its use), reads
the newest refresh token from the store, and seals a rotated one there before giving the lease
back (proxy.store.kindbuild.StoreRefresh).

The token request takes the path every upstream request takes: the endpoint's name is resolved
and every address checked (:func:`addons.resolve.checked`: special-purpose addresses unless the
pool's ``allow_cidrs`` lists them, the proxy's own listeners; ``--resolve`` pins honoured), the
connection goes to the checked address with SNI and certificate verification for the name
(httpx with ``sni_hostname``; the upstream trust bundle mitmproxy verifies upstreams with), no
redirects, no environment proxies. The answer is read up to :data:`proxy.core.mint.MAX_BODY`,
and the whole exchange (connect, TLS, request, every read of the answer) has one deadline,
:data:`TIMEOUT`: httpx's own timeouts bound each read, so an endpoint dripping a byte at a time
would otherwise hold the credential's lock, and every request waiting on it, as long as it liked.

A failure refuses the request ``token_mint_failed`` (502; 503 when the endpoint cannot be
reached), with the endpoint's status and OAuth ``error`` code only: never its body. A 401 from
the API to a request that carried a minted token drops that token (once per token), so the
next request mints a new one; the 401 itself goes to the sandbox (no retry: no loop).
"""

from __future__ import annotations

import asyncio
import secrets
import ssl
import time

import httpx
import jwt
from mitmproxy import ctx, http

from addons import facts
from addons.resolve import checked
from proxy.core import mint
from proxy.core.decide import Reason, deny
from proxy.core.errors import SecretUnavailable, SurrogateError
from proxy.core.policy import Credential
from proxy.core.secrets import Secret
from proxy.engine.state import State

TIMEOUT = 10.0
RETRY_AFTER = 2.0  # seconds a failed mint is answered from memory (concurrent waiters, retries)


class Mint:
    def __init__(self, state: State) -> None:
        self.state = state
        self._tls: ssl.SSLContext | None = None

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error or facts.HOOK in flow.metadata:
            return
        claim = flow.metadata.get(facts.CLAIM)
        if claim is None or flow.request.scheme != "https":
            return
        host = flow.metadata.get(facts.HOST)
        for c in claim.injections:
            if c.mint is None or not c.bound_to(host):
                continue
            try:
                how = await self.ensure(c, claim.pool)
            except mint.MintError as e:
                facts.log.warning("credential %r: token not minted: %s", c.name, e.code)
                status = 503 if e.code in ("unreachable", "refused") else 502
                why = f"credential {c.name!r}: no access token ({e.code}); nothing was sent"
                facts.refuse(flow, deny(Reason.TOKEN_MINT_FAILED, why, status=status))
                return
            except Exception as e:  # fail closed, as every surrogate hook
                facts.log.error("credential %r: minting failed with %s", c.name, type(e).__name__)
                why = f"credential {c.name!r}: no access token (internal_error); nothing was sent"
                facts.refuse(flow, deny(Reason.TOKEN_MINT_FAILED, why, status=502))
                return
            flow.metadata.setdefault(facts.APPLIED, {})[c.name] = f"token_{how}"

    def response(self, flow: http.HTTPFlow) -> None:
        if flow.response is None or flow.response.status_code != 401:
            return
        claim = flow.metadata.get(facts.CLAIM)
        used = flow.metadata.get(facts.USED, {})
        for c in claim.injections if claim is not None else ():
            if c.mint is not None and c.name in used and c.mint.slot.drop(used[c.name]):
                facts.log.info("credential %r: token refused with 401; the next request mints anew", c.name)

    async def ensure(self, c: Credential, pool: str) -> str:
        """Make the credential's slot hold a fresh token: "cached" or "minted"; raises MintError."""
        m = c.mint
        assert m is not None
        if mint.fresh(m.slot.token, time.time(), m.spec.margin):
            return "cached"
        if m.slot.guard is None:
            m.slot.guard = asyncio.Lock()
        lock = m.slot.guard
        assert isinstance(lock, asyncio.Lock)
        async with lock:  # single flight: the waiters find the token the first one minted
            now = time.time()
            if mint.fresh(m.slot.token, now, m.spec.margin):
                return "cached"
            failed = m.slot.failed
            if failed is not None and now < failed[0] + RETRY_AFTER:
                raise failed[1]  # the waiters share the one failure: no storm on the endpoint
            try:
                token = await self._mint(c, pool)
            except mint.MintError as e:
                m.slot.failed = (time.time(), e)
                raise
            m.slot.failed = None
            m.slot.store(token)
            facts.log.info("credential %r: token minted (version %d)", c.name, m.slot.generation)
            return "minted"

    async def _mint(self, c: Credential, pool: str) -> mint.Token:
        """:meth:`fetch`; for a credential whose refresh token the store keeps, under its lease
        (one minter at a time across the workers and nodes of the store: a refresh token is
        spent by its use) and with the rotated one sealed before the lease is given back."""
        m = c.mint
        assert m is not None
        if m.kept is None:
            return await self.fetch(c, pool)
        hold = m.kept.hold()
        try:
            held = await asyncio.to_thread(hold.__enter__)
        except SurrogateError:
            raise mint.MintError("credential_unavailable", "the credential store cannot be reached") from None
        try:
            if not held:
                facts.log.warning("credential %r: another minter kept the lease; minting anyway", c.name)
            token = await self.fetch(c, pool)
            if token.refresh_token is not None:
                await _keep(c.name, m.kept, token.refresh_token)
            return token
        finally:
            await asyncio.to_thread(hold.__exit__, None, None, None)

    async def fetch(self, c: Credential, pool_name: str) -> mint.Token:
        m = c.mint
        assert m is not None
        url = m.spec.token_url
        if not c.bound_to(url.host):  # checked at load; checked again right before the secret leaves
            raise mint.MintError("refused", f"token endpoint {url.host} is not a host of the credential")
        pool = self.state.policy.pools.get(pool_name)
        ip, why = await checked(self.state, url.host, url.port, None, pool.allow_cidrs if pool else ())
        if ip is None:
            facts.log.warning("credential %r: token endpoint refused: %s", c.name, why)
            raise mint.MintError("refused", "token endpoint address refused")
        try:
            secret, _ = m.secret.current()
            # a store credential's refresh token is read from the store (another worker may have
            # rotated it): off the event loop
            refresh = await asyncio.to_thread(m.refresh_token) if m.kept is not None else m.refresh_token()
        except SecretUnavailable as e:
            raise mint.MintError("credential_unavailable", str(e)) from None
        assertion = _sign(m.spec, secret.reveal()) if m.spec.signs_jwt else None
        headers, body = mint.token_request(m.spec, secret, refresh, assertion)
        authority = url.host if url.port == 443 else f"{url.host}:{url.port}"
        path, _, query = url.path.partition("?")
        target = httpx.URL(scheme="https", host=ip, port=url.port, path=path)
        if query:
            target = target.copy_with(query=query.encode())
        try:
            async with (
                asyncio.timeout(TIMEOUT),  # the whole exchange: httpx's timeouts are per read
                httpx.AsyncClient(verify=self._context(), trust_env=False, timeout=TIMEOUT) as client,
                client.stream(
                    "POST",
                    target,
                    headers=[("host", authority), *headers],
                    content=body,
                    extensions={"sni_hostname": url.host},
                ) as r,
            ):
                data = b""
                async for chunk in r.aiter_raw():
                    data += chunk
                    if len(data) > mint.MAX_BODY:
                        raise mint.MintError("bad_response", "token response too large")
                return mint.parse_token_response(
                    r.status_code, r.headers.get("content-type", ""), _decoded(r, data), time.time()
                )
        except (httpx.HTTPError, TimeoutError) as e:
            facts.log.warning("credential %r: token endpoint unreachable: %s", c.name, type(e).__name__)
            raise mint.MintError("unreachable", "token endpoint unreachable") from None

    def _context(self) -> ssl.SSLContext:
        if self._tls is None:
            bundle = getattr(ctx.options, "ssl_verify_upstream_trusted_ca", None) if ctx else None
            self._tls = ssl.create_default_context(cafile=bundle or None)
        return self._tls


async def _keep(name: str, kept: mint.RefreshKeeper, token: Secret) -> None:
    """Persist a rotated refresh token (sealed in the store: a restart uses it). A failure is
    logged (its kind only) and the token kept in memory: this request already has its token."""
    try:
        await asyncio.to_thread(kept.keep, token)
    except Exception as e:
        facts.log.warning("credential %r: rotated refresh token not stored: %s", name, type(e).__name__)


def _decoded(r: httpx.Response, data: bytes) -> bytes:
    if r.headers.get("content-encoding", "identity").strip().lower() not in ("", "identity"):
        raise mint.MintError("bad_response", "token response is content-encoded")
    return data


def _sign(spec: mint.MintSpec, key: str) -> str:
    """The JWT assertion (RFC 7523 §2.1/§2.2) signed with the private key ``key`` (PEM)."""
    claims = mint.assertion_claims(spec, time.time(), secrets.token_urlsafe(16))
    return jwt.encode(claims, key.replace("\\n", "\n"), algorithm=spec.algorithm)
