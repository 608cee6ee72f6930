"""The embedded engine: a mitmproxy Master holding only surrogate's addon chain, and the control
API's listeners on the same event loop.

Options set here, and why:
- ``connection_strategy=lazy``: no upstream TCP/TLS until a request (or opaque tunnel data)
  has been allowed, so a denied CONNECT never touches the upstream.
- ``ssl_verify_upstream_trusted_ca``: the system roots plus ``--upstream-ca`` files; upstream TLS
  is always verified (``ssl_insecure`` stays off: a secret leaves only over verified TLS).
- ``confdir``: ``<state dir>/ca``, where the proxy's CA lives.
- ``tcp_timeout`` (``--idle-timeout``): mitmproxy's watchdog closes a connection on which no byte
  moved either way for that long (a quiet SSE stream counts as idle). ``http2`` (``--no-http2``):
  off, h2 is not offered in ALPN, so a sandbox cannot use HTTP/2's stream machinery at all.

Once running, the start-up heap is frozen (``gc.freeze()``): modules, mitmproxy, the rules and
the index leave the collector's generations. A busy proxy makes cyclic garbage (mitmproxy's
flows and layers), so a full collection comes every few thousand requests; it walked that whole
heap each time (~90 ms measured on the bench, issue 7) and walks only what was made since (~9 ms).

The control API runs on the proxy's event loop (its handlers are short: one SQLite transaction),
so the proxy and the API share one store connection and one index.
Its ``/readyz`` (:mod:`proxy.control.ready`) says not ready until mitmproxy's ``running`` hook
(the proxy's listeners are up), and again from the first moment of a SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import uvicorn
from mitmproxy import options
from mitmproxy.master import Master

import addons
from addons import errorpage, framing, h1read, headlimit, holdio, malformed, wslimit
from addons.reload import Reload
from certs import ca
from proxy.control.api import make_app
from proxy.control.ready import Readiness
from proxy.control.service import Control
from proxy.core.limits import DEFAULT_NODE_HOOK_PROCESSES, DEFAULT_WEBSOCKET_HELD
from proxy.engine import headers, watchdog
from proxy.engine.closing import close_on_cancel
from proxy.engine.dispatch import LeanMaster, cache_hook_args, drop_debug_typechecks
from proxy.engine.layerqueue import lazy_event_queues
from proxy.engine.reads import larger_reads
from proxy.engine.state import State
from proxy.engine.workers import SharedListeners


@dataclass(slots=True)
class ControlConfig:
    socket_path: Path | None  # the Unix socket (mode 0600); None: no socket listener
    tcp: tuple[str, int] | None = None  # loopback TCP listener, requires the operator token
    operator_token: str | None = None
    tls_cert: Path | None = None  # the TCP listener over TLS (surrogate control: uvicorn's ssl_*)
    tls_key: Path | None = None
    names: tuple[str, ...] = ()  # more Host names the TCP listener answers (a Service's)


@dataclass(slots=True)
class RunConfig:
    state: State
    state_dir: Path
    listen_host: str = "127.0.0.1"
    listen_port: int = 8080
    upstream_cas: list[Path] = field(default_factory=list)
    rules: Path | None = None  # watched for changes and reloaded on SIGHUP
    control: ControlConfig | None = None
    transparent: tuple[str, int] | None = None  # transparent listener (SO_ORIGINAL_DST, Linux)
    header_timeout: int = 60  # seconds to a complete request head (addons/limits.py)
    hook_processes: int = DEFAULT_NODE_HOOK_PROCESSES  # hook commands at once, node-wide (addons/hooks.py)
    websocket_held: int = DEFAULT_WEBSOCKET_HELD  # unfinished WebSocket bytes per process (wslimit)
    idle_timeout: int = 600  # seconds without a byte either way: mitmproxy's tcp_timeout
    http2: bool = True  # False: HTTP/1.1 only (mitmproxy's http2 option), see docs
    shared_ports: bool = False  # a --workers N worker: listen with SO_REUSEPORT (proxy/engine/workers.py)
    serve_control: bool = True  # False: the control API is another worker's (its port stays "own")
    node: str = "node"  # this node's name (--node): /readyz says it (proxy/control/ready.py)


def build_master(config: RunConfig, on_ready: Callable[[], None] | None = None) -> Master:
    """Create the Master (call inside a running event loop)."""
    config.state.own_ports = {config.listen_port}
    modes = [f"regular@{_hostport(config.listen_host, config.listen_port)}"]
    if config.transparent is not None:
        config.state.own_ports.add(config.transparent[1])
        modes.append(f"transparent@{_hostport(*config.transparent)}")
    if config.control is not None and config.control.tcp is not None:
        config.state.own_ports.add(config.control.tcp[1])
    # Wrappers of mitmproxy's protocol readers and writers. Order matters where two wrap the same
    # method: h1read wraps Http1Connection.read_body (trailers), malformed then wraps what
    # Http1Server inherits, so it must come after or its wrapper would hold the unwrapped reader.
    headlimit.install()
    h1read.install()
    framing.install()
    holdio.install()
    malformed.install()
    wslimit.install()
    errorpage.install()
    drop_debug_typechecks()
    cache_hook_args()
    headers.install()
    watchdog.install()
    close_on_cancel()
    lazy_event_queues()  # an idle tunnel's layers hold no empty deques (issue 19)
    larger_reads()  # 256 KiB per read event, not 64 KiB (proxy/engine/reads.py)
    ca.ensure_ca(config.state_dir)
    bundle = ca.write_upstream_bundle(config.state_dir, config.upstream_cas)
    opts = options.Options()
    master = LeanMaster(opts)
    chain = addons.chain(config.state)
    if config.rules is not None:
        chain.append(Reload(config.state, config.rules))
    if config.shared_ports:
        chain.append(SharedListeners(modes))
    chain.append(_FreezeHeap())
    if on_ready is not None:
        chain.append(_Ready(on_ready))
    master.addons.add(*chain)
    opts.update(
        mode=[] if config.shared_ports else modes,
        connection_strategy="lazy",
        confdir=str(ca.ca_dir(config.state_dir)),
        ssl_verify_upstream_trusted_ca=str(bundle),
        ssl_insecure=False,
        http3=False,
        # Allowed bodies are streamed by the stream addon. This bounds what mitmproxy reads into
        # memory for a refused HTTP/2 request whose length was not declared.
        stream_large_bodies="1m",
        tcp_timeout=config.idle_timeout,
        http2=config.http2,
        surrogate_header_timeout=config.header_timeout,
        surrogate_hook_processes=config.hook_processes,
        surrogate_websocket_held_bytes=config.websocket_held,
    )
    return master


def _hostport(host: str, port: int) -> str:
    # "::" means every address of both families, as on a Linux socket without IPV6_V6ONLY; asyncio
    # would bind it IPv6-only, so it becomes mitmproxy's host-less spec (one socket per family).
    if host == "::":
        return str(port)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class _FreezeHeap:
    def running(self) -> None:
        gc.collect()
        gc.freeze()


class _Ready:
    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback

    def running(self) -> None:
        self.callback()


class _ApiServer(uvicorn.Server):
    # The process's signal handlers belong to the proxy, not to uvicorn.
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _unix_socket(path: Path) -> socket.socket:
    """A listening Unix socket at ``path``, mode 0600 from birth (umask), stale file replaced."""
    with contextlib.suppress(FileNotFoundError):
        if path.is_socket():
            path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        old = os.umask(0o177)
        try:
            sock.bind(str(path))
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        sock.listen(64)
    except BaseException:
        sock.close()  # a failed bind (path too long, no such dir) leaves no descriptor behind
        raise
    return sock


def control_servers(
    control: Control, config: ControlConfig, readiness: Readiness | None = None
) -> list[tuple[_ApiServer, list[socket.socket] | None]]:
    servers: list[tuple[_ApiServer, list[socket.socket] | None]] = []
    quiet = {"log_config": None, "access_log": False, "lifespan": "off"}
    if config.socket_path is not None:
        app = make_app(control, readiness=readiness)
        servers.append((_ApiServer(uvicorn.Config(app, **quiet)), [_unix_socket(config.socket_path)]))  # type: ignore[arg-type]
    if config.tcp is not None:
        if not config.operator_token:
            raise ValueError("a TCP control listener needs an operator token (--control-token-file)")
        host, port = config.tcp
        app = make_app(
            control, config.operator_token, (host, port), readiness, config.names, bool(config.tls_cert)
        )
        tls = {"ssl_certfile": config.tls_cert, "ssl_keyfile": config.tls_key} if config.tls_cert else {}
        server = _ApiServer(uvicorn.Config(app, host=host, port=port, **quiet, **tls))  # type: ignore[arg-type]
        servers.append((server, None))
    return servers


async def serve(config: RunConfig, on_ready: Callable[[], None] | None = None, log_prefix: str = "") -> None:
    """Run the proxy (and the control API, when configured) until SIGINT or SIGTERM."""
    _log_to_stderr(log_prefix)
    registry = config.state.registry
    store = registry.store
    readiness = None if store is None else Readiness(store, config.node, listening=False, registry=registry)

    def listening() -> None:  # the proxy's listeners are up (mitmproxy's `running` hook)
        if readiness is not None:
            readiness.listening = True
        if on_ready is not None:
            on_ready()

    def shutdown() -> None:  # not ready from the first moment of a shutdown
        if readiness is not None:
            readiness.stopping = True
        master.shutdown()

    master = build_master(config, listening)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, shutdown)
    reloader = master.addons.get("reload")
    if reloader is not None:
        loop.add_signal_handler(signal.SIGHUP, reloader.reload, "sighup")
    apis = []
    if config.control is not None and config.serve_control and registry.store is not None:
        control = Control(registry, registry.store, config.state.metrics)
        apis = control_servers(control, config.control, readiness)
    tasks = [asyncio.create_task(s.serve(sockets=socks)) for s, socks in apis]
    try:
        await master.run()
    finally:
        for s, _ in apis:
            s.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)


async def serve_control_only(control: Control, config: ControlConfig, node: str) -> None:
    """``surrogate control``: the API alone, against the same store as a running proxy."""
    _log_to_stderr()
    readiness = Readiness(control.store, node)  # no proxy listener to wait for
    apis = control_servers(control, config, readiness)
    stop = asyncio.Event()

    def shutdown() -> None:
        readiness.stopping = True
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, shutdown)
    tasks = [asyncio.create_task(s.serve(sockets=socks)) for s, socks in apis]
    await stop.wait()
    for s, _ in apis:
        s.should_exit = True
    await asyncio.gather(*tasks, return_exceptions=True)


def _log_to_stderr(prefix: str = "") -> None:
    # mitmproxy and uvicorn log through `logging`; warnings and errors go to stderr as plain
    # lines. Header values and request bodies are never logged at these levels.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(prefix + "%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
