"""substitute: placeholders → secrets in request heads and bodies, injections, violations.

Thin glue over :mod:`proxy.core.substitute` and :mod:`proxy.core.bodies`. It runs only on requests the
policy allowed. The head (header fields, request target) is planned by
:func:`proxy.core.substitute.substitute_request` and the outcome applied: new fields and target, a 403
refusal, or the connection closed (``terminate``).

A request body is swapped as it streams (a callable ``flow.request.stream``; the stream addon
counts what it returns). What happens to the framing:
- when a credential of the claim could be swapped in this body (``body`` surface, bound host,
  TLS) and the request has a body (:func:`proxy.core.bodies.may_have_body`), the length may change:
  ``Content-Length`` is dropped; an HTTP/1 request to an HTTP/1
  upstream is sent chunked, an HTTP/2 one ends with END_STREAM (the framing of the upstream's
  protocol is known only once its TLS is up, so ``tls_established_server`` records the
  upstream's ALPN per client connection and frames an HTTP/2 request going to an HTTP/1
  upstream as chunked);
- otherwise the body is only read for the audit (placeholders carried or refused), unchanged.
A compressed body (gzip, deflate, br, zstd) is decoded with a bound (``MAX_DECODED`` bytes),
swapped and re-encoded in its own encoding when a swap is possible (its framing is redone, see
above); when only a refusal is possible it is decoded to be checked and the client's own bytes
are forwarded unchanged under the client's own ``Content-Length`` (re-encoding them would change
their length: issue 20); in any other encoding it closes the connection (it cannot be checked).
When no swap or refusal is possible it passes undecoded. Whatever this addon does, the bytes
sent are checked against the length the head declares by :mod:`addons.framing`.

A refusal found in a body (``block`` or ``terminate``, a violation toward an unbound host, or a
secret that cannot be read) closes both connections: the request head has left, so no 403 can
be answered. Each read is checked before it is forwarded, so no byte of a refused placeholder
and nothing after it leaves; the upstream sees a truncated body (HTTP/1 chunked without its
last chunk, HTTP/2 without END_STREAM, or fewer bytes than Content-Length) and no complete request.
"""

from __future__ import annotations

import dataclasses
import time

from mitmproxy import connection, ctx, http, tls

from addons import facts
from proxy.core import bodies
from proxy.core.decide import Decision, Reason, deny
from proxy.core.policy import Claim, Credential
from proxy.core.substitute import BodyRefused, BodyResolver, Outcome, substitute_request
from proxy.engine.state import State


def _close(flow: http.HTTPFlow) -> None:
    """Abort the client and upstream connections of ``flow`` now, mid-body.

    mitmproxy cannot kill a flow in transit (mitmproxy issue 4711), and closing a connection
    through its handler only cancels a task: the HTTP layer would still write the end of the
    body (HTTP/1 last chunk, HTTP/2 END_STREAM) before that runs, completing a truncated
    request. Aborting the transport drops whatever is unsent and makes every later write a no-op.
    """
    server = ctx.master.addons.get("proxyserver")
    handler = server.connections.get(flow.client_conn.id) if server is not None else None
    if handler is None:
        return
    for conn in (flow.server_conn, flow.client_conn):
        io = handler.transports.get(conn)
        if io is None:
            continue
        transport = getattr(io.writer, "transport", None)
        if transport is not None:
            transport.abort()
        handler.close_connection(conn)


# Check only (nothing swappable): the most client bytes held back while the decoded tail may
# still become a placeholder. The tail is at most 69 decoded bytes, so only reads that decode to
# (almost) nothing pile up here: past this the body is refused.
_CHECK_HOLD_LIMIT = 1024 * 1024


class _Stalled(Exception):
    """More than ``_CHECK_HOLD_LIMIT`` client bytes held without the decoded tail resolving."""


