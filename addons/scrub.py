"""scrub: secret → placeholder in responses, streaming.

For a claim that holds credentials, every live value of each credential (current and recently
replaced, :mod:`proxy.store.live`) is replaced by its
placeholder in response header values and bodies, raw or percent-, JSON- or base64-escaped
(:class:`proxy.core.scrub.Scrubber` lists the forms; a secret split across reads is caught; only a
tail that could start a secret is held back, so an SSE event is not delayed to the next read).
Requests of such claims ask for ``Accept-Encoding: identity``; a body that is compressed anyway
is decoded on the fly within bounds (gzip, deflate, br, zstd: :mod:`proxy.core.decode`) and sent
decoded. A body that cannot be scanned (no decoder for its coding, corrupt, or past a
decompression bound) is not passed: the connection is closed and the audit event says
``unscannable_response`` with the reason (so is a body under a transfer coding other than
chunked: :mod:`addons.hygiene`, before token capture reads it). A scrubbed body changes length, so
``Content-Length`` is dropped (HTTP/1.1 clients get chunked framing, HTTP/1.0 clients a body
that ends with the connection), except on a response that
has no body (HEAD, 1xx, 204, 304), whose framing is left alone. The reason phrase and header
names are scrubbed as the values are; so are HTTP/2 trailers (in the ``response`` hook, before
mitmproxy sends them), the head of a ``101`` and, in :class:`addons.wsscrub.ScrubMessages`
(re-exported here), every WebSocket message from the upstream and its control frames. The pairs
each scrubber uses, and their cache, are :mod:`addons.scrubpairs`.

Errors: mitmproxy's protocol-error messages quote the offending bytes (``Received invalid
header name: b'...'``), it sends that message to the client as its 502 page, and the audit event
records it. A hostile upstream that reflects the secret into a malformed response would get it
through both. When an error message holds a secret of the claim (raw, in any form the scrubber
catches, or as Python bytes-repr), the flow is killed instead, and the client's connection is
closed under mitmproxy before it writes the page: the audit event says "Connection killed." and
the sandbox gets a closed connection. Measured on mitmproxy 12.3: a kill in the error hook
replaces the error page for protocol errors (``HttpStream.check_killed``), but not for a response
that fails header validation (``HttpStream.check_invalid`` sends it unconditionally after the
hook); there, only closing the client transport in the hook (``SendData`` skips a closing
writer) withholds it.

Some messages carry the peer's bytes in a form no scrubber seeks: h2 (4.x, ``h2/events.py``
``_bytes_representation``) prints a GOAWAY's debug data as hex (its first 20 bytes), and
mitmproxy's message for it is ``HTTP/2 connection closed: <ConnectionTerminated error_code:2,
last_stream_id:1, additional_data:53654b72…>``: an upstream that echoed the secret there had its
first 20 bytes in the audit event. Every hex field of an h2 event (``additional_data``,
``ping_data``, ``data``) is elided from every error message, whoever the peer
(:func:`elide_peer_bytes`): opaque debug bytes tell an operator nothing the error code does not.
"""

from __future__ import annotations

import re
import time

from mitmproxy import ctx, http
from mitmproxy import flow as mflow

from addons import facts
from addons.scrubpairs import PairCache, Pairs, claims_now
from addons.sigv4 import SIGNATURES
from addons.wsscrub import ScrubMessages
from proxy.core.decide import Reason, deny
from proxy.core.decode import Unscannable, decoder
from proxy.core.policy import Claim
from proxy.core.scrub import Scrubber, compile_pairs, escapes_matter
from proxy.engine.state import State

__all__ = ["Scrub", "ScrubMessages", "elide_peer_bytes"]

# h2's repr of an event's bytes: ``name:`` and lower-case hex (h2/events.py _bytes_representation)
_H2_BYTES = re.compile(r"\b(\w*data):[0-9a-fA-F]+")


def elide_peer_bytes(message: str) -> str:
    """``message`` with the hex of every h2 event's bytes replaced by ``…`` (module docstring)."""
    return _H2_BYTES.sub(r"\1:…", message)


def _unscannable(flow: http.HTTPFlow, why: str) -> None:
    """Close the connection instead of passing a body that cannot be scanned, and say why."""
    facts.log.warning("response %s cannot be scanned for secrets: %s; connection closed",
                      flow.metadata.get(facts.REQUEST_ID, flow.id), why)  # fmt: skip
    flow.metadata[facts.DECISION] = deny(
        Reason.UNSCANNABLE_RESPONSE, f"response body cannot be scanned for secrets: {why}", status=502
    )
    if flow.killable:
        flow.kill()


