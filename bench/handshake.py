"""New-connection cost (issue 19): N fresh connections, one request each, side by side.

Each connection is what a sandbox pays for a new HTTPS request through the proxy: TCP connect,
``CONNECT`` (with Proxy-Authorization), the client's TLS handshake under the proxy's CA (verified,
hostname checked), then ``GET /small`` and its response, during which the lazy proxy opens the
upstream TCP connection and its own TLS handshake. Direct is the TCP + TLS + request to nginx.
Timed: TCP connect → client TLS up (``tls_ms``) and → the response read (``total_ms``); and the
proxy's CPU per connection (utime+stime ÷ N).

With ``resume=True`` each connection offers the TLS session of the one before (a TLS 1.3 ticket,
RFC 8446 §2.2) and the fraction the proxy resumed is counted: a resumed handshake skips the
certificate and its signature toward the client (the upstream side is unchanged).

Targets: direct; bare mitmdump (its RSA-2048 CA); surrogate with a new state dir (an EC P-256 CA,
certs/ca.py); surrogate whose state dir holds an RSA-2048 CA made the way older surrogates made
it (mitmproxy's ``CertStore.create_store``). Run alone: ``python bench/handshake.py``.
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import socket
import ssl
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

from load import Target, cpu_seconds  # noqa: E402

RESUMED_HEADER = "X-Upstream-Resumed"  # bench/upstreams.py's nginx: $ssl_session_reused


@dataclass(frozen=True, slots=True)
class Handshakes:
    tls_ms: list[float]
    total_ms: list[float]
    cpu_us_per_conn: float | None
    resumed: int  # connections whose TLS session the proxy (or nginx) resumed
    upstream_resumed: int = 0  # connections whose upstream handshake nginx resumed (a proxy's)

    @property
    def p50(self) -> float:
        return statistics.median(self.total_ms)

    @property
    def p99(self) -> float:
        return _pct(self.total_ms, 99)

    @property
    def tls_p50(self) -> float:
        return statistics.median(self.tls_ms)


def _pct(values: list[float], p: int) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * len(s)) - 1))]  # nearest rank


def connect(target: Target, port: int) -> socket.socket:
    """A TCP socket to the upstream, through ``target``'s CONNECT tunnel when it has a proxy."""
    if target.proxy_url is None:
        raw = socket.create_connection(("127.0.0.1", port))
    else:
        raw = socket.create_connection(("127.0.0.1", target.proxy_port()))
        raw.sendall(
            f"CONNECT {target.host}:{port} HTTP/1.1\r\nHost: {target.host}:{port}\r\n"
            f"Proxy-Authorization: Basic {target.proxy_auth()}\r\n\r\n".encode()
        )
        reply = http.client.HTTPResponse(raw, method="CONNECT")
        reply.begin()
        if reply.status != 200:
            raise RuntimeError(f"{target.name} refused CONNECT: {reply.status} {reply.reason}")
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return raw


def one(
    target: Target, port: int, ctx: ssl.SSLContext, session: ssl.SSLSession | None
) -> tuple[float, float, bool, ssl.SSLSession | None, bool]:
    t0 = time.perf_counter()
    raw = connect(target, port)
    with ctx.wrap_socket(raw, server_hostname=target.host, session=session) as tls:
        t_tls = time.perf_counter()
        tls.sendall(
            f"GET /small HTTP/1.1\r\nHost: {target.host}:{port}\r\nConnection: close\r\n\r\n".encode()
        )
        resp = http.client.HTTPResponse(tls, method="GET")
        resp.begin()
        body = resp.read()
        t_end = time.perf_counter()
        if resp.status != 200 or len(body) != 100:
            raise RuntimeError(f"{target.name}: {resp.status}, {len(body)} bytes")
        upstream = resp.getheader(RESUMED_HEADER) == "r"  # nginx's $ssl_session_reused
        return (t_tls - t0) * 1000, (t_end - t0) * 1000, bool(tls.session_reused), tls.session, upstream


def run(target: Target, port: int, n: int, resume: bool) -> Handshakes:
    """``n`` sequential fresh connections through ``target``, each with one request."""
    ctx = ssl.create_default_context(cafile=str(target.ca_pem))
    ctx.set_alpn_protocols(["http/1.1"])
    tls_ms, total_ms, resumed, upstream, session = [], [], 0, 0, None
    before = cpu_seconds(target.pid) if target.pid else 0.0
    for _ in range(n):
        a, b, reused, got, up = one(target, port, ctx, session if resume else None)
        tls_ms.append(a)
        total_ms.append(b)
        resumed += reused
        upstream += up and target.proxy_url is not None
        session = got
    cpu = (cpu_seconds(target.pid) - before) / n * 1e6 if target.pid else None
    return Handshakes(tls_ms, total_ms, cpu, resumed, upstream)


