"""``surrogate run`` (the proxy, with ``--workers N`` a supervisor of N worker processes) and
``surrogate control`` (the control API alone, as a sidecar), and the start-up banner.

Everything a worker would refuse (the rules file, the control options, a port in use, a bad
``--upstream-ca``) is checked before anything listens; errors are raised as ``SurrogateError``,
``OSError`` or ``ValueError`` and printed by :func:`proxy.cli.main.main` as one line (exit 1).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from proxy.cli import options

if TYPE_CHECKING:
    from proxy.core.policy import Policy
    from proxy.engine.master import ControlConfig
    from proxy.store import counters
    from proxy.store.fleetlimits import FleetCounters

# The parser is built for every command: the engine, the rules loader and the store are imported
# by the handlers below that use them, so a client command never loads them (issue 19).


def add_run(sub: Any, state: argparse.ArgumentParser) -> None:
    run = sub.add_parser("run", parents=[state], help="run the proxy")
    run.add_argument("--rules", type=Path, required=True, help="rules file (YAML, version: 1)")
    run.add_argument(
        "--listen",
        type=options.listen,
        default=("127.0.0.1", 8080),
        help="explicit proxy listener HOST:PORT (default 127.0.0.1:8080)",
    )
    run.add_argument(
        "--upstream-ca",
        type=Path,
        action="append",
        default=[],
        metavar="PEM",
        help="also trust this root for upstream TLS (repeatable)",
    )
    run.add_argument(
        "--resolve",
        type=options.resolve,
        action="append",
        default=[],
        metavar="NAME:ADDR",
        help="connect to ADDR for NAME, like curl --resolve (repeatable)",
    )
    options.audit_args(run)
    options.node_arg(run)
    run.add_argument(
        "--otlp-endpoint",
        metavar="URL",
        help="export one OpenTelemetry span per request over OTLP/HTTP to URL, e.g. "
        "http://127.0.0.1:4318/v1/traces (needs the otel extra)",
    )
    run.add_argument(
        "--transparent",
        type=options.listen,
        metavar="HOST:PORT",
        help="also listen for kernel-redirected (iptables/nft REDIRECT) traffic; claims by source address",
    )
    run.add_argument(
        "--workers",
        type=options.positive,
        default=options.cores(),
        help="proxy processes sharing the ports (default: one per core, %(default)s here; 1: one process)",
    )
    run.add_argument("--worker-index", type=int, help=argparse.SUPPRESS)  # set by the supervisor
    options.control_args(run)
    options.store_args(run)
    options.limit_args(run)
    run.set_defaults(handler=run_proxy)


def add_control(sub: Any, state: argparse.ArgumentParser) -> None:
    control = sub.add_parser("control", parents=[state], help="serve only the control API (sidecar)")
    control.add_argument("--rules", type=Path, required=True, help="the rules file the proxy uses")
    options.audit_args(control)
    options.node_arg(control)
    options.control_args(control)
    options.store_args(control)
    options.served_control_args(control)
    control.set_defaults(handler=control_only)


def control_config(args: argparse.Namespace) -> ControlConfig:
    """The control listeners of ``run``/``control``. Raises ValueError for ``--control-tcp``
    without a token file, a token under 16 characters, or an address that is not loopback."""
    from proxy.core.hosts import canonical_host
    from proxy.engine.master import ControlConfig

    socket_path = (
        None
        if args.control_socket == "none"
        else Path(args.control_socket or args.state_dir / "control.sock")
    )
    token = None
    if args.control_tcp is None and getattr(args, "control_tls_cert", None) is not None:
        raise ValueError("--control-tls-cert serves --control-tcp over TLS: name the listener too")
    if args.control_tcp is not None:
        if args.control_token_file is None:
            raise ValueError("--control-tcp needs --control-token-file (the operator bearer token)")
        token = args.control_token_file.read_text(encoding="utf-8").strip()
        if len(token) < 16:
            raise ValueError(f"{args.control_token_file}: the operator token must be at least 16 characters")
        host = args.control_tcp[0]
        if host.lower() == "localhost":  # bound as an address: the resolver may say anything
            host = "127.0.0.1"
        tcp = (host, args.control_tcp[1])
        tls = getattr(args, "control_tls_cert", None), getattr(args, "control_tls_key", None)
        names = [canonical_host(n) for n in getattr(args, "control_name", [])]
        if (tls[0] is None) != (tls[1] is None):
            raise ValueError("--control-tls-cert and --control-tls-key go together")
        if host not in ("127.0.0.1", "::1") and (tls[0] is None or not names):
            raise ValueError(
                "--control-tcp must be a loopback address (127.0.0.1 or ::1)"
                + ("; surrogate control serves another address only with --control-tls-cert, "
                   "--control-tls-key and --control-name" if hasattr(args, "control_name") else "")
            )  # fmt: skip
        return ControlConfig(socket_path, tcp, token, tls[0], tls[1], tuple(names))
    return ControlConfig(socket_path, args.control_tcp, token)


def supervise(args: argparse.Namespace, argv: list[str]) -> int:
    """``run --workers N`` (N > 1): check everything a worker would refuse, create the CA and the
    store once, then run N workers (proxy/engine/workers.py) and relay their audit lines."""
    from certs import ca
    from proxy import audit
    from proxy.engine import workers
    from proxy.rules.loader import load_rules
    from proxy.store import counters
    from proxy.store.choose import open_store

    policy = load_rules(args.rules)
    for warning in policy.warnings:
        print(warning, file=sys.stderr)
    node = options.node(args)
    control = control_config(args)
    args.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    ports = [args.listen, *([args.transparent] if args.transparent else [])]
    workers.check_free(ports + ([control.tcp] if control.tcp else []))
    workers.check_socket_free(control.socket_path)
    ca.ensure_ca(args.state_dir)
    ca.write_sandbox_bundle(args.state_dir, None)  # the bundle the banner names
    ca.write_upstream_bundle(args.state_dir, args.upstream_ca)  # names a bad --upstream-ca once
    open_store(args.state_dir, args.store, args.key_file, wait=False).close()
    if args.store is not None:  # the workers' fleet rows share one run id (proxy/store/fleetlimits.py)
        from proxy.store.fleetlimits import node_run

        node_run()
    table = args.state_dir / counters.FILENAME
    counters.SharedCounters.create(table, args.workers)  # empty: no count outlives the node
    shared = counters.SharedCounters.open(table, 0)
    workers.share_metrics(args.state_dir / "metrics")
    audit.configure(
        args.audit_file, args.audit_max_bytes, args.audit_backups, node=node, ocsf=args.audit_ocsf_file
    )
    try:
        return asyncio.run(
            workers.supervise(workers.worker_command(argv), args.workers, shared.release_worker)
        )
    finally:
        shared.close()


def run_proxy(args: argparse.Namespace) -> int:
    """``run`` as one process, or as worker ``--worker-index`` of a supervisor."""
    from certs import ca
    from proxy import audit
    from proxy.engine import workers
    from proxy.engine.master import RunConfig, serve  # mitmproxy is imported only to serve
    from proxy.engine.state import State
    from proxy.rules.loader import load_rules
    from proxy.store import counters
    from proxy.store.choose import open_store
    from proxy.store.registry import Registry

    worker = args.worker_index
    if worker is not None:
        workers.become_worker()
    policy = load_rules(args.rules)
    if not worker:
        for warning in policy.warnings:
            print(warning, file=sys.stderr)
    node = options.node(args)
    control = control_config(args)
    args.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    if worker is None:
        workers.check_socket_free(control.socket_path)
        ca.ensure_ca(args.state_dir)
        ca.write_sandbox_bundle(args.state_dir, None)  # the bundle the banner names
        audit.configure(
            args.audit_file, args.audit_max_bytes, args.audit_backups, node=node, ocsf=args.audit_ocsf_file
        )
    else:
        # a pipe to the supervisor, which writes and chains the one audit stream
        audit.configure(None, node=node, chain=False)
    host, port = args.listen
    table = args.state_dir / counters.FILENAME
    if worker is None:
        counters.SharedCounters.create(table, 1)  # the node is this one process
    shared = counters.SharedCounters.open(table, worker or 0)
    shared.release_worker(worker or 0)  # a worker restarted in a dead one's place starts at zero
    # a fleet node starts without its database: it refuses store claims until its first read
    with open_store(args.state_dir, args.store, args.key_file, wait=False) as store:
        fleet = _fleet_counters(shared, store, worker or 0, node) if args.store is not None else None
        config = RunConfig(
            state=State(Registry(policy, store), dict(args.resolve), counters=fleet or shared),
            state_dir=args.state_dir,
            listen_host=host,
            listen_port=port,
            upstream_cas=args.upstream_ca,
            rules=args.rules,
            control=control,
            transparent=args.transparent,
            header_timeout=args.header_timeout,
            hook_processes=args.hook_processes,
            websocket_held=args.websocket_held_bytes,
            idle_timeout=args.idle_timeout,
            http2=not args.no_http2,
            shared_ports=worker is not None,
            serve_control=not worker,
            node=node,
        )
        config.state.metrics.name_node(node)
        ready = (lambda: banner(policy, args, host, port, control)) if not worker else None
        prefix = f"[worker {worker}] " if worker is not None else ""
        stop_traces = _start_traces(args.otlp_endpoint)
        try:
            asyncio.run(serve(config, ready, prefix))
        finally:
            stop_traces()
            if fleet is not None:
                fleet.stop()
    return 0


def _fleet_counters(shared: counters.SharedCounters, store: Any, worker: int, node: str) -> FleetCounters:
    """With the PostgreSQL store, the limits' counters are the fleet's rows over the node's table
    (proxy/store/fleetlimits.py), started; SQLite runs keep the node's table alone."""
    from proxy.store.fleetlimits import FleetCounters, node_run
    from proxy.store.postgres import PostgresStore

    assert isinstance(store, PostgresStore)  # --store names only PostgreSQL (proxy/store/choose.py)
    return FleetCounters(shared, store, node_run(), worker, node).start()