class _Body:
    """A body's scrubber, and one more for each new set of values of its claim while the body
    streams (a credential replaced or added: the registry builds a new claim object; a ``file:``
    value re-read under the same one): a long SSE stream outlives the request that decided it.
    Each later scrubber reads what the earlier ones let out."""

    def __init__(self, first: Scrubber, pairs: Pairs, claim: Claim, state: State | None, cache: PairCache,
                 binary: bool):  # fmt: skip
        self.chain, self.seen = [first], [pairs]
        self.claim, self.state, self.cache, self.binary = claim, state, cache, binary

    def _refresh(self) -> None:
        fresh = self.state.registry.claim(self.claim.id) if self.state is not None else None
        pairs, compiled = self.cache.get(fresh or self.claim, time.time())
        if all(pairs is not p and pairs != p for p in self.seen):  # equal: the cache was rebuilt
            self.seen.append(pairs)
            binary = compiled.binary if self.binary and compiled.binary is not None else compiled
            self.chain.append(Scrubber(pairs, compiled=binary))

    def feed(self, data: bytes) -> bytes:
        self._refresh()
        for scrubber in self.chain:
            data = scrubber.feed(data) if data else b""
        return data

    def finish(self) -> bytes:
        out = b""
        for scrubber in self.chain:
            out = (scrubber.feed(out) if out else b"") + scrubber.finish()
        return out