def server_handshake_us(state_dir: Path, n: int = 200) -> float:
    """The proxy side's CPU for one full TLS 1.3 handshake toward a client, in process: the
    median over ``n`` in-memory handshakes (pyOpenSSL at both ends, as mitmproxy's tlsconfig
    sets up its side: ``use_certificate``, ``use_privatekey``, ``do_handshake``) of the server's
    thread CPU time. No sockets, no Python layers: what the CA's key type changes, measured away
    from the noise of the loaded machine."""
    from cryptography import x509
    from mitmproxy import certs
    from OpenSSL import SSL

    from certs import ca

    if not ca.ca_cert_path(state_dir).exists():
        raise FileNotFoundError(f"no CA in {state_dir}")
    store = certs.CertStore.from_store(ca.ca_dir(state_dir), ca.BASENAME, ca.KEY_SIZE)
    entry = store.get_cert("api.test", [x509.DNSName("api.test")])
    server_ctx = SSL.Context(SSL.TLS_SERVER_METHOD)
    client_ctx = SSL.Context(SSL.TLS_CLIENT_METHOD)
    client_ctx.load_verify_locations(str(ca.ca_cert_path(state_dir)))
    client_ctx.set_verify(SSL.VERIFY_PEER, lambda _c, _x, _e, _d, ok: bool(ok))
    spent = []
    for _ in range(n):
        used = 0.0
        t = time.thread_time()
        server = SSL.Connection(server_ctx)
        server.use_certificate(entry.cert.to_cryptography())
        server.use_privatekey(entry.privatekey)
        server.set_accept_state()
        used += time.thread_time() - t
        client = SSL.Connection(client_ctx)
        client.set_tlsext_host_name(b"api.test")
        client.set_connect_state()
        for _step in range(4):
            for side in (client, server):
                t = time.thread_time()
                with suppress(SSL.WantReadError):
                    side.do_handshake()
                if side is server:
                    used += time.thread_time() - t
                peer = server if side is client else client
                while True:
                    try:
                        peer.bio_write(side.bio_read(65536))
                    except SSL.WantReadError:
                        break
        if client.get_peer_certificate() is None or b"finished" not in client.get_state_string():
            raise RuntimeError("in-memory handshake did not complete")
        spent.append(used * 1e6)
    return statistics.median(spent)


def upstream_handshake_us(ca_pem: Path, cert_pem: Path, key_pem: Path, resume: bool, n: int = 200) -> float:
    """The proxy side's CPU for one TLS 1.3 handshake toward an upstream, in process: the median
    over ``n`` in-memory handshakes of the client's thread CPU time (pyOpenSSL at both ends; the
    client verifies the chain under ``ca_pem`` and the name, as mitmproxy's tlsconfig sets up its
    upstream side). ``resume``: each offers the session (ticket) of the one before, as
    addons/upstreamtls.py does, which skips the certificate and its verification."""
    from OpenSSL import SSL

    server_ctx = SSL.Context(SSL.TLS_SERVER_METHOD)
    server_ctx.use_certificate_chain_file(str(cert_pem))
    server_ctx.use_privatekey_file(str(key_pem))
    client_ctx = SSL.Context(SSL.TLS_CLIENT_METHOD)
    client_ctx.load_verify_locations(str(ca_pem))
    client_ctx.set_verify(SSL.VERIFY_PEER, None)
    spent, reused, session = [], 0, None
    for _ in range(n):
        t = time.thread_time()
        client = SSL.Connection(client_ctx)
        client.set_tlsext_host_name(b"api.test")
        param = SSL._lib.SSL_get0_param(client._ssl)  # type: ignore[attr-defined]
        SSL._lib.X509_VERIFY_PARAM_set1_host(param, b"api.test", 8)  # type: ignore[attr-defined]
        if resume and session is not None:
            client.set_session(session)
        client.set_connect_state()
        used = time.thread_time() - t
        server = SSL.Connection(server_ctx)
        server.set_accept_state()
        for _step in range(4):
            for side in (client, server):
                t = time.thread_time()
                with suppress(SSL.WantReadError):
                    side.do_handshake()
                if side is client:
                    with suppress(SSL.WantReadError):
                        client.recv(1)  # the NewSessionTicket, once it came
                    used += time.thread_time() - t
                peer = server if side is client else client
                while True:
                    try:
                        peer.bio_write(side.bio_read(65536))
                    except SSL.WantReadError:
                        break
        reused += bool(SSL._lib.SSL_session_reused(client._ssl))  # type: ignore[attr-defined]
        session = client.get_session()
        client.shutdown()  # a session whose connection was freed without close_notify is not resumable
        spent.append(used * 1e6)
    if resume and reused < n - 1:
        raise RuntimeError(f"only {reused} of {n} in-memory handshakes resumed")
    return statistics.median(spent)


def rsa_state_dir(workdir: Path) -> None:
    """An RSA-2048 CA in ``workdir``'s state dir, as surrogate made it before issue 19."""
    from mitmproxy import certs

    ca = workdir / "state" / "ca"
    ca.mkdir(parents=True)
    certs.CertStore.create_store(ca, "mitmproxy", 2048)


