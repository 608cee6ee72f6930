"""addons/tlsshare.py through surrogate's TlsConfig: client-facing connections of one leaf share one
OpenSSL certificate and key (issue 19); what a client sees is unchanged, a key that does not match
the leaf is refused (the connection keeps its own), an upstream connection is left alone."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import Encoding
from mitmproxy import connection, tls
from mitmproxy.proxy import context
from mitmproxy.test import taddons
from OpenSSL import SSL

from addons import TlsConfig, tlsshare
from certs import ca

_lib: Any = SSL._lib  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    tlsshare._leaves.clear()
    tlsshare._key = None


def _context(tctx: taddons.context, sni: str) -> context.Context:
    client = connection.Client(peername=("127.0.0.1", 1), sockname=("127.0.0.1", 8080), timestamp_start=0)
    client.sni = sni
    ctx = context.Context(client, tctx.options)
    ctx.server.address = (sni, 443)
    return ctx


def _handshake(proxy: SSL.Connection, ca_pem: Path, sni: str) -> SSL.Connection:
    """A verifying client against ``proxy`` in memory; returns the client once data flows."""
    peer_ctx = SSL.Context(SSL.TLS_CLIENT_METHOD)
    peer_ctx.load_verify_locations(str(ca_pem))
    peer_ctx.set_verify(SSL.VERIFY_PEER, lambda _c, _x, _e, _d, ok: bool(ok))
    peer = SSL.Connection(peer_ctx)
    peer.set_tlsext_host_name(sni.encode())
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
    return peer


def _leaf(conn: SSL.Connection) -> Any:
    return _lib.SSL_get_certificate(conn._ssl)  # type: ignore[attr-defined]


def test_connections_of_one_leaf_share_it_and_each_handshake_completes(tmp_path: Path) -> None:
    ca_pem = ca.ensure_ca(tmp_path)
    addon = TlsConfig()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, confdir=str(ca.ca_dir(tmp_path)))
        made = []
        for sni in ("api.test", "api.test", "other.test", "api.test"):
            data = tls.TlsData((ctx := _context(tctx, sni)).client, ctx)
            addon.tls_start_client(data)
            assert data.ssl_conn is not None
            made.append(data.ssl_conn)
        entry = addon.get_cert(_context(tctx, "api.test"))  # the store's (cached) leaf for that name
    a, b, other, c = made
    assert _leaf(a) == _leaf(b) == _leaf(c)
    assert _leaf(other) != _leaf(a)
    for conn, sni in ((a, "api.test"), (b, "api.test"), (other, "other.test"), (c, "api.test")):
        peer = _handshake(conn, ca_pem, sni)
        seen = peer.get_peer_certificate(as_cryptography=True)
        assert seen is not None
        if sni == "api.test":  # the very certificate the store made, byte for byte
            assert seen.public_bytes(Encoding.DER) == entry.cert.to_cryptography().public_bytes(Encoding.DER)
        assert seen.public_key() == entry.privatekey.public_key()


def test_a_key_not_matching_the_leaf_is_refused_and_the_connection_keeps_its_own(tmp_path: Path) -> None:
    ca_pem = ca.ensure_ca(tmp_path)
    addon = TlsConfig()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, confdir=str(ca.ca_dir(tmp_path)))
        right = addon.certstore.default_privatekey
        wrong = rsa.generate_private_key(65537, 2048)
        tlsshare._key = (right, tlsshare.crypto.PKey.from_cryptography_key(wrong))
        data = tls.TlsData((ctx := _context(tctx, "api.test")).client, ctx)
        addon.tls_start_client(data)
    assert data.ssl_conn is not None
    assert _lib.ERR_peek_error() == 0  # the refusal left no error behind for the next OpenSSL call
    peer = _handshake(data.ssl_conn, ca_pem, "api.test")  # signed with the leaf's own key
    seen = peer.get_peer_certificate(as_cryptography=True)
    assert seen is not None and seen.public_key() == right.public_key()


def test_an_upstream_connection_is_left_alone(tmp_path: Path) -> None:
    ca.ensure_ca(tmp_path)
    addon = TlsConfig()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, confdir=str(ca.ca_dir(tmp_path)))
        ctx = _context(tctx, "api.test")
        data = tls.TlsData(ctx.server, ctx)
        addon.tls_start_server(data)
    assert data.ssl_conn is not None
    assert _leaf(data.ssl_conn) == SSL._ffi.NULL  # type: ignore[attr-defined]
    assert not tlsshare._leaves and tlsshare._key is None
