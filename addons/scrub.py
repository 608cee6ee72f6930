"""scrub: secret → placeholder in responses, streaming.

For a claim that holds credentials, every credential's current value is replaced by its
placeholder in response header values and bodies (:class:`proxy.scrub.Scrubber`: a secret split
across reads is caught; only a tail that could start a secret is held back, so an SSE event is
not delayed to the next read). Requests of such claims ask for ``Accept-Encoding: identity``; a
body that is compressed anyway is decoded on the fly (gzip, deflate, br) and sent decoded, and
one in an encoding that cannot be decoded is refused (the connection is closed: it cannot be
scanned). A scrubbed body changes length, so ``Content-Length`` is dropped (HTTP/1 clients get
chunked framing). WebSocket upgrades (101) are not scrubbed here.

Errors: mitmproxy's protocol-error messages quote the offending bytes (``Received invalid
header name: b'...'``), it sends that message to the client as its 502 page, and the audit event
records it. A hostile upstream that reflects the secret into a malformed response would get it
through both. When an error message holds a secret of the claim (raw or as Python bytes-repr),
the flow is killed instead, and the client's connection is closed under mitmproxy before it
writes the page: the audit event says "Connection killed." and the sandbox gets a closed
connection. Measured on mitmproxy 12.3: a kill in the error hook replaces the error page for
protocol errors (``HttpStream.check_killed``), but not for a response that fails header
validation (``HttpStream.check_invalid`` sends it unconditionally after the hook); there, only
closing the client transport in the hook (``SendData`` skips a closing writer) withholds it.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import brotli  # type: ignore[import-untyped]  # mitmproxy depends on it; no stubs
from mitmproxy import ctx, http
from mitmproxy import flow as mflow

from addons import facts
from proxy.errors import SecretUnavailable
from proxy.policy import Claim
from proxy.registry import StoreValue
from proxy.scrub import Scrubber, ScrubTable

_TABLES_KEPT = 256


class _Tables:
    """The compiled scrub table of each claim, built once per claim and set of values.

    A store claim's values are fixed for the life of its Claim object (the registry builds a new
    one when the store changes), so the claim's identity is the key. A rules-file value (``file:``
    re-read on change, ``env:``) may change under the same Claim: those credentials' current
    Secret objects are compared by identity on every use (a changed value is a new object). A
    table is not kept while some value cannot be read: the next response tries again.
    """

    def __init__(self) -> None:
        self._kept: dict[int, tuple[Claim, tuple[tuple[Any, Any], ...], ScrubTable]] = {}

    def get(self, claim: Claim) -> ScrubTable:
        entry = self._kept.get(id(claim))
        if entry is not None and entry[0] is claim:
            try:
                if all(c.secret()[0] is s for c, s in entry[1]):
                    return entry[2]
            except SecretUnavailable:
                pass
        pairs, volatile, complete = [], [], True
        for c in claim.credentials:
            try:
                secret, _ = c.secret()
            except SecretUnavailable:
                complete = False
                continue  # nothing read, nothing to hide
            pairs.append((secret.reveal().encode(), c.placeholder.encode()))
            if not isinstance(c.source, StoreValue):
                volatile.append((c, secret))
        table = ScrubTable(pairs)
        if complete:
            if len(self._kept) >= _TABLES_KEPT:
                self._kept.clear()
            self._kept[id(claim)] = (claim, tuple(volatile), table)
        return table


def _decoder(encoding: str) -> Callable[[bytes], bytes] | None:
    if encoding in ("", "identity"):
        return lambda b: b
    if encoding in ("gzip", "x-gzip", "deflate"):
        d: Any = zlib.decompressobj(32 + zlib.MAX_WBITS)  # zlib or gzip header, detected
        return lambda b: d.decompress(b) if b else d.flush()
    if encoding == "br":
        b_: Any = brotli.Decompressor()
        return lambda b: b_.process(b) if b else b""
    return None


class Scrub:
    def __init__(self) -> None:
        self.tables = _Tables()

    @facts.fail_closed
    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error:
            return
        claim = flow.metadata.get(facts.CLAIM)
        if claim is not None and claim.credentials and "accept-encoding" in flow.request.headers:
            flow.request.headers["Accept-Encoding"] = "identity"

    @facts.fail_closed
    def responseheaders(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        claim = flow.metadata.get(facts.CLAIM)
        if response is None or claim is None or not claim.credentials or response.status_code == 101:
            return
        scrubber = Scrubber(self.tables.get(claim))
        if not scrubber.active:
            return
        response.headers.fields = tuple((n, scrubber.scrub(v)) for n, v in response.headers.fields)
        encoding = response.headers.get("content-encoding", "").strip().lower()
        decode = _decoder(encoding)
        if decode is None:
            facts.log.warning("response in %r cannot be scanned for secrets; connection closed", encoding)
            flow.kill()
            return
        if encoding not in ("", "identity"):
            del response.headers["content-encoding"]
        response.headers.pop("content-length", None)
        if not flow.request.http_version.startswith("HTTP/2") and not flow.request.http_version.startswith(
            "HTTP/3"
        ):
            response.headers["transfer-encoding"] = "chunked"
        inner = response.stream if callable(response.stream) else (lambda b: b)

        def scrub(chunk: bytes) -> list[bytes]:
            got = inner(chunk)
            raw = got if isinstance(got, bytes) else b"".join(got)
            data = decode(raw) if raw else decode(b"")
            out = scrubber.feed(data) if data else b""
            if not chunk:  # end of the body: what was held back, scrubbed
                out += scrubber.finish()
            # never an empty piece: an empty chunk would end a chunked HTTP/1 body early
            return [out] if out else []

        response.stream = scrub

    def error(self, flow: http.HTTPFlow) -> None:
        claim = flow.metadata.get(facts.CLAIM)
        if flow.error is None or claim is None or not claim.credentials:
            return
        try:
            message = flow.error.msg.encode("utf-8", "surrogateescape")
            quoted = any(
                secret in message or repr(secret)[2:-1].encode() in message for secret in _secrets(claim)
            )
        except Exception as e:  # fail closed: an error we cannot check is withheld
            facts.log.error("scrub.error failed with %s; error message withheld", type(e).__name__)
            quoted = True
        if quoted:
            facts.log.warning("an upstream error message quoted a credential; withheld, connection closed")
            flow.error = mflow.Error(mflow.Error.KILLED_MESSAGE)
            _close_client(flow)


def _secrets(claim: Claim) -> list[bytes]:
    """The claim's current secret values (those that can be read now)."""
    out = []
    for c in claim.credentials:
        try:
            secret, _ = c.secret()
        except SecretUnavailable:
            continue
        out.append(secret.reveal().encode())
    return out


def _close_client(flow: http.HTTPFlow) -> None:
    """Close the client's transport now, so nothing more is written to it (mitmproxy 12.3
    internals: proxyserver's handlers by client id, their ConnectionIO writers)."""
    server = ctx.master.addons.get("proxyserver")
    handler = getattr(server, "connections", {}).get(flow.client_conn.id)
    io = getattr(handler, "transports", {}).get(flow.client_conn)
    writer = getattr(io, "writer", None)
    if writer is not None and not writer.is_closing():
        writer.close()
