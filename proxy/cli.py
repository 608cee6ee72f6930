"""The ``surrogate`` command line (also ``python -m proxy``).

    surrogate run --rules FILE [--state-dir DIR] [--listen HOST:PORT] [--upstream-ca PEM]...
                  [--resolve NAME:ADDR]... [--audit-file PATH]
    surrogate ca export [--state-dir DIR]
    surrogate rules check FILE...
    surrogate demo init [--state-dir DIR]

The state dir (default ``$SURROGATE_STATE_DIR``, else ``~/.local/state/surrogate``) holds the
proxy's CA and the upstream trust bundle. Exit status: 0 ok, 1 error (printed as one clear
message, never a traceback), 2 usage.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import os
import secrets
import sys
from pathlib import Path

from certs import ca
from proxy import audit
from proxy.errors import HostError, SurrogateError
from proxy.hosts import canonical_host
from proxy.policy import Policy
from proxy.rules import load_rules
from proxy.state import State


def _default_state_dir() -> Path:
    env = os.environ.get("SURROGATE_STATE_DIR")
    return Path(env) if env else Path.home() / ".local" / "state" / "surrogate"


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{value!r} is not HOST:PORT (e.g. 127.0.0.1:8080)")
    return host.strip("[]") or "127.0.0.1", int(port)


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
    run.add_argument("--audit-file", type=Path, help="append audit events here (default stdout)")

    ca_p = sub.add_parser("ca", help="the proxy's CA")
    ca_sub = ca_p.add_subparsers(dest="ca_command", required=True)
    ca_sub.add_parser("export", parents=[state], help="print the CA certificate sandboxes trust")

    rules = sub.add_parser("rules", help="rules files")
    rules_sub = rules.add_subparsers(dest="rules_command", required=True)
    check = rules_sub.add_parser("check", help="validate rules files without starting anything")
    check.add_argument("files", type=Path, nargs="+")

    demo = sub.add_parser("demo", help="the embedded demo")
    demo_sub = demo.add_subparsers(dest="demo_command", required=True)
    demo_sub.add_parser(
        "init", parents=[state], help="create the demo token files rules/example.yaml reads, and the CA"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "ca":
            sys.stdout.write(ca.export_pem(args.state_dir))
            return 0
        if args.command == "rules":
            return _check(args.files)
        if args.command == "demo":
            return _demo_init(args.state_dir)
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


def _check(files: list[Path]) -> int:
    status = 0
    for f in files:
        try:
            load_rules(f)
            print(f"{f}: ok")
        except SurrogateError as e:
            print(e, file=sys.stderr)
            status = 1
    return status


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


def _run(args: argparse.Namespace) -> int:
    from proxy.engine import RunConfig, serve  # mitmproxy is imported only to serve

    policy = load_rules(args.rules)
    out = None
    if args.audit_file:
        out = open(args.audit_file, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
    audit.configure(out)
    host, port = args.listen
    config = RunConfig(
        state=State(policy, dict(args.resolve)),
        state_dir=args.state_dir,
        listen_host=host,
        listen_port=port,
        upstream_cas=args.upstream_ca,
    )
    args.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        asyncio.run(serve(config, lambda: _banner(policy, args, host, port)))
    finally:
        if out is not None:
            out.close()
    return 0


def _banner(policy: Policy, args: argparse.Namespace, host: str, port: int) -> None:
    """How to point a client at the proxy. Token values are shown as the shell expression that
    reads them ($(cat FILE) or $VAR), never as the value."""
    hostport = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    cert = ca.ca_cert_path(args.state_dir).resolve()
    lines = [
        f"surrogate: explicit proxy on {hostport}, rules {args.rules}",
        f"  trust this CA in the sandbox: {cert}",
    ]
    for claim in policy.claims.values():
        src = claim.proxy_token
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
