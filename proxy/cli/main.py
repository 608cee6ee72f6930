"""The ``surrogate`` command line (also ``python -m proxy``).

    surrogate run --rules FILE [--state-dir DIR] [--listen HOST:PORT] [--upstream-ca PEM]...
                  [--resolve NAME:ADDR]... [--audit-file PATH] [--workers N] [--node NAME]
                  [control listener options]
    surrogate control --rules FILE [--state-dir DIR] [--node NAME] [control listener options]
                      [--control-tls-cert PEM --control-tls-key PEM --control-name NAME...]
    surrogate claims create|list|get|delete|rotate-token ...
    surrogate creds put|patch|get|list|delete ...
    surrogate keys rotate [--state-dir DIR] [--resume]
    surrogate ca export [--state-dir DIR]
    surrogate rules check [--check-sources] FILE...
    surrogate rules explain --rules FILE --claim ID [--state-dir DIR] [--json] [--check-sources]
                            METHOD URL [-H 'N: V']...
    surrogate audit why REQUEST_ID --audit-file FILE --rules FILE [--state-dir DIR] [--json]
    surrogate audit verify FILE...   (exit 0 intact, 1 broken, 2 usage)
    surrogate demo init [--state-dir DIR]

The state dir (default ``$SURROGATE_STATE_DIR``, else ``~/.local/state/surrogate``) holds the
proxy's CA, the upstream trust bundle, the credential store and its key file, and the control
socket. Control listener options: ``--control-socket PATH`` (default ``<state dir>/control.sock``;
``none`` for no socket), ``--control-tcp HOST:PORT`` with ``--control-token-file FILE``
(loopback; ``surrogate control`` may serve another address over TLS under ``--control-name``).
``--node`` names the node in every audit event and in ``/metrics`` (default: the host name;
:mod:`proxy.core.node`).

Exit status: 0 ok, 1 error (printed as one clear message, never a traceback), 2 usage;
``rules explain`` also says its verdict: 3 deny, 4 violation, 5 error (:mod:`proxy.cli.explain`).
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import os
import secrets
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from certs import ca
from proxy import audit
from proxy.cli.explain import EXIT_HELP as EXPLAIN_EXIT_HELP
from proxy.cli.explain import main_explain
from proxy.cli.provision import render, sandbox_env
from proxy.cli.verify import add_parser as add_verify_parser
from proxy.cli.verify import main_verify
from proxy.cli.why import main_why
from proxy.control import client
from proxy.core.errors import HostError, RulesError, SurrogateError
from proxy.core.hosts import canonical_host
from proxy.core.limits import DEFAULT_NODE_HOOK_PROCESSES, DEFAULT_WEBSOCKET_HELD
from proxy.core.netrules import transparent_rules
from proxy.core.node import node_name
from proxy.core.policy import Policy, SourceToken
from proxy.engine import hardening, workers
from proxy.engine.state import State
from proxy.rules.loader import load_rules
from proxy.rules.sources import ValueSource
from proxy.store import counters
from proxy.store.registry import Registry
from proxy.store.sqlite import open_state_store

if TYPE_CHECKING:
    from proxy.engine.master import ControlConfig


def _default_state_dir() -> Path:
    env = os.environ.get("SURROGATE_STATE_DIR")
    return Path(env) if env else Path.home() / ".local" / "state" / "surrogate"


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{value!r} is not HOST:PORT (e.g. 127.0.0.1:8080)")
    return host.strip("[]") or "127.0.0.1", int(port)


def _positive(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive whole number")
    return int(value)


def _resolve(value: str) -> tuple[str, str]:
    name, sep, addr = value.partition(":")
    try:
        if not sep:
            raise ValueError
        return canonical_host(name), ipaddress.ip_address(addr.strip("[]")).compressed
    except (ValueError, HostError):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not NAME:ADDR with an IP address (e.g. api.example.com:127.0.0.1)"
        ) from None


def _node_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--node",
        metavar="NAME",
        help="this node's name in every audit event and in /metrics (default: the host name)",
    )


def _node(args: argparse.Namespace) -> str:
    """``--node``, else the host name; raises ValueError naming which was not a node name."""
    if args.node is not None:
        return node_name(args.node)
    host = socket.gethostname()
    try:
        return node_name(host)
    except ValueError as e:
        raise ValueError(f"the host name is not a node name ({e}); name this node with --node NAME") from None


def _audit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--audit-file", type=Path, help="append audit events here (default stdout)")
    p.add_argument(
        "--audit-max-bytes", type=int, default=0, help="rotate the audit file past this size (0: never)"
    )
    p.add_argument("--audit-backups", type=int, default=5, help="rotated audit files to keep (default 5)")
    p.add_argument(
        "--audit-ocsf-file",
        type=Path,
        help="also write request and tunnel events as OCSF 1.5.0 HTTP Activity here (rotated alike)",
    )


def _control_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--control-socket", help="control API Unix socket (default <state dir>/control.sock; 'none')"
    )
    p.add_argument(
        "--control-tcp",
        type=_listen,
        metavar="HOST:PORT",
        help="also serve the control API on loopback TCP (needs --control-token-file)",
    )
    p.add_argument("--control-token-file", type=Path, help="file holding the operator bearer token")


def _served_control_args(p: argparse.ArgumentParser) -> None:
    """``surrogate control`` only (never a proxy node, where sandboxes are): a TCP listener
    beyond loopback, for a cluster's Service, over TLS and under the names its clients use."""
    p.add_argument("--control-tls-cert", type=Path, metavar="PEM", help="serve --control-tcp over TLS")
    p.add_argument("--control-tls-key", type=Path, metavar="PEM", help="the key of --control-tls-cert")
    p.add_argument(
        "--control-name",
        action="append",
        default=[],
        metavar="NAME",
        help="a name clients reach --control-tcp by (its Host header), e.g. a Service's DNS name "
        "(repeatable; needed, with TLS, for an address other than loopback)",
    )


