"""addons/upstreamtls.py through surrogate's TlsConfig, with both ends of each upstream handshake
in memory (real OpenSSL, the upstream a pyOpenSSL server under a trustme CA): a session is kept
only from a handshake whose verification succeeded, and offered only under the same key, claim
and policy (issue 19). The e2e side: tests/e2e/test_upstream_resume.py."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Hashable
from pathlib import Path

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from mitmproxy import connection, tls
from mitmproxy.proxy import context, server_hooks
from mitmproxy.test import taddons
from OpenSSL import SSL

from addons import TlsConfig
from addons.upstreamtls import UpstreamSessions


class World:
    def __init__(self, tmp: Path) -> None:
        authority = trustme.CA()
        self.ca_pem = tmp / "upstream-ca.pem"
        authority.cert_pem.write_to_path(str(self.ca_pem))
        chain = tmp / "upstream.pem"
        authority.issue_cert("api.test", "other.test").private_key_and_cert_chain_pem.write_to_path(
            str(chain)
        )
        self.server_ctx = SSL.Context(SSL.TLS_SERVER_METHOD)  # one context: one ticket key
        self.server_ctx.use_certificate_chain_file(str(chain))
        self.server_ctx.use_privatekey_file(str(chain))
        self.identities: dict[str, Hashable | None] = {}
        self.policy: list[object] = [object()]
        self.sessions = UpstreamSessions(self.identities.get, lambda: self.policy[0])
        self.addon = TlsConfig(self.sessions)
        self._conns: dict[str, SSL.Connection] = {}  # open ones stay referenced (not freed unshut)

    def connect(
        self,
        tctx: taddons.context,
        claim: str | None = "c1",
        sni: str = "api.test",
        port: int = 443,
        close: bool = True,
    ) -> tuple[bool, connection.Server]:
        """One upstream handshake, and the ticket read after it; ``close``: then ended (close_notify,
        ``server_disconnected``). (resumed, the server connection)."""
        client = connection.Client(peername=("127.0.0.1", 1), sockname=("127.0.0.1", 8080), timestamp_start=0)
        self.identities[client.id] = None if claim is None else (claim, "rules", None)
        ctx = context.Context(client, tctx.options)
        ctx.server.address = ("127.0.0.1", port)
        ctx.server.sni = sni
        data = tls.TlsData(ctx.server, ctx)
        self.addon.tls_start_server(data)
        proxy = data.ssl_conn
        assert proxy is not None
        upstream = SSL.Connection(self.server_ctx)
        upstream.set_accept_state()
        try:
            for _ in range(4):
                for side, peer in ((proxy, upstream), (upstream, proxy)):
                    with contextlib.suppress(SSL.WantReadError):
                        side.do_handshake()
                    _pump(side, peer)
            with contextlib.suppress(SSL.WantReadError):
                proxy.recv(1)  # reads the NewSessionTicket (RFC 8446 §4.6.1)
        except SSL.Error:
            self.addon.tls_failed_server(data)
            raise
        ctx.server.timestamp_tls_setup = time.time()  # as mitmproxy's tls layer marks it established
        resumed = bool(SSL._lib.SSL_session_reused(proxy._ssl))  # type: ignore[attr-defined]
        self._conns[ctx.server.id] = proxy
        if close:
            self.close(ctx.server)
        return resumed, ctx.server

    def close(self, server: connection.Server) -> None:
        # close_notify, as mitmproxy ends a connection: OpenSSL marks the session of one freed
        # without it not resumable (ssl_clear_bad_session)
        self._conns.pop(server.id).shutdown()
        self.addon.server_disconnected(server_hooks.ServerConnectionHookData(server, server))  # type: ignore[arg-type]


def _pump(src: SSL.Connection, dst: SSL.Connection) -> None:
    while True:
        try:
            dst.bio_write(src.bio_read(65536))
        except SSL.WantReadError:
            return


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def _configured(w: World, **options: object) -> contextlib.AbstractContextManager[taddons.context]:
    @contextlib.contextmanager
    def cm():  # type: ignore[no-untyped-def]
        with taddons.context(w.addon) as tctx:
            tctx.configure(w.addon, ssl_verify_upstream_trusted_ca=str(w.ca_pem), **options)
            yield tctx

    return cm()  # type: ignore[no-any-return]


def test_the_same_key_resumes_and_each_ticket_is_used_once(world: World) -> None:
    with _configured(world) as tctx:
        assert [world.connect(tctx)[0] for _ in range(3)] == [False, True, True]
    assert world.sessions.offered == 2


def test_an_open_connection_lends_its_ticket_once(world: World) -> None:
    """Keep-alive upstream connections: with none closed, a new one borrows an open verified
    one's session; each open connection's ticket is lent once, and a lent one's is not cached
    when it closes."""
    with _configured(world) as tctx:
        got = [world.connect(tctx, close=False) for _ in range(4)]
        assert [resumed for resumed, _ in got] == [False, True, True, True]
        assert world.sessions.offered == 3
        world.close(got[0][1])  # lent to the second
        assert world.sessions._cache == {}
        world.close(got[3][1])  # never lent: cached
        assert len(world.sessions._cache) == 1
        assert world.connect(tctx)[0] is True  # from the cache, and its own cached when it closed
        world.close(got[1][1])
        world.close(got[2][1])
    assert world.sessions._open == {} and world.sessions._by_key == {}  # nothing left per connection


@pytest.mark.parametrize(
    "change",
    [
        {"claim": "c2"},  # another claim
        {"claim": None},  # a connection identify knows no claim of: never offered
        {"sni": "other.test"},  # another name on the same address
        {"port": 8443},  # another address
    ],
)
def test_anything_else_in_the_key_is_a_full_handshake(world: World, change: dict[str, object]) -> None:
    with _configured(world) as tctx:
        assert world.connect(tctx)[0] is False
        assert world.connect(tctx, **change)[0] is False  # type: ignore[arg-type]
        assert world.connect(tctx)[0] is True  # the first one's session was not taken


def test_a_connection_with_no_claim_stores_nothing(world: World) -> None:
    with _configured(world) as tctx:
        world.connect(tctx, claim=None)
        world.connect(tctx, claim=None)
        assert world.sessions.offered == 0


def test_a_rules_reload_starts_from_no_sessions(world: World) -> None:
    with _configured(world) as tctx:
        world.connect(tctx)
        world.policy[0] = object()  # state.policy replaced, as a reload does
        assert world.connect(tctx)[0] is False
        assert world.connect(tctx)[0] is True


def test_another_trusted_ca_setting_is_another_context(world: World, tmp_path: Path) -> None:
    """A changed ``ssl_verify_upstream_trusted_ca`` (``--upstream-ca``) builds another pyOpenSSL
    context, which is part of the key."""
    copy = tmp_path / "same-ca-other-file.pem"
    copy.write_bytes(world.ca_pem.read_bytes())
    with _configured(world) as tctx:
        world.connect(tctx)
        tctx.configure(world.addon, ssl_verify_upstream_trusted_ca=str(copy))
        assert world.connect(tctx)[0] is False


def test_an_unverified_handshake_is_never_kept(world: World, tmp_path: Path) -> None:
    """``ssl_insecure`` (never on in surrogate) lets a handshake with an untrusted certificate
    complete; its verify result is not X509_V_OK, so its session is not kept."""
    untrusted = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(untrusted))
    with _configured(world, ssl_insecure=True) as tctx:
        tctx.configure(world.addon, ssl_verify_upstream_trusted_ca=str(untrusted))
        assert [world.connect(tctx)[0] for _ in range(3)] == [False, False, False]
    assert world.sessions.offered == 0


def test_a_failed_verification_keeps_nothing_under_the_same_key(world: World) -> None:
    """The same name, address and settings, but the upstream now shows a certificate from an
    untrusted CA: the session offered to it is gone, nothing of the failed handshake is kept,
    and the upstream under its good certificate gets a full handshake first."""
    good = world.server_ctx
    other = trustme.CA().issue_cert("api.test")
    bad = SSL.Context(SSL.TLS_SERVER_METHOD)
    bad.use_certificate(x509.load_pem_x509_certificate(other.cert_chain_pems[0].bytes()))
    bad.use_privatekey(serialization.load_pem_private_key(other.private_key_pem.bytes(), None))  # type: ignore[arg-type]
    with _configured(world) as tctx:
        assert world.connect(tctx)[0] is False
        world.server_ctx = bad
        with pytest.raises(SSL.Error):
            world.connect(tctx)
        assert world.sessions._open == {} and world.sessions._cache == {}
        world.server_ctx = good
        assert [world.connect(tctx)[0] for _ in range(2)] == [False, True]
