"""tlsshare: every client-facing TLS connection of one leaf certificate shares one OpenSSL copy of
that certificate and of its private key (issue 19).

mitmproxy's tlsconfig hands each new connection its leaf as a ``cryptography`` certificate and key
(``ssl_conn.use_certificate(entry.cert.to_cryptography())``, ``use_privatekey(entry.privatekey)``);
pyOpenSSL turns each into a fresh OpenSSL object by a DER round trip (``X509.from_cryptography``,
``PKey.from_cryptography_key``), and the connection holds both for its whole life: a parsed key
with its precomputed state, a parsed certificate. Measured: with an RSA-2048 leaf, in memory (a
server-side connection after a TLS 1.3 handshake, OpenSSL 4.0), 46.4 KiB each with its own copies,
34.1 KiB with shared ones; on bench/idle.py (1,000 tunnels, the EC P-256 CA and leaves a new state
dir gets), 62.6 → 55.6 KiB of proxy RSS per idle tunnel.

So, right after tlsconfig built the connection, :func:`share` puts back, in place of those copies,
one shared reference-counted X509 per leaf (keyed by the SHA-256 of its DER; the first connection's
copy is kept, ``X509_up_ref``) and one shared key (made once from the certificate store's key,
which mitmproxy uses for every leaf it generates). OpenSSL frees each connection's copies when
they are replaced. What the connection presents is unchanged: the same certificate bytes (equal
digest), and ``SSL_use_PrivateKey`` refuses a key that does not match the certificate in the slot
(then the connection keeps its own copy: fail safe, as before this module).

Only the client-facing connections: an upstream connection holds no certificate of ours. The
cache holds at most ``MAX_LEAVES`` leaves (oldest dropped; a dropped entry lives on in the
connections that use it, by reference count).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from mitmproxy import ctx, tls
from OpenSSL import SSL, crypto

MAX_LEAVES = 256

_lib: Any = SSL._lib  # type: ignore[attr-defined]
_ffi: Any = SSL._ffi  # type: ignore[attr-defined]
_SHA256 = _lib.EVP_get_digestbyname(b"sha256")

_leaves: OrderedDict[bytes, Any] = OrderedDict()  # DER digest → X509 * (one reference ours)
_key: tuple[object, crypto.PKey] | None = None  # (the store's key object, its OpenSSL copy)


def _digest(x509: Any) -> bytes | None:
    out = _ffi.new("unsigned char[]", _lib.EVP_MAX_MD_SIZE)
    size = _ffi.new("unsigned int *")
    if not _lib.X509_digest(x509, _SHA256, out, size):
        return None
    return bytes(_ffi.buffer(out, size[0]))


def _shared_leaf(x509: Any) -> Any:
    """The shared X509 equal to ``x509`` (which becomes it, when it is the first of its leaf)."""
    digest = _digest(x509)
    if digest is None:
        return None
    got = _leaves.get(digest)
    if got is not None:
        _leaves.move_to_end(digest)
        return got
    if not _lib.X509_up_ref(x509):
        return None
    _leaves[digest] = _ffi.gc(x509, _lib.X509_free)
    while len(_leaves) > MAX_LEAVES:
        _leaves.popitem(last=False)
    return None  # this connection's copy is the shared one now: nothing to replace


def _shared_key() -> crypto.PKey | None:
    global _key
    tlsconfig = ctx.master.addons.get("tlsconfig")
    store = getattr(tlsconfig, "certstore", None)
    if store is None:
        return None
    key = store.default_privatekey
    if _key is None or _key[0] is not key:
        _key = (key, crypto.PKey.from_cryptography_key(key))
    return _key[1]


def share(tls_start: tls.TlsData) -> None:
    """Replace the leaf and key copies of the client-facing connection tlsconfig just made by the
    shared ones. Does nothing for an upstream connection, or when anything does not match."""
    conn = tls_start.ssl_conn
    if conn is None or tls_start.conn is not tls_start.context.client:
        return
    ssl = conn._ssl
    x509 = _lib.SSL_get_certificate(ssl)
    if x509 == _ffi.NULL:
        return
    leaf = _shared_leaf(x509)
    if leaf is not None and _lib.SSL_use_certificate(ssl, leaf) != 1:
        _lib.ERR_clear_error()
        return
    key = _shared_key()
    if key is not None and _lib.SSL_use_PrivateKey(ssl, key._pkey) != 1:
        _lib.ERR_clear_error()  # not the leaf's key: the connection keeps its own copy