class Substitute:
    def __init__(self, state: State, max_decoded: int = bodies.MAX_DECODED) -> None:
        self.state = state
        self.max_decoded = max_decoded
        # by client connection id: the upstream's ALPN once its TLS is up, and the HTTP/2
        # requests whose body length may change that wait for it
        self.upstream_alpn: dict[str, bytes] = {}
        self.pending: dict[str, list[http.HTTPFlow]] = {}

    @facts.fail_closed
    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error or facts.HOOK in flow.metadata:  # answered here: nothing to swap
            return
        allowed = flow.metadata.get(facts.DECISION)
        if allowed is None or not allowed.allowed:  # never swap on a flow the policy did not allow
            raise RuntimeError("substitute reached without an allow decision")
        claim = flow.metadata[facts.CLAIM]
        req = flow.request
        host = flow.metadata[facts.HOST]
        tls_ = req.scheme == "https"
        now = time.time()
        outcome = substitute_request(
            req.headers.fields, req.data.path, host, tls_, claim.by_placeholder, claim.injections, now
        )
        _facts(flow, outcome)
        if outcome.unavailable is not None:
            facts.log.warning("credential unavailable: %s", outcome.unavailable)
        if outcome.refusal is not None:
            refusal = dataclasses.replace(outcome.refusal, rule=allowed.rule)  # keep the allowing rule
            if outcome.terminate:
                flow.metadata[facts.DECISION] = refusal
                flow.kill()
            else:
                facts.refuse(flow, refusal)
            return
        if outcome.used and (spent := self.state.registry.spend(claim, list(outcome.used))):
            message = f"credential {spent!r} has used up its request budget (max_requests); nothing was sent"
            facts.refuse(flow, deny(Reason.CREDENTIAL_BUDGET_SPENT, message, rule=allowed.rule))
            return
        if outcome.fields is not None:
            req.headers.fields = tuple(outcome.fields)
        if outcome.target is not None:
            req.data.path = outcome.target
        flow.metadata.setdefault(facts.USED, {}).update(outcome.used)  # addons/sigv4.py may have signed
        if outcome.used:
            self.state.registry.record_use(claim, list(outcome.used), now)
        # a body that addons/sigv4.py signs (hashed whole, or re-signed chunk by chunk) is not
        # swapped: a swap would break its signature
        signs_body = "surrogate.sigv4_hold" in flow.metadata or "surrogate.sigv4_streamed" in flow.metadata
        if claim.by_placeholder and not _bodiless(req) and not signs_body:
            how = bodies.kind(req.headers.get("content-type", ""))
            counted = set(outcome.used)  # the head's swaps were counted against budgets above

            def spend(c: Credential) -> bool:
                return c.name in counted or self.state.registry.spend(claim, [c.name]) is None

            self._body(flow, BodyResolver(claim.by_placeholder, host, tls_, how, now, spend))

    def _body(self, flow: http.HTTPFlow, resolver: BodyResolver) -> None:
        req = flow.request
        claim: Claim = flow.metadata[facts.CLAIM]
        swaps = resolver.may_swap(claim.body)
        acts = swaps or resolver.may_refuse(claim.refusing)
        encoding = req.headers.get("content-encoding", "").strip().lower()
        if encoding not in ("", "identity") and not acts:
            return  # nothing to swap or refuse: the audit does not pay for decoding
        decode = bodies.decoder(encoding, self.max_decoded)
        if decode is None:
            why = f"request body in content-encoding {encoding!r} cannot be checked for placeholders"
            facts.refuse(flow, deny(Reason.BAD_REQUEST_BODY, why, status=415))
            return
        encode = bodies.encoder(encoding)
        has_body = bodies.may_have_body(
            req.http_version,
            req.method,
            req.headers.get("content-length"),
            "transfer-encoding" in req.headers,
        )
        if swaps and has_body:
            self._reframe(flow)
        swapper = bodies.Swapper(resolver)
        claim = flow.metadata[facts.CLAIM]
        done = [False]
        pending: list[bytes] = []  # check only: client bytes held while a placeholder may be forming

        def swap(chunk: bytes) -> bytes:
            sent: list[bytes] = []
            # piece by piece: a small compressed read may decode to a great deal
            for piece in decode(chunk):
                out = swapper.feed(piece)
                sent.append(encode(out) if out else b"")
            if not chunk:
                out = swapper.finish()
                sent += [encode(out) if out else b"", encode(b"")]
                self._finish(flow, claim, resolver.outcome)
            return b"".join(sent)

        def check(chunk: bytes) -> bytes:
            # Nothing can be swapped in this coded body (the resolver only carries or refuses), so
            # the client's own bytes go on, under the client's own framing: re-encoding would
            # change them and their length (issue 20). A read is held while the decoded tail may
            # still become a placeholder, so no byte of a refused one leaves.
            for piece in decode(chunk):
                swapper.feed(piece)
            if chunk:
                pending.append(chunk)
            else:
                swapper.finish()
                self._finish(flow, claim, resolver.outcome)
            if chunk and swapper.held:
                if sum(map(len, pending)) > _CHECK_HOLD_LIMIT:
                    raise _Stalled
                return b""
            out = b"".join(pending)
            pending.clear()
            return out

        # identity without a swap: the swapper hands back the very bytes it was fed (holding only
        # a tail that may become a placeholder), so only a coded body needs whole reads held
        step = swap if swaps or encoding in ("", "identity") else check

        def stream(chunk: bytes) -> list[bytes]:
            if done[0]:
                return []  # refused: nothing more leaves
            try:
                joined = step(chunk)
            except BodyRefused as e:
                done[0] = True
                self._refused(flow, e.outcome)
                return []
            except (bodies.TooLarge, bodies.BadEncoding, _Stalled) as e:
                done[0] = True
                if isinstance(e, bodies.TooLarge):
                    why = f"request body decodes to more than {self.max_decoded} bytes"
                elif isinstance(e, _Stalled):
                    why = f"request body holds {_CHECK_HOLD_LIMIT} bytes that decode to almost nothing"
                else:
                    why = f"request body is not valid {encoding}"
                self._refused(flow, Outcome(refusal=deny(Reason.BAD_REQUEST_BODY, why, status=413)))
                return []
            except Exception as e:  # fail closed here too: mitmproxy would crash the connection's layer
                done[0] = True
                facts.log.error("request body check failed with %s", type(e).__name__)
                failed = deny(
                    Reason.INTERNAL_ERROR, "surrogate could not check this request body", status=400
                )
                self._refused(flow, Outcome(refusal=failed))
                return []
            # never an empty piece: an empty chunk would end a chunked HTTP/1 body early
            return [joined] if joined else []

        req.stream = stream

    def _reframe(self, flow: http.HTTPFlow) -> None:
        req = flow.request
        req.headers.pop("content-length", None)
        if not (req.is_http2 or req.is_http3):
            req.headers["transfer-encoding"] = "chunked"
            return
        # mitmproxy frames an HTTP/2 request toward an HTTP/1 upstream by this header (and drops
        # it toward an HTTP/2 one); which one it is, the upstream's TLS says (ALPN).
        cid = flow.client_conn.id
        if cid in self.upstream_alpn:
            if self.upstream_alpn[cid] != b"h2":
                req.headers["transfer-encoding"] = "chunked"
        else:
            self.pending.setdefault(cid, []).append(flow)

    def tls_established_server(self, data: tls.TlsData) -> None:
        # One client connection (one CONNECT tunnel) reaches one upstream authority.
        cid = data.context.client.id
        self.upstream_alpn[cid] = data.conn.alpn or b""
        for flow in self.pending.pop(cid, []):
            if self.upstream_alpn[cid] != b"h2":
                flow.request.headers["transfer-encoding"] = "chunked"

    def client_disconnected(self, client: connection.Client) -> None:
        self.pending.pop(client.id, None)
        self.upstream_alpn.pop(client.id, None)

    def _finish(self, flow: http.HTTPFlow, claim: Claim, outcome: Outcome) -> None:
        if outcome.used:
            flow.metadata.setdefault(facts.USED, {}).update(outcome.used)
            self.state.registry.record_use(claim, list(outcome.used), time.time())
        _facts(flow, outcome)

    def _refused(self, flow: http.HTTPFlow, outcome: Outcome) -> None:
        allowed: Decision = flow.metadata[facts.DECISION]
        assert outcome.refusal is not None
        flow.metadata[facts.DECISION] = dataclasses.replace(outcome.refusal, rule=allowed.rule)
        _facts(flow, outcome)
        if outcome.unavailable is not None:
            facts.log.warning("credential unavailable: %s", outcome.unavailable)
        facts.log.warning(
            "request %s: %s; connection closed",
            flow.metadata.get(facts.REQUEST_ID, flow.id),
            outcome.refusal.reason.value,
        )
        _close(flow)