# --- standalone run ---------------------------------------------------------------------------


def _main() -> int:
    from proxies import Mitmdump, Surrogate, write_rules
    from upstreams import BenchCA, Nginx

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=100, help="connections per target and round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    proxy_cpu, load_cpu = (cpus[0], cpus[1]) if len(cpus) > 1 else (None, None)
    if load_cpu is not None:
        os.sched_setaffinity(0, {load_cpu})
    load0 = os.getloadavg()
    with ExitStack() as stack:
        tmp = Path(tempfile.mkdtemp(prefix="surrogate-bench-hs-"))
        stack.callback(shutil.rmtree, tmp, ignore_errors=True)
        ca = BenchCA(tmp)
        nginx = Nginx(tmp, ca, load_cpu).start()
        stack.callback(nginx.stop)
        rules = write_rules(tmp, [nginx.port])
        mitm = Mitmdump(tmp, ca.ca_pem, proxy_cpu).start()
        stack.callback(mitm.stop)
        ec = Surrogate("surrogate (EC CA)", tmp / "ec", rules, ca.ca_pem, proxy_cpu).start()
        stack.callback(ec.stop)
        rsa_state_dir(tmp / "rsa")
        rsa = Surrogate("surrogate (RSA CA)", tmp / "rsa", rules, ca.ca_pem, proxy_cpu).start()
        stack.callback(rsa.stop)
        direct = Target("direct", "api.test", ca.ca_pem)
        targets = [direct, mitm.target(), ec.target(), rsa.target()]
        for t in targets:  # leaf certificates, imports, first connections
            run(t, nginx.port, 5, False)
        got: dict[tuple[str, bool], list[Handshakes]] = {}
        for rnd in range(args.rounds):
            order = targets[rnd % len(targets) :] + targets[: rnd % len(targets)]
            for resume in (False, True):
                for t in order:
                    got.setdefault((t.name, resume), []).append(run(t, nginx.port, args.n, resume))
        # before the state dirs are removed (ensure_ca would make a new EC CA in an empty one)
        ec_us, rsa_us = server_handshake_us(tmp / "ec" / "state"), server_handshake_us(tmp / "rsa" / "state")
        up_full = upstream_handshake_us(ca.ca_pem, ca.cert_pem, ca.key_pem, resume=False)
        up_resumed = upstream_handshake_us(ca.ca_pem, ca.cert_pem, ca.key_pem, resume=True)
    print(
        f"{args.rounds} interleaved rounds × {args.n} connections per target; proxies on CPU {proxy_cpu}, "
        f"client and nginx on CPU {load_cpu}; load average {load0[0]:.2f} at start, "
        f"{os.getloadavg()[0]:.2f} at end"
    )
    print(render(got, [t.name for t in targets]))
    print(
        f"in process, the server side of one full TLS 1.3 handshake: EC CA {ec_us:,.0f} µs, "
        f"RSA CA {rsa_us:,.0f} µs (EC ÷ RSA {ec_us / rsa_us:.2f}×)"
    )
    print(
        f"in process, the proxy's side of one TLS 1.3 handshake toward the upstream (nginx's leaf): "
        f"full {up_full:,.0f} µs, resumed {up_resumed:,.0f} µs (resumed ÷ full {up_resumed / up_full:.2f}×)"
    )
    return 0


def render(got: dict[tuple[str, bool], list[Handshakes]], names: list[str]) -> str:
    """A markdown table: per target and mode, medians over rounds of p50/p99 and CPU."""
    lines = [
        "| target | resumption | TLS up p50 | request done p50 | p99 | ÷ mitmdump p50 "
        "| proxy CPU/conn | resumed | upstream resumed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for resume in (False, True):
        base = _med([h.p50 for h in got.get(("mitmdump", resume), [])])
        for name in names:
            hs = got.get((name, resume), [])
            if not hs:
                continue
            p50 = _med([h.p50 for h in hs])
            cpu = [h.cpu_us_per_conn for h in hs if h.cpu_us_per_conn is not None]
            n = sum(len(h.total_ms) for h in hs)
            lines.append(
                f"| {name} | {'offered' if resume else 'no'} | {_med([h.tls_p50 for h in hs]):.2f} ms "
                f"| {p50:.2f} ms | {_med([h.p99 for h in hs]):.2f} ms "
                f"| {p50 / base:.2f}× | {f'{statistics.median(cpu):,.0f} µs' if cpu else '—'} "
                f"| {sum(h.resumed for h in hs)}/{n} | {sum(h.upstream_resumed for h in hs)}/{n} |"
            )
    return "\n".join(lines)


def _med(v: list[float]) -> float:
    return statistics.median(v) if v else float("nan")


if __name__ == "__main__":
    raise SystemExit(_main())