class Scrub:
    def __init__(self, state: State | None = None) -> None:
        self.pairs = PairCache()
        self.state = state  # to read the claim as it is now while a body streams (_Body)

    @facts.fail_closed
    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error:
            return
        claim = flow.metadata.get(facts.CLAIM)
        if claim is None or not claim.credentials:
            return
        fields = flow.request.headers.fields
        at = [i for i, (n, _) in enumerate(fields) if n.lower() == b"accept-encoding"]
        if at:  # one field left, where the first was (as Headers.__setitem__ would leave it)
            first = (fields[at[0]][0], b"identity")
            rest = set(at[1:])
            flow.request.headers.fields = tuple(
                first if i == at[0] else f for i, f in enumerate(fields) if i not in rest
            )

    @facts.fail_closed
    def responseheaders(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        claim = flow.metadata.get(facts.CLAIM)
        if response is None or claim is None or not claim.credentials:
            return
        pairs, compiled = self.pairs.get(claim, time.time())
        extra = flow.metadata.get(SIGNATURES)
        if extra:  # this flow's own pairs: the real-key signature addons/sigv4.py made
            pairs = (*pairs, *extra)
            compiled = compile_pairs(pairs)
        scrubber = Scrubber(pairs, compiled=compiled)
        if not scrubber.active:
            return
        _scrub_head(response, scrubber)
        if _bodiless(flow.request.method, response.status_code):
            return  # no body: its framing is left as it is (a 204 with chunked poisons keep-alive)
        fields = response.headers.fields
        encoding = (facts.header(fields, b"content-encoding") or "").strip().lower()
        # a binary body is searched for plain spellings only (escapes_matter says why)
        binary = compiled.binary is not None and not escapes_matter(
            facts.header(fields, b"content-type") or ""
        )
        first = Scrubber(pairs, compiled=compiled.binary) if binary and compiled.binary else scrubber
        body_scrubber = _Body(first, pairs, claim, self.state, self.pairs, binary)
        decode = decoder(encoding)
        if decode is None:
            _unscannable(flow, f"no decoder for Content-Encoding {encoding[:40]!r}")
            return
        # One pass over the raw fields (the Headers mapping API decodes every name per call): the
        # values scrubbed; the length dropped (scrubbing changes it) and the coding too when the
        # body is sent decoded; HTTP/1.1 clients get chunked framing, HTTP/1.0 ones none (RFC
        # 9112 §6.1: no Transfer-Encoding toward them): the body ends with the connection.
        drop = {b"content-length"}
        if encoding not in ("", "identity"):
            drop.add(b"content-encoding")
        version = flow.request.http_version
        http1 = not version.startswith(("HTTP/2", "HTTP/3"))
        if http1:
            drop.add(b"transfer-encoding")
        kept = [(n, v) for n, v in fields if n.lower() not in drop]
        if http1 and version != "HTTP/1.0":
            kept.append((b"transfer-encoding", b"chunked"))
        response.headers.fields = tuple(kept)
        inner = response.stream if callable(response.stream) else (lambda b: b)

        failed = False

        def scrub(chunk: bytes) -> list[bytes]:
            # Killed mid-stream, mitmproxy still reads the body; the kill reaches the client when
            # it ends (HTTP/1: the connection closes without the last chunk; HTTP/2: RST_STREAM).
            nonlocal failed
            got = inner(chunk)
            raw = got if isinstance(got, bytes) else b"".join(got)
            if failed:
                return []
            try:
                data = decode(raw) if raw else decode(b"")
                out = body_scrubber.feed(data) if data else b""
                if not chunk:  # end of the body: what was held back, scrubbed
                    out += body_scrubber.finish()
            except Unscannable as e:
                failed = True
                _unscannable(flow, str(e))
                return []
            except Exception as e:  # fail closed: mitmproxy would leave the client hanging
                failed = True
                _unscannable(flow, f"the scrubber failed with {type(e).__name__}")
                return []
            # never an empty piece: an empty chunk would end a chunked HTTP/1 body early
            return [out] if out else []

        response.stream = scrub

    def response(self, flow: http.HTTPFlow) -> None:
        # trailers are sent after this hook (HTTP/2; HTTP/1 ones are dropped: addons/h1read.py)
        response = flow.response
        claim = flow.metadata.get(facts.CLAIM)
        if response is None or not response.trailers or claim is None or not claim.credentials:
            return
        try:
            for current in claims_now(claim, self.state):  # the stream may have outlived it
                pairs, compiled = self.pairs.get(current, time.time())
                _scrub_fields(response.trailers, Scrubber(pairs, compiled=compiled))
        except Exception as e:  # fail closed: trailers we cannot check are not sent
            facts.log.error("scrub.response failed with %s; trailers dropped", type(e).__name__)
            response.trailers = None

    def error(self, flow: http.HTTPFlow) -> None:
        if flow.error is None:
            return
        flow.error.msg = elide_peer_bytes(flow.error.msg)  # before the audit event reads it
        claim = flow.metadata.get(facts.CLAIM)
        if claim is None or not claim.credentials:
            return
        try:
            message = flow.error.msg.encode("utf-8", "surrogateescape")
            quoted = False
            for current in claims_now(claim, self.state):
                pairs, compiled = self.pairs.get(current, time.time())
                quoted = (
                    quoted
                    or Scrubber(pairs, compiled=compiled).scrub(message) != message
                    or any(repr(secret)[2:-1].encode() in message for secret, _ in pairs)
                )
        except Exception as e:  # fail closed: an error we cannot check is withheld
            facts.log.error("scrub.error failed with %s; error message withheld", type(e).__name__)
            quoted = True
        if quoted:
            facts.log.warning("an upstream error message quoted a credential; withheld, connection closed")
            flow.error = mflow.Error(mflow.Error.KILLED_MESSAGE)
            _close_client(flow)


def _bodiless(method: str, status: int) -> bool:
    """Whether a response has no body whatever its headers say (RFC 9112 §6.3: a response to
    HEAD, a 1xx, 204 or 304)."""
    return method.upper() == "HEAD" or 100 <= status < 200 or status in (204, 304)


def _scrub_fields(headers: http.Headers, scrubber: Scrubber) -> None:
    """Scrub header (or trailer) names (also lower-cased, as HTTP/2 sends them) and values in
    place. A placeholder is ``surr_`` and letters and digits: a valid field name where the
    secret stood."""
    fields = headers.fields
    names = b"\n".join(n for n, _ in fields)  # one search over all names: most hold nothing
    if scrubber.scrub_name(names) == names:
        headers.fields = tuple((n, scrubber.scrub(v)) for n, v in fields)
    else:
        headers.fields = tuple((scrubber.scrub_name(n), scrubber.scrub(v)) for n, v in fields)


def _scrub_head(response: http.Response, scrubber: Scrubber) -> None:
    """A response head as the sandbox gets it: the reason phrase, header names and values
    (a 101 included: its head reaches the sandbox before the WebSocket messages)."""
    response.data.reason = scrubber.scrub(response.data.reason)
    _scrub_fields(response.headers, scrubber)


def _close_client(flow: http.HTTPFlow) -> None:
    """Close the client's transport now, so nothing more is written to it (mitmproxy 12.3
    internals: proxyserver's handlers by client id, their ConnectionIO writers)."""
    server = ctx.master.addons.get("proxyserver")
    handler = getattr(server, "connections", {}).get(flow.client_conn.id)
    io = getattr(handler, "transports", {}).get(flow.client_conn)
    writer = getattr(io, "writer", None)
    if writer is not None and not writer.is_closing():
        writer.close()