def _bodiless(req: http.Request) -> bool:
    """Whether the head alone shows there is no body to check: HTTP/1 without Content-Length and
    Transfer-Encoding (RFC 9112 §6.3: length zero), or ``Content-Length: 0`` in any version
    (HTTP/2 DATA past it is a stream error, RFC 9113 §8.1.1). An HTTP/2 head without a length
    may still be followed by DATA, whatever the method: its body is checked."""
    fields = req.headers.fields
    length = facts.header(fields, b"content-length")
    if length is not None:
        return length.strip() == "0"
    return req.http_version.startswith("HTTP/1") and facts.header(fields, b"transfer-encoding") is None


def _facts(flow: http.HTTPFlow, outcome: Outcome) -> None:
    """Merge what ``outcome`` carried and refused into the flow's audit facts."""
    carried: list[str] = flow.metadata.setdefault(facts.CARRIED, [])
    carried += [n for n in outcome.carried if n not in carried]
    carried_on: list[tuple[str, str]] = flow.metadata.setdefault(facts.CARRIED_ON, [])
    carried_on += [c for c in outcome.carried_on if c not in carried_on]
    if outcome.violated is not None:
        flow.metadata[facts.VIOLATED] = outcome.violated
        flow.metadata[facts.VIOLATION_SURFACE] = outcome.violation_surface
