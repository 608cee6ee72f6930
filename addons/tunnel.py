"""tunnel: inside an intercepted tunnel, only TLS and HTTP; any other bytes are refused and
audited, never relayed.

mitmproxy's next_layer addon falls back to a raw TCP layer when a connection's first bytes do
not look like HTTP (``rawtcp``, on by default: an SSH banner, a Redis ``PING``, fewer than three
bytes, a port-53 connection becomes a DNS layer), and that layer relays the bytes to the upstream
with no request, so no egress rule beyond the CONNECT's host and port, no substitution, no
audit. surrogate replaces that addon with :class:`NextLayer`, which keeps mitmproxy's decisions
everywhere else (the explicit proxy's own first layer, opaque tunnels, which policy has already
chosen, UDP) and, for an intercepted context, allows only:

- TLS, once (the tunnel's TLS, which surrogate terminates; TLS inside that TLS is refused);
  a first read of only one or two bytes of a TLS record header (``16``, ``16 03``: a ClientHello
  split over reads) waits for more, as mitmproxy reads fewer than three bytes as not TLS;
- HTTP: an HTTP ALPN was negotiated, or the first line is an HTTP/1 request line
  (``method SP target SP HTTP/x.y``, RFC 9112 §3); until that line ends (at most
  :data:`FIRST_LINE_LIMIT` bytes), the decision waits for more bytes. A connection that sends
  nothing (a protocol whose server speaks first) waits too, and ``--header-timeout`` closes it:
  no upstream connection is ever opened for it.

Anything else closes the connection without a byte relayed or answered (the protocol is not
HTTP, so no HTTP refusal would be read), and audit writes one ``tunnel`` event with reason
``not_http``. An intercepted context is any layer decision below an explicit-proxy CONNECT
(policy has set opaque ones already) and every decision in transparent mode (a redirected
connection has no CONNECT at all: its requests are its only decision points).

The same holds for the other way mitmproxy relays raw bytes: an upstream's ``101 Switching
Protocols`` to anything but WebSocket (RFC 9110 §7.8; mitmproxy then relays both directions
unparsed, past the scrubber). That response is refused in ``responseheaders``: the connection
is closed, the 101 is never sent, and the request's audit event says ``not_http``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Generator
from typing import Any

from mitmproxy import connection, http
from mitmproxy.addons import next_layer
from mitmproxy.net.tls import starts_like_tls_record
from mitmproxy.proxy import commands, events, layer, layers, mode_specs
from mitmproxy.proxy.context import Context
from mitmproxy.proxy.layers import modes
from mitmproxy.proxy.layers.http import HTTPMode
from mitmproxy.proxy.layers.tls import HTTP_ALPNS

from addons import facts
from proxy.core.decide import Reason, deny
from proxy.engine.state import State

FIRST_LINE_LIMIT = 64 * 1024  # bytes to wait for the end of an HTTP/1 request line
_REQUEST_LINE = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+ [\x21-\x7e\x80-\xff]+ HTTP/[0-9]\.[0-9]\r?\n")
_TLS_START = b"\x16\x03"  # a TLS handshake record's content type and major version
_LINE_SO_FAR = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]*( [\x21-\x7e\x80-\xff]*( [HTP/0-9.]*\r?)?)?")


def looks_like_http(data: bytes) -> bool | None:
    """True when ``data`` starts with an HTTP/1 request line, False when it cannot, None when
    the line has not ended yet and could still be one."""
    end = data.find(b"\n")
    if end >= 0:
        return _REQUEST_LINE.match(data, 0, end + 1) is not None
    if len(data) > FIRST_LINE_LIMIT or data.startswith(b"SSH-"):
        return False
    return None if _LINE_SO_FAR.fullmatch(data) else False


class _Refused(layer.Layer):
    """Close the client connection; relay nothing, answer nothing."""

    def _handle_event(self, event: events.Event) -> Generator[commands.Command, Any, None]:
        if isinstance(event, events.Start):
            yield commands.CloseConnection(self.context.client)


class NextLayer(next_layer.NextLayer):
    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state
        self.tunnels: dict[str, tuple[Any, str, int]] = {}  # client id -> (claim, host, port)

    def http_connected(self, flow: http.HTTPFlow) -> None:
        if not flow.metadata.get(facts.OPAQUE):
            host, port = flow.metadata[facts.AUTHORITY]
            self.tunnels[flow.client_conn.id] = (flow.metadata[facts.CLAIM], host, port)

    def client_disconnected(self, client: connection.Client) -> None:
        self.tunnels.pop(client.id, None)

    @facts.fail_closed
    def responseheaders(self, flow: http.HTTPFlow) -> None:
        resp = flow.response
        if resp is None or resp.status_code != 101 or _is_websocket(flow):
            return
        protocol = (resp.headers.get("upgrade") or "")[:64]
        flow.metadata[facts.DECISION] = deny(
            Reason.NOT_HTTP,
            f"the upstream switched to protocol {protocol!r}, which is neither HTTP nor WebSocket: "
            "closed, nothing relayed",
            status=502,
        )
        flow.response = None  # never sent: the audit event must not say 101
        flow.kill()

    def _next_layer(self, context: Context, data_client: bytes, data_server: bytes) -> layer.Layer | None:
        if not _intercepted(context):
            return super()._next_layer(context, data_client, data_server)
        if context.client.alpn in HTTP_ALPNS:
            return layers.HttpLayer(context, HTTPMode.transparent)
        if not context.client.tls:
            if starts_like_tls_record(data_client):
                return super()._next_layer(context, data_client, data_server)  # the tunnel's TLS
            if data_client and _TLS_START.startswith(data_client):
                raise next_layer.NeedsMoreData  # a ClientHello's first byte or two, split off
        verdict = looks_like_http(data_client) if data_client else None
        if verdict is None:
            raise next_layer.NeedsMoreData
        if verdict:
            return layers.HttpLayer(context, HTTPMode.transparent)
        self._refuse(context, data_client)
        return _Refused(context)

    def _refuse(self, context: Context, data: bytes) -> None:
        client = context.client
        claim, host, port = self.tunnels.get(client.id, (None, "", 0))
        if isinstance(client.proxy_mode, mode_specs.TransparentMode):
            peer, original = client.peername, context.server.address
            claim = self.state.registry.claim_for_source(peer[0]) if peer else None
            host, port = (str(original[0]), original[1]) if original else ("", 0)
        what = "TLS inside the tunnel's TLS" if starts_like_tls_record(data) else "not HTTP"
        decision = deny(
            Reason.NOT_HTTP,
            f"the bytes inside the intercepted connection to {host}:{port} are {what}: "
            "closed, nothing relayed",
        )
        facts.log.warning("refused non-HTTP bytes in an intercepted connection to %s:%s", host, port)
        facts.REFUSED_TUNNELS[client.id] = facts.Passthrough(claim, host, port, decision, time.time())


def _is_websocket(flow: http.HTTPFlow) -> bool:
    """mitmproxy's own test for a WebSocket upgrade (``HttpStream.send_response``)."""
    assert flow.response is not None
    upgrade = (flow.response.headers.get("upgrade") or "").lower()
    return upgrade == "websocket" and flow.request.headers.get("Sec-WebSocket-Version", "") == "13"


def _intercepted(context: Context) -> bool:
    if context.client.transport_protocol != "tcp" or not context.layers:
        return False
    first = context.layers[0]
    if isinstance(first, modes.TransparentProxy):
        return True
    return isinstance(first, modes.HttpProxy) and len(context.layers) > 1