def _control_config(args: argparse.Namespace) -> ControlConfig:
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
        tls = getattr(args, "control_tls_cert", None), getattr(args, "control_tls_key", None)
        names = [canonical_host(n) for n in getattr(args, "control_name", [])]
        if (tls[0] is None) != (tls[1] is None):
            raise ValueError("--control-tls-cert and --control-tls-key go together")
        if host not in ("127.0.0.1", "::1", "localhost") and (tls[0] is None or not names):
            raise ValueError(
                "--control-tcp must be a loopback address (127.0.0.1 or ::1)"
                + ("; surrogate control serves another address only with --control-tls-cert, "
                   "--control-tls-key and --control-name" if hasattr(args, "control_name") else "")
            )  # fmt: skip
        return ControlConfig(socket_path, args.control_tcp, token, tls[0], tls[1], tuple(names))
    return ControlConfig(socket_path, args.control_tcp, token)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="surrogate", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    state = argparse.ArgumentParser(add_help=False)
    state.add_argument(
        "--state-dir",
        type=Path,
        default=_default_state_dir(),
        help="CA and trust bundle live here (default: %(default)s)",
    )

    run = sub.add_parser("run", parents=[state], help="run the proxy")
    run.add_argument("--rules", type=Path, required=True, help="rules file (YAML, version: 1)")
    run.add_argument(
        "--listen",
        type=_listen,
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
        type=_resolve,
        action="append",
        default=[],
        metavar="NAME:ADDR",
        help="connect to ADDR for NAME, like curl --resolve (repeatable)",
    )
    _audit_args(run)
    _node_arg(run)
    run.add_argument(
        "--otlp-endpoint",
        metavar="URL",
        help="export one OpenTelemetry span per request over OTLP/HTTP to URL, e.g. "
        "http://127.0.0.1:4318/v1/traces (needs the otel extra)",
    )
    run.add_argument(
        "--transparent",
        type=_listen,
        metavar="HOST:PORT",
        help="also listen for kernel-redirected (iptables/nft REDIRECT) traffic; claims by source address",
    )
    run.add_argument(
        "--workers",
        type=_positive,
        default=workers.default_count(),
        help="proxy processes sharing the ports (default: one per core, %(default)s here; 1: one process)",
    )
    run.add_argument("--worker-index", type=int, help=argparse.SUPPRESS)  # set by the supervisor
    _control_args(run)
    _limit_args(run)

    control = sub.add_parser("control", parents=[state], help="serve only the control API (sidecar)")
    control.add_argument("--rules", type=Path, required=True, help="the rules file the proxy uses")
    _audit_args(control)
    _node_arg(control)
    _control_args(control)
    _served_control_args(control)
    client.add_commands(sub, state)

    env = sub.add_parser("env", parents=[state], help="print the environment a sandbox needs (shell or .env)")
    env.add_argument("--rules", type=Path, required=True)
    env.add_argument("--claim", required=True)
    env.add_argument("--proxy", default="127.0.0.1:8080", help="HOST:PORT as the sandbox reaches the proxy")
    env.add_argument("--bundle", help="path of the trust bundle inside the sandbox (default: ca bundle's)")
    env.add_argument(
        "--token-file", type=Path, help="the claim's proxy token (needed for control-API claims)"
    )
    env.add_argument("--format", choices=["shell", "dotenv"], default="shell")

    tr = sub.add_parser("transparent-rules", help="print iptables/nftables rules that redirect a sandbox")
    tr.add_argument("--port", type=int, required=True, help="the proxy's --transparent port")
    tr.add_argument("--interface", help="the sandbox's interface (veth, bridge)")
    tr.add_argument(
        "--source",
        action="append",
        help="the sandbox's address or CIDR (repeatable, IPv4 and IPv6); with --interface or "
        "--bridge-port: the only source addresses allowed there (anti-spoof)",
    )
    tr.add_argument("--uid", type=int, help="the sandbox's user on this host")
    tr.add_argument("--proxy-uid", type=int, help="the proxy's user (required with --uid)")
    tr.add_argument(
        "--bridge-port", help="print the anti-spoof rules of one sandbox's port on a shared bridge"
    )
    tr.add_argument(
        "--resolver", action="append", default=[], help="a DNS resolver the sandbox may reach (repeatable)"
    )
    tr.add_argument(
        "--no-ipv6", action="store_true", help="the proxy has no IPv6 transparent listener: drop all IPv6"
    )
    tr.add_argument(
        "--unsafe-source-only",
        action="store_true",
        help="allow --source without --interface (a sandbox that changes its address escapes it)",
    )

    keys = sub.add_parser("keys", help="the store's encryption keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    rotate = keys_sub.add_parser(
        "rotate", parents=[state], help="re-encrypt every stored value under a new key (safe to interrupt)"
    )
    rotate.add_argument("--resume", action="store_true", help="finish an interrupted rotation, no new key")

    ca_p = sub.add_parser("ca", help="the proxy's CA")
    ca_sub = ca_p.add_subparsers(dest="ca_command", required=True)
    ca_sub.add_parser("export", parents=[state], help="print the CA certificate sandboxes trust")
    bundle = ca_sub.add_parser(
        "bundle", parents=[state], help="write system roots + surrogate's CA to one file"
    )
    bundle.add_argument("--out", type=Path, help="default: <state dir>/ca/bundle.pem")

    rules = sub.add_parser("rules", help="rules files")
    rules_sub = rules.add_subparsers(dest="rules_command", required=True)
    check = rules_sub.add_parser("check", help="validate rules files without starting anything")
    check.add_argument("files", type=Path, nargs="+")
    _sources_arg(check)
    explain = rules_sub.add_parser(
        "explain",
        help="dry-run one request through the rules: decision, rule, credentials (no network)",
        description="Dry-run one request through the rules: decision, rule, credentials (no network).",
        epilog=EXPLAIN_EXIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    explain.add_argument("--rules", type=Path, required=True, help="rules file (YAML, version: 1)")
    explain.add_argument("--claim", required=True, help="the claim that sends the request")
    explain.add_argument(
        "--state-dir", type=Path, help="also the control-API claims in this state dir's store"
    )
    explain.add_argument(
        "-H",
        "--header",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="a request header (repeatable)",
    )
    explain.add_argument("--json", action="store_true", help="print JSON instead of text")
    _sources_arg(explain)
    explain.add_argument("method", metavar="METHOD", help="e.g. GET")
    explain.add_argument("url", metavar="URL", help="http:// or https:// URL")

    audit_p = sub.add_parser("audit", help="audit events")
    audit_sub = audit_p.add_subparsers(dest="audit_command", required=True)
    why = audit_sub.add_parser(
        "why", help="print a request's audit event and explain it from the rules in force"
    )
    why.add_argument(
        "request_id", metavar="REQUEST_ID", help="from a refusal's JSON body or X-Surrogate-Request-Id"
    )
    why.add_argument("--audit-file", type=Path, required=True, help="the proxy's --audit-file")
    why.add_argument("--rules", type=Path, required=True, help="the rules file in force")
    why.add_argument("--state-dir", type=Path, help="also the control-API claims in this state dir's store")
    why.add_argument("--json", action="store_true", help="print JSON instead of text")
    add_verify_parser(audit_sub)

    demo = sub.add_parser("demo", help="the embedded demo")
    demo_sub = demo.add_subparsers(dest="demo_command", required=True)
    demo_sub.add_parser(
        "init", parents=[state], help="create the demo token files rules/example.yaml reads, and the CA"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    if args.command in ("run", "control"):  # before any secret is read: no core dump can hold one
        for problem in hardening.harden():
            print(f"surrogate: warning: {problem}", file=sys.stderr)
    try:
        if args.command == "run" and args.worker_index is None and args.workers > 1:
            return _supervise(args, argv)
        if args.command == "run":
            return _run(args)
        if args.command == "ca" and args.ca_command == "bundle":
            print(ca.write_sandbox_bundle(args.state_dir, args.out))
            return 0
        if args.command == "ca":
            sys.stdout.write(ca.export_pem(args.state_dir))
            return 0
        if args.command == "env":
            return _env(args)
        if args.command == "rules" and args.rules_command == "explain":
            return main_explain(args)
        if args.command == "rules":
            return _check(args.files, args.check_sources)
        if args.command == "audit" and args.audit_command == "verify":
            return main_verify(args)
        if args.command == "audit":
            return main_why(args)
        if args.command == "demo":
            return _demo_init(args.state_dir)
        if args.command == "control":
            return _control(args)
        if args.command == "keys":
            return _rotate_keys(args)
        if args.command == "transparent-rules":
            sys.stdout.write(
                transparent_rules(
                    args.port,
                    interface=args.interface,
                    source=args.source,
                    uid=args.uid,
                    proxy_uid=args.proxy_uid,
                    ipv6=not args.no_ipv6,
                    resolvers=args.resolver,
                    bridge_port=args.bridge_port,
                    unsafe_source_only=args.unsafe_source_only,
                )
            )
            return 0
        if args.command in ("claims", "creds"):
            return client.run_command(args)
    except SurrogateError as e:
        print(f"surrogate: {e}", file=sys.stderr)
        return 1
    except FileNotFoundError as e:
        print(f"surrogate: {e.filename}: not found", file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:
        print(f"surrogate: {e}", file=sys.stderr)
        return 1
    return 2


def _sources_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--check-sources",
        action="store_true",
        help="also read every env:/file: value source now, as 'run' does, and report one that "
        "cannot be read (by default only their form is checked: no secret is read)",
    )


def _check(files: list[Path], read_sources: bool = False) -> int:
    status = 0
    for f in files:
        try:
            policy = load_rules(f, read_secrets=read_sources)
            for w in policy.warnings:
                print(w, file=sys.stderr)
            print(f"{f}: ok" + (f" ({len(policy.warnings)} warnings)" if policy.warnings else ""))
        except RulesError as e:  # every error and warning of the file, then how many
            print(e, file=sys.stderr)
            print(f"{f}: {_count(e.problems, 'error')}, {_count(e.warnings, 'warning')}", file=sys.stderr)
            status = 1
        except SurrogateError as e:
            print(e, file=sys.stderr)
            status = 1
    return status


def _count(items: Sequence[object], what: str) -> str:
    return f"{len(items)} {what}{'' if len(items) == 1 else 's'}"


def _demo_init(state_dir: Path) -> int:
    old = os.umask(0o077)
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        fresh = {
            "demo-proxy-token": secrets.token_urlsafe(24),
            "demo-github-token": "ghp_demo" + secrets.token_hex(16),  # fake: GitHub answers 401
        }
        for name, value in fresh.items():
            path = state_dir / name
            if not path.exists():
                path.write_text(value + "\n", encoding="ascii")
    finally:
        os.umask(old)
    ca.ensure_ca(state_dir)
    return 0


def _seconds(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 86400:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of seconds in 1..86400")
    return int(text)


def _limit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--header-timeout",
        type=_seconds,
        default=60,
        metavar="S",
        help="close a client connection that has not sent a complete request head within S seconds "
        "of opening, of its CONNECT, or of its previous response (default %(default)s)",
    )
    p.add_argument(
        "--idle-timeout",
        type=_seconds,
        default=600,
        metavar="S",
        help="close a connection on which no byte moved either way for S seconds (default %(default)s)",
    )
    p.add_argument(
        "--hook-processes",
        type=_positive,
        default=DEFAULT_NODE_HOOK_PROCESSES,
        metavar="N",
        help="hook-route commands running at once on this node, all pools and workers together; "
        "a hook request past it gets 503 hook_node_limit (default %(default)s)",
    )
    p.add_argument(
        "--websocket-held-bytes",
        type=_positive,
        default=DEFAULT_WEBSOCKET_HELD,
        metavar="N",
        help="bytes of unfinished WebSocket messages one proxy process holds, all WebSockets "
        "together; the one that takes it past N is closed with 1009 (default %(default)s)",
    )
    p.add_argument(
        "--no-http2",
        action="store_true",
        help="speak only HTTP/1.1 to the sandbox (and upstream): no ALPN h2 is offered",
    )


def _supervise(args: argparse.Namespace, argv: list[str]) -> int:
    """``run --workers N`` (N > 1): check everything a worker would refuse, create the CA and the
    store once, then run N workers (proxy/engine/workers.py) and relay their audit lines."""
    policy = load_rules(args.rules)
    for warning in policy.warnings:
        print(warning, file=sys.stderr)
    node = _node(args)
    control = _control_config(args)
    args.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    ports = [args.listen, *([args.transparent] if args.transparent else [])]
    workers.check_free(ports + ([control.tcp] if control.tcp else []))
    ca.ensure_ca(args.state_dir)
    ca.write_upstream_bundle(args.state_dir, args.upstream_ca)  # names a bad --upstream-ca once
    open_state_store(args.state_dir).close()
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


def _run(args: argparse.Namespace) -> int:
    from proxy.engine.master import RunConfig, serve  # mitmproxy is imported only to serve

    worker = args.worker_index
    if worker is not None:
        workers.become_worker()
    policy = load_rules(args.rules)
    if not worker:
        for warning in policy.warnings:
            print(warning, file=sys.stderr)
    node = _node(args)
    control = _control_config(args)
    args.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    if worker is None:
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
    with open_state_store(args.state_dir) as store:
        config = RunConfig(
            state=State(Registry(policy, store), dict(args.resolve), counters=shared),
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
        ready = (lambda: _banner(policy, args, host, port, control)) if not worker else None
        prefix = f"[worker {worker}] " if worker is not None else ""
        stop_traces = _start_traces(args.otlp_endpoint)
        try:
            asyncio.run(serve(config, ready, prefix))
        finally:
            stop_traces()
    return 0


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


def _env(args: argparse.Namespace) -> int:
    policy = load_rules(args.rules)
    with open_state_store(args.state_dir) as store:
        registry = Registry(policy, store)
        registry.refresh()
        claim = registry.claim(args.claim)
        if claim is None:
            raise ValueError(f"no claim {args.claim!r} in {args.rules} or in the store")
        if args.token_file is not None:
            token = args.token_file.read_text(encoding="utf-8").strip()
        elif isinstance(claim.proxy_token, SourceToken):
            token = claim.proxy_token.source.current()[0].reveal()
        else:
            raise ValueError(
                f"claim {args.claim!r} came from the control API: pass --token-file with the token "
                "its creation returned (the store keeps only a hash)"
            )
    bundle = args.bundle or str(ca.write_sandbox_bundle(args.state_dir, None).resolve())
    sys.stdout.write(render(sandbox_env(claim, token, args.proxy, bundle), args.format))
    return 0


def _rotate_keys(args: argparse.Namespace) -> int:
    with open_state_store(args.state_dir) as store:
        count = store.rotate_keys(new_key=not args.resume)
    print(f"surrogate: {count} stored values re-encrypted under the current key")
    return 0


def _control(args: argparse.Namespace) -> int:
    from proxy.control.service import Control
    from proxy.engine.master import serve_control_only

    policy = load_rules(args.rules)
    node = _node(args)
    control = _control_config(args)
    args.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    audit.configure(
        args.audit_file, args.audit_max_bytes, args.audit_backups, node=node, ocsf=args.audit_ocsf_file
    )
    with open_state_store(args.state_dir) as store:
        print(f"surrogate: control API on {control.socket_path or ''} {control.tcp or ''}", file=sys.stderr)
        service = Control(Registry(policy, store), store)
        service.metrics.name_node(node)
        asyncio.run(serve_control_only(service, control, node))
    return 0


def _banner(policy: Policy, args: argparse.Namespace, host: str, port: int, control: ControlConfig) -> None:
    """How to point a client at the proxy. Token values are shown as the shell expression that
    reads them ($(cat FILE) or $VAR), never as the value."""
    hostport = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    cert = ca.ca_cert_path(args.state_dir).resolve()
    lines = [
        f"surrogate: explicit proxy on {hostport}, rules {args.rules}"
        + (f", {args.workers} workers" if args.worker_index is not None else ""),
        f"  trust this CA in the sandbox: {cert}",
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
        lines.append(f"    export CURL_CA_BUNDLE={cert} SSL_CERT_FILE={cert}")
        for c in claim.credentials:
            hosts = ", ".join(str(h) for h in c.hosts)
            lines.append(f"    placeholder {c.name}: {c.placeholder}  (bound to {hosts})")
    if not policy.claims:
        lines.append("  no claims declared in the rules file")
    print("\n".join(lines), file=sys.stderr, flush=True)