def _start_traces(endpoint: str | None) -> Callable[[], None]:
    """``--otlp-endpoint``: spans from this process (proxy/engine/traces.py); the returned
    function flushes them. Without the optional packages, a clear error before serving."""
    if not endpoint:
        return lambda: None
    try:
        from proxy.engine import traces
    except ImportError as e:
        raise ValueError(
            f"--otlp-endpoint needs the OpenTelemetry SDK and its OTLP exporter ({e}): "
            "pip install 'surrogate[otel]'"
        ) from None
    return traces.start(endpoint)


def control_only(args: argparse.Namespace) -> int:
    """``control``: the control API over the same store and rules, no proxy listener."""
    from proxy import audit
    from proxy.control.service import Control
    from proxy.engine import workers
    from proxy.engine.master import serve_control_only
    from proxy.rules.loader import load_rules
    from proxy.store.choose import open_store
    from proxy.store.registry import Registry

    policy = load_rules(args.rules)
    node = options.node(args)
    control = control_config(args)
    workers.check_socket_free(control.socket_path)
    args.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    audit.configure(
        args.audit_file, args.audit_max_bytes, args.audit_backups, node=node, ocsf=args.audit_ocsf_file
    )
    with open_store(args.state_dir, args.store, args.key_file) as store:
        print(f"surrogate: control API on {control.socket_path or ''} {control.tcp or ''}", file=sys.stderr)
        service = Control(Registry(policy, store), store)
        service.metrics.name_node(node)
        asyncio.run(serve_control_only(service, control, node))
    return 0


