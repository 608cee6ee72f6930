"""upstreamtls: TLS session resumption toward upstreams (issue 19), only where it stays verified.

Every new sandbox connection made surrogate do a full TLS handshake toward the upstream: key
exchange plus the certificate chain parsed and verified against the system roots and
``--upstream-ca``. A resumed handshake (TLS 1.3 PSK with (EC)DHE, RFC 8446 §2.2; a TLS 1.2
ticket, RFC 5077) skips the certificate: the client trusts it because the session was
established by a handshake that verified it. So a session is reused only where that earlier
verification is the one this connection would have made:

- it was obtained from a completed handshake under ``VERIFY_PEER`` whose verify result was
  ``X509_V_OK`` (a failed or unverified handshake is never stored; ``ssl_insecure`` is never on);
- its key holds everything that verification depended on: the pyOpenSSL context (mitmproxy
  caches one per verify mode, trusted CA file and directory, client certificate, TLS versions,
  ciphers and curve, ``mitmproxy.net.tls.create_proxy_server_context``: another ``--upstream-ca``
  is another context), the SNI (the name the certificate was checked for, RFC 6125), the
  connected address and port (the pinned, policy-checked IP), and the ALPN offer;
- it belongs to one identity: the claim (id, origin, and for a store claim its generation) of
  the client connection, as identify recorded it. Decided: a session is never shared between
  claims. A session ticket is a linkable identifier, and an upstream could tell two sandboxes
  apart by it (or, with a client certificate, take one for the other); a connection whose claim
  identify does not know gets neither a session nor stores one;
- the policy in force: a rules reload (a new ``Policy`` object) starts from no sessions;
- a ticket is used once (RFC 8446 §C.4): taken from the cache when offered (a closed
  connection's), or, when the cache has none, borrowed once from an open connection of the same
  key (TLS 1.3 tickets come after the handshake, RFC 8446 §4.6.1: by then it has read its own if
  the upstream sent one); nothing runs per request; a handshake that fails drops its key's
  session. OpenSSL itself marks the session of a connection freed without close_notify not
  resumable, which is kept (such a connection's session falls back to a full handshake);
- at most ``MAX_SESSIONS`` keys (least recently stored dropped first), each at most
  ``MAX_AGE_SECONDS`` old (OpenSSL also honours the ticket's own lifetime).

Sessions live in process memory only, so a restart (a changed ``--upstream-ca``) starts empty.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from mitmproxy import connection, tls
from OpenSSL import SSL

MAX_SESSIONS = 4096
MAX_AGE_SECONDS = 3600.0
X509_V_OK = 0

# client connection id -> the identity its upstream sessions are kept under, or None (unknown)
IdentityOf = Callable[[str], Hashable | None]
# the rules in force; compared by identity, so a reload starts from no sessions
PolicyOf = Callable[[], object]


@dataclass(slots=True)
class _Stored:
    session: SSL.Session
    policy: object
    at: float


@dataclass(slots=True)
class _Open:
    key: tuple[Hashable, ...]
    policy: object
    conn: SSL.Connection
    server: connection.Server
    lent: bool = False  # its ticket was offered to another connection already


class UpstreamSessions:
    """The session cache. tlsconfig calls :meth:`offer` when it made a server connection,
    :meth:`forget` when its handshake failed, :meth:`closed` when it ended. No hook runs per
    request: a session is taken from the cache (a closed connection's) or, when there is none,
    from an open connection of the same key whose handshake verified (its ticket is read by then
    if it ever came), each ticket once."""

    def __init__(self, identity_of: IdentityOf, policy_of: PolicyOf) -> None:
        self.identity_of = identity_of
        self.policy_of = policy_of
        self._cache: OrderedDict[tuple[Hashable, ...], _Stored] = OrderedDict()
        self._open: dict[str, _Open] = {}  # server connection id -> its key, while it is open
        # key -> open server ids whose ticket was not lent yet
        self._by_key: dict[tuple[Hashable, ...], dict[str, None]] = {}
        self.offered = 0  # sessions set on a new connection (tests, bench)

    def _key(self, data: tls.TlsData) -> tuple[Hashable, ...] | None:
        server = data.conn
        if data.ssl_conn is None or data.is_dtls or server is not data.context.server:
            return None  # no connection of tlsconfig's, DTLS, or a hop through an upstream proxy
        assert isinstance(server, connection.Server)
        if server.sni is None or server.address is None:
            return None
        identity = self.identity_of(data.context.client.id)
        if identity is None:
            return None
        return (
            data.ssl_conn.get_context(),
            tuple(server.address),
            server.sni,
            tuple(server.alpn_offers),
            identity,
        )

    def offer(self, data: tls.TlsData) -> None:
        """``tls_start_server``, after tlsconfig: set a session of this connection's key (taking
        it out of the cache, or borrowing an open connection's once), and remember the key."""
        key = self._key(data)
        if key is None:
            return
        assert data.ssl_conn is not None and isinstance(data.conn, connection.Server)
        policy = self.policy_of()
        session = self._take(key, policy)
        self._open[data.conn.id] = _Open(key, policy, data.ssl_conn, data.conn)
        self._by_key.setdefault(key, {})[data.conn.id] = None
        if session is not None:
            data.ssl_conn.set_session(session)
            self.offered += 1

    def _take(self, key: tuple[Hashable, ...], policy: object) -> SSL.Session | None:
        stored = self._cache.pop(key, None)
        if stored is not None and stored.policy is policy and time.monotonic() - stored.at <= MAX_AGE_SECONDS:
            return stored.session
        for server_id in self._by_key.get(key, ()):
            if (session := _verified_session(self._open[server_id], policy)) is not None:
                self._open[server_id].lent = True
                self._unindex(key, server_id)  # lent once: never a candidate again
                return session
        return None

    def closed(self, server: connection.Server) -> None:
        """``server_disconnected``: a verified connection's session into the cache (unless its
        ticket was lent), least recently stored dropped past ``MAX_SESSIONS``."""
        opened = self._drop(server.id)
        if opened is None or opened.lent or server.error is not None:
            return
        if (session := _verified_session(opened, self.policy_of())) is None:
            return
        self._cache[opened.key] = _Stored(session, opened.policy, time.monotonic())
        self._cache.move_to_end(opened.key)
        while len(self._cache) > MAX_SESSIONS:
            self._cache.popitem(last=False)

    def forget(self, server_id: str) -> None:
        """``tls_failed_server``: nothing from it is kept, and its key's session is dropped (one
        another connection of the key stored meanwhile)."""
        if (opened := self._drop(server_id)) is not None:
            self._cache.pop(opened.key, None)

    def _drop(self, server_id: str) -> _Open | None:
        opened = self._open.pop(server_id, None)
        if opened is not None:
            self._unindex(opened.key, server_id)
        return opened

    def _unindex(self, key: tuple[Hashable, ...], server_id: str) -> None:
        ids = self._by_key.get(key)
        if ids is not None:
            ids.pop(server_id, None)
            if not ids:
                del self._by_key[key]


def _verified_session(opened: _Open, policy: object) -> SSL.Session | None:
    """The connection's session, if its handshake completed and verified the upstream under
    the rules still in force."""
    if opened.policy is not policy or not opened.server.tls_established:
        return None
    ssl = opened.conn
    # VERIFY_PEER failed the handshake on a bad chain or name; the result is checked again here
    # rather than trusted
    if SSL._lib.SSL_get_verify_result(ssl._ssl) != X509_V_OK:  # type: ignore[attr-defined]
        return None
    if ssl.get_peer_certificate() is None:
        return None
    return ssl.get_session()
