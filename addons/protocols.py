"""protocols: a connection whose bytes are not HTTP is never relayed (review r3).

mitmproxy's protocol detection (``next_layer``) relays what does not look like HTTP as raw TCP
(``rawtcp``, on by default), a connection to port 53 or 5353 as DNS, and a host named in
``tcp_hosts`` as TCP, each to the connection's destination and through no HTTP hook: no claim,
no egress rule, no substitution, no audit event. Through the transparent port that was a way
out for any bytes that are not HTTP — an SSH greeting, a DNS query over TCP, non-HTTP bytes
inside an intercepted TLS connection — stopped only by the special-address check of resolve.

Decided: every layer that detection picks is HTTP or TLS (whose content is then detected in
turn), deny by default. What detection would have relayed raw is read as HTTP instead, so bytes
that are not a request get mitmproxy's 400 and the connection closes; nothing is connected
upstream. The one raw relay surrogate makes is its own choice, made before detection runs: an
opaque tunnel (policy, ``intercept: false``) or a transparent pass-through (TLS ``ignore``),
each after its rule and audited.
"""

from __future__ import annotations

from mitmproxy.addons import next_layer
from mitmproxy.proxy import layers
from mitmproxy.proxy.context import Context
from mitmproxy.proxy.layer import Layer
from mitmproxy.proxy.layers.http import HTTPMode

_DETECTED = (layers.HttpLayer, layers.ServerTLSLayer, layers.ClientTLSLayer)


class NextLayer(next_layer.NextLayer):
    """mitmproxy's detection, with every non-HTTP, non-TLS answer read as HTTP."""

    def _next_layer(self, context: Context, data_client: bytes, data_server: bytes) -> Layer | None:
        found = super()._next_layer(context, data_client, data_server)
        if found is None or isinstance(found, _DETECTED):
            return found
        if context.client.transport_protocol != "tcp":
            return None  # surrogate has no UDP listener; never relay one either
        return layers.HttpLayer(context, HTTPMode.transparent)