def banner(policy: Policy, args: argparse.Namespace, host: str, port: int, control: ControlConfig) -> None:
    """How to point a client at the proxy. Token values are shown as the shell expression that
    reads them ($(cat FILE) or $VAR), never as the value. The file to trust is the bundle
    (system roots + the CA) that ``surrogate env`` names too: the CA alone fails every
    ``intercept: false`` host, whose own certificate the client sees."""
    from certs import ca
    from proxy.core.policy import SourceToken
    from proxy.rules.sources import ValueSource

    hostport = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    bundle = ca.sandbox_bundle_path(args.state_dir).resolve()
    lines = [
        f"surrogate: explicit proxy on {hostport}, rules {args.rules}"
        + (f", {args.workers} workers" if args.worker_index is not None else ""),
        f"  trust this bundle in the sandbox (system roots + surrogate's CA): {bundle}",
        f"  all of a claim's variables: surrogate env --rules {args.rules} --state-dir {args.state_dir}"
        " --claim ID",
    ]
    if control.socket_path is not None:
        lines.append(
            f"  control API: unix socket {control.socket_path} (surrogate claims/creds --state-dir ...)"
        )
    if control.tcp is not None:
        lines.append(f"  control API: http://{control.tcp[0]}:{control.tcp[1]} (Bearer operator token)")
    for claim in policy.claims.values():
        assert isinstance(claim.proxy_token, SourceToken)  # rules-file claims
        src = claim.proxy_token.source
        assert isinstance(src, ValueSource)  # a rules file's env: or file: source
        token = f"$(cat {src.ref})" if src.kind == "file" else f"${src.ref}"
        lines.append(f"  claim {claim.id} (pool {claim.pool}):")
        lines.append(f'    export HTTPS_PROXY="http://{claim.id}:{token}@{hostport}"')
        lines.append(f"    export CURL_CA_BUNDLE={bundle} SSL_CERT_FILE={bundle}")
        for c in claim.credentials:
            hosts = ", ".join(str(h) for h in c.hosts)
            lines.append(f"    placeholder {c.name}: {c.placeholder}  (bound to {hosts})")
    if not policy.claims:
        lines.append("  no claims declared in the rules file")
    print("\n".join(lines), file=sys.stderr, flush=True)
