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
mitmproxy sends them), the head of a ``101`` and, in :class:`ScrubMessages`, every WebSocket
message from the upstream.

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
"""

from __future__ import annotations

import time
from typing import Any

import wsproto.events
from mitmproxy import ctx, http
from mitmproxy import flow as mflow
from mitmproxy.proxy.layers import websocket as websocket_layer

from addons import facts
from proxy.core.decide import Reason, deny
from proxy.core.decode import Unscannable, decoder
from proxy.core.errors import SecretUnavailable
from proxy.core.policy import Claim
from proxy.core.scrub import Compiled, Scrubber, compile_pairs, escapes_matter
from proxy.engine.state import State
from proxy.store.live import live_values
from proxy.store.registry import StoreValue


def _pairs(claim: Claim, now: float) -> list[tuple[bytes, bytes]]:
    """Every live value of every credential (proxy.store.live), each with its credential's placeholder."""
    return [
        (secret.reveal().encode(), c.placeholder.encode())
        for c in claim.credentials
        for secret in live_values(c, now)
    ]


_CLAIMS_KEPT = 256
Pairs = tuple[tuple[bytes, bytes], ...]


class _PairCache:
    """``_pairs`` of each claim, kept while its values stay the same, so a claim with thousands
    of credentials does not pay a pass over them (and a hash of them all) on every response.

    A store claim's values (and its live previous ones) are fixed for the life of its Claim
    object: the registry builds a new one when the store changes. A rules-file value (``file:``
    re-read on change, ``env:``) may change under the same Claim: those credentials' current
    Secret objects are compared by identity on each use (a changed value is a new object). A
    claim with an unreadable value is not kept: the next response reads again.
    """

    def __init__(self) -> None:
        self._kept: dict[int, tuple[Claim, tuple[tuple[Any, Any], ...], Pairs, Compiled]] = {}

    def get(self, claim: Claim, now: float) -> tuple[Pairs, Compiled]:
        """The claim's (secret, placeholder) pairs and their compiled patterns."""
        entry = self._kept.get(id(claim))
        if entry is not None and entry[0] is claim:
            try:
                if all(c.secret()[0] is s for c, s in entry[1]):
                    return entry[2], entry[3]
            except SecretUnavailable:
                pass
        pairs = tuple(_pairs(claim, now))
        compiled = compile_pairs(pairs)
        volatile = []
        try:
            volatile = [(c, c.secret()[0]) for c in claim.credentials if not isinstance(c.source, StoreValue)]
        except SecretUnavailable:
            self._kept.pop(id(claim), None)
            return pairs, compiled
        if len(self._kept) >= _CLAIMS_KEPT:
            self._kept.clear()
        self._kept[id(claim)] = (claim, tuple(volatile), pairs, compiled)
        return pairs, compiled


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

    def __init__(self, first: Scrubber, pairs: Pairs, claim: Claim, state: State | None, cache: _PairCache,
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
        self.pairs = _PairCache()
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
            for current in _claims_now(claim, self.state):  # the stream may have outlived it
                pairs, compiled = self.pairs.get(current, time.time())
                _scrub_fields(response.trailers, Scrubber(pairs, compiled=compiled))
        except Exception as e:  # fail closed: trailers we cannot check are not sent
            facts.log.error("scrub.response failed with %s; trailers dropped", type(e).__name__)
            response.trailers = None

    def error(self, flow: http.HTTPFlow) -> None:
        claim = flow.metadata.get(facts.CLAIM)
        if flow.error is None or claim is None or not claim.credentials:
            return
        try:
            message = flow.error.msg.encode("utf-8", "surrogateescape")
            quoted = False
            for current in _claims_now(claim, self.state):
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


_CONTROL_PAYLOAD = 125  # bytes: a control frame's payload at most (RFC 6455 §5.5)
# client connection id -> the claim whose WebSocket it carries, and the state to read it again
# from (set in websocket_start)
_WS_CLAIMS: dict[str, tuple[Claim, State | None]] = {}


def _claims_now(claim: Claim, state: State | None) -> list[Claim]:
    """The claim a WebSocket was opened with and, when the registry holds another object for its
    id now (a store credential added or its value replaced: the registry rebuilds the claim),
    that one first. A WebSocket outlives the request that decided it; a value replaced while it
    is open may reach the upstream on another connection and come back on this one (review r4).
    Both are scrubbed with: replacing any secret by its placeholder is never worse than passing it."""
    fresh = state.registry.claim(claim.id) if state is not None else None
    return [claim] if fresh is None or fresh is claim else [fresh, claim]


_CONTROL_PAIRS = _PairCache()
_MARK = "_surrogate_scrub_control"


def _scrub_control(event: Any, scrubber: Scrubber) -> Any:
    """A ping, pong or close frame toward the sandbox, its payload or reason scrubbed (cut to
    what a control frame holds: the placeholder may be longer than the secret)."""
    if isinstance(event, wsproto.events.Ping | wsproto.events.Pong):
        return type(event)(payload=scrubber.scrub(bytes(event.payload))[:_CONTROL_PAYLOAD])
    if isinstance(event, wsproto.events.CloseConnection) and event.reason:
        reason = scrubber.scrub(event.reason.encode())[: _CONTROL_PAYLOAD - 2]
        return wsproto.events.CloseConnection(code=event.code, reason=reason.decode("utf-8", "ignore"))
    return event


def _install_control_scrub() -> None:
    """Wrap mitmproxy's ``WebsocketConnection.send2`` (once per process): the layer forwards a
    ping, pong or close frame from the upstream as it is, with no hook, so its payload is
    scrubbed where it is written to a sandbox's connection."""
    original = websocket_layer.WebsocketConnection.send2
    if getattr(original, _MARK, False):
        return

    def send2(self: Any, event: Any) -> Any:
        entry = _WS_CLAIMS.get(self.conn.id)
        if entry is not None and not isinstance(event, wsproto.events.Message):
            try:
                for claim in _claims_now(*entry):
                    pairs, compiled = _CONTROL_PAIRS.get(claim, time.time())
                    event = _scrub_control(event, Scrubber(pairs, compiled=compiled))
            except Exception as e:  # fail closed: a payload we cannot check is not sent
                facts.log.error(
                    "scrub of a WebSocket control frame failed with %s; emptied", type(e).__name__
                )
                if isinstance(event, wsproto.events.Ping | wsproto.events.Pong):
                    event = type(event)(payload=b"")
                elif isinstance(event, wsproto.events.CloseConnection):
                    event = wsproto.events.CloseConnection(code=event.code)
        return original(self, event)

    setattr(send2, _MARK, True)
    websocket_layer.WebsocketConnection.send2 = send2  # type: ignore[method-assign]


class ScrubMessages:
    """WebSocket messages from the upstream, text and binary, scrubbed whole before they are
    forwarded (mitmproxy calls ``websocket_message`` with the complete message and sends
    ``message.content`` on afterwards). This addon runs before ``stream``, which lets every
    message go from ``flow.websocket.messages``; a message is bounded by the WebSocket size
    limit, so scrubbing it whole holds nothing that is not held already. A text message stays
    valid UTF-8: a placeholder is ASCII. Escaped forms are sought in binary messages too (they
    often carry JSON or form-encoded text). Ping, pong and close frames have no hook: their
    payloads and close reasons are scrubbed where mitmproxy writes them to the sandbox
    (:func:`_install_control_scrub`). Both use the claim as it is now as well as the one the
    WebSocket was opened with (:func:`_claims_now`)."""

    def __init__(self, state: State | None = None) -> None:
        self.pairs = _PairCache()
        self.state = state  # to read the claim as it is now (_claims_now)
        _install_control_scrub()

    def websocket_start(self, flow: http.HTTPFlow) -> None:
        claim = flow.metadata.get(facts.CLAIM)
        if claim is not None and claim.credentials:
            _WS_CLAIMS[flow.client_conn.id] = (claim, self.state)

    def websocket_end(self, flow: http.HTTPFlow) -> None:
        _WS_CLAIMS.pop(flow.client_conn.id, None)

    def client_disconnected(self, client: Any) -> None:
        _WS_CLAIMS.pop(client.id, None)

    def websocket_message(self, flow: http.HTTPFlow) -> None:
        claim = flow.metadata.get(facts.CLAIM)
        if flow.websocket is None or not flow.websocket.messages or claim is None or not claim.credentials:
            return
        message = flow.websocket.messages[-1]
        if message.from_client:
            return
        try:
            content = message.content
            for current in _claims_now(claim, self.state):
                pairs, compiled = self.pairs.get(current, time.time())
                content = Scrubber(pairs, compiled=compiled).scrub(content)
            message.content = content
        except Exception as e:  # fail closed: a message we cannot check is not passed
            facts.log.error("scrub.websocket_message failed with %s; connection closed", type(e).__name__)
            message.drop()
            if flow.killable:
                flow.kill()


def _close_client(flow: http.HTTPFlow) -> None:
    """Close the client's transport now, so nothing more is written to it (mitmproxy 12.3
    internals: proxyserver's handlers by client id, their ConnectionIO writers)."""
    server = ctx.master.addons.get("proxyserver")
    handler = getattr(server, "connections", {}).get(flow.client_conn.id)
    io = getattr(handler, "transports", {}).get(flow.client_conn)
    writer = getattr(io, "writer", None)
    if writer is not None and not writer.is_closing():
        writer.close()
