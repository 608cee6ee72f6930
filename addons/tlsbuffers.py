"""tlsbuffers: OpenSSL frees a TLS connection's record buffers while they are empty (issue 19).

OpenSSL keeps a read and a write record buffer (about 17 KiB each) per connection for the
connection's whole life. With ``SSL_MODE_RELEASE_BUFFERS`` (which CPython's own ``ssl`` module
sets on every context) it frees each whenever it holds no data, so an idle connection (a
sandbox's keep-alive tunnel) holds neither. Measured on the idle-tunnel bench (bench/idle.py,
1,000 tunnels): about 83 → 62 KiB of proxy RSS per tunnel. The cost is a malloc/free pair per
read or write burst, within the noise of the request bench.

pyOpenSSL sets modes only on a Context, and mitmproxy builds each Connection from a shared,
cached Context (``mitmproxy.net.tls.create_client_proxy_context`` is an ``lru_cache``); so the
mode is set on the Connection through pyOpenSSL's binding, as mitmproxy's own tlsconfig sets its
hostname-verification flags.

The same call shares, on a client-facing connection, one OpenSSL copy of the leaf certificate and
its key among all connections of that leaf (addons/tlsshare.py).
"""

from __future__ import annotations

from mitmproxy import tls
from OpenSSL import SSL

from addons import tlsshare


def release_when_idle(tls_start: tls.TlsData) -> None:
    """Set SSL_MODE_RELEASE_BUFFERS on the connection tlsconfig just made (if it made one); share
    its leaf certificate and key (client-facing: :func:`addons.tlsshare.share`)."""
    if tls_start.ssl_conn is not None:
        SSL._lib.SSL_set_mode(tls_start.ssl_conn._ssl, SSL.MODE_RELEASE_BUFFERS)  # type: ignore[attr-defined]
        tlsshare.share(tls_start)
