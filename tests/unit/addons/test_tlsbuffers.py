"""addons/tlsbuffers.py through surrogate's TlsConfig: every TLS connection it starts, toward the
client and toward the upstream, frees its record buffers while idle (SSL_MODE_RELEASE_BUFFERS),
and a client handshake still completes with it set (issue 19)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from mitmproxy import connection, tls
from mitmproxy.proxy import context
from mitmproxy.test import taddons
from OpenSSL import SSL

from addons import TlsConfig
from certs import ca


def _mode(conn: SSL.Connection) -> int:
    return int(SSL._lib.SSL_set_mode(conn._ssl, 0))  # type: ignore[attr-defined]  # ORs nothing, returns the mode


def _context(tctx: taddons.context) -> context.Context:
    client = connection.Client(peername=("127.0.0.1", 1), sockname=("127.0.0.1", 8080), timestamp_start=0)
    client.sni = "api.test"
    ctx = context.Context(client, tctx.options)
    ctx.server.address = ("api.test", 443)
    return ctx


def test_client_and_server_connections_release_buffers(tmp_path: Path) -> None:
    ca.ensure_ca(tmp_path)
    addon = TlsConfig()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, confdir=str(ca.ca_dir(tmp_path)))
        ctx = _context(tctx)
        client = tls.TlsData(ctx.client, ctx)
        addon.tls_start_client(client)
        server = tls.TlsData(ctx.server, ctx)
        addon.tls_start_server(server)
    assert client.ssl_conn is not None and server.ssl_conn is not None
    assert _mode(client.ssl_conn) & SSL.MODE_RELEASE_BUFFERS
    assert _mode(server.ssl_conn) & SSL.MODE_RELEASE_BUFFERS


def test_a_handshake_completes_with_buffers_released(tmp_path: Path) -> None:
    """Both ends in memory: the proxy's client-facing connection and a verifying client."""
    cert = ca.ensure_ca(tmp_path)
    addon = TlsConfig()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, confdir=str(ca.ca_dir(tmp_path)))
        ctx = _context(tctx)
        data = tls.TlsData(ctx.client, ctx)
        addon.tls_start_client(data)
    proxy = data.ssl_conn
    assert proxy is not None
    peer_ctx = SSL.Context(SSL.TLS_CLIENT_METHOD)
    peer_ctx.load_verify_locations(str(cert))
    peer_ctx.set_verify(SSL.VERIFY_PEER, lambda *_: True)
    peer = SSL.Connection(peer_ctx)
    peer.set_tlsext_host_name(b"api.test")
    peer.set_alpn_protos([b"http/1.1"])
    peer.set_connect_state()
    for _ in range(10):
        for a, b in ((peer, proxy), (proxy, peer)):
            with contextlib.suppress(SSL.WantReadError):
                a.do_handshake()
            while True:
                try:
                    chunk = a.bio_read(65536)
                except SSL.WantReadError:
                    break
                b.bio_write(chunk)
    peer.sendall(b"ping")
    proxy.bio_write(peer.bio_read(65536))
    assert proxy.recv(4) == b"ping"
    assert peer.get_peer_certificate() is not None
