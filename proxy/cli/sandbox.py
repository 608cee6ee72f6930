"""What a sandbox needs from the host: ``surrogate env`` (proxy variables, trust bundles,
placeholders), ``surrogate ca export|bundle`` (the CA it must trust) and ``surrogate
transparent-rules`` (the fence that sends its traffic through the proxy).

``env``, ``ca export`` and ``ca bundle`` read the state dir ``surrogate run`` made and never
create one (``ca init`` does, on purpose): a state dir with no CA is refused, naming the dir and
``--state-dir`` (issue 18: a fresh CA under the
default state dir was printed, one the running proxy did not sign with). What a sandbox must
trust is the bundle (system roots + the CA, :func:`certs.ca.write_sandbox_bundle`), in ``env``
as in the start-up banner: the CA alone fails every ``intercept: false`` host.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from proxy.cli import options

# The parser is built for every command: certs.ca (which imports mitmproxy.certs), the rules
# loader and the store are imported by the handlers that use them (issue 19).


def add_env(sub: Any, state: argparse.ArgumentParser) -> None:
    env = sub.add_parser("env", parents=[state], help="print the environment a sandbox needs (shell or .env)")
    env.add_argument("--rules", type=Path, required=True)
    env.add_argument("--claim", required=True)
    env.add_argument("--proxy", default="127.0.0.1:8080", help="HOST:PORT as the sandbox reaches the proxy")
    env.add_argument("--bundle", help="path of the trust bundle inside the sandbox (default: ca bundle's)")
    env.add_argument(
        "--trust-store",
        help="path of the PKCS#12 trust store inside the sandbox, for the JVM (default: "
        "--bundle's with .p12 for its suffix, else ca bundle --format pkcs12's)",
    )
    env.add_argument(
        "--token-file", type=Path, help="the claim's proxy token (needed for control-API claims)"
    )
    env.add_argument("--format", choices=["shell", "dotenv"], default="shell")
    env.set_defaults(handler=print_env)


def add_transparent_rules(sub: Any) -> None:
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
    tr.set_defaults(handler=print_fence)


def add_ca(sub: Any, state: argparse.ArgumentParser) -> None:
    ca_p = sub.add_parser("ca", help="the proxy's CA")
    ca_sub = ca_p.add_subparsers(dest="ca_command", required=True)
    export = ca_sub.add_parser(
        "export", parents=[state], help="print the CA certificate alone (sandboxes trust ca bundle's file)"
    )
    export.set_defaults(handler=export_ca)
    bundle = ca_sub.add_parser(
        "bundle", parents=[state], help="write system roots + surrogate's CA to one file"
    )
    bundle.add_argument("--out", type=Path, help="default: <state dir>/ca/bundle.pem (.p12)")
    bundle.add_argument("--format", choices=options.BUNDLE_FORMATS, default="pem", help="pkcs12: for the JVM")
    bundle.set_defaults(handler=write_bundle)
    init = ca_sub.add_parser(
        "init", parents=[state], help="create the CA if absent (run does too), e.g. a fleet's one CA"
    )
    init.set_defaults(handler=init_ca)


def _require_ca(state_dir: Path) -> None:
    from certs import ca

    if not ca.ca_cert_path(state_dir).is_file():
        raise options.missing_state(state_dir, "CA")


def print_env(args: argparse.Namespace) -> int:
    """The environment of one claim. Refuses (ValueError, before reading anything) a state dir
    with no CA; reads its store only when there is one (rules-file claims need none)."""
    from certs import ca
    from proxy.cli.provision import notes, render, sandbox_env, trust_store_beside
    from proxy.core.policy import SourceToken
    from proxy.rules.loader import load_rules
    from proxy.store.registry import Registry
    from proxy.store.sqlite import STORE_FILE, open_state_store

    _require_ca(args.state_dir)
    policy = load_rules(args.rules)
    has_store = (args.state_dir / STORE_FILE).is_file()
    with open_state_store(args.state_dir, create=False) if has_store else nullcontext() as store:
        registry = Registry(policy, store)
        registry.refresh()
        claim = registry.claim(args.claim)
        if claim is None:
            where = "in the store" if has_store else f"in a store ({args.state_dir} has none)"
            raise ValueError(f"no claim {args.claim!r} in {args.rules} or {where}")
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
    jvm = (
        args.trust_store
        or trust_store_beside(args.bundle)
        or str(ca.write_sandbox_bundle(args.state_dir, None, "pkcs12").resolve())
    )
    env = sandbox_env(claim, token, args.proxy, bundle, jvm)
    sys.stdout.write(render(env, args.format, notes(bundle)))
    return 0


def export_ca(args: argparse.Namespace) -> int:
    from certs import ca

    _require_ca(args.state_dir)
    sys.stdout.write(ca.export_pem(args.state_dir))
    return 0


def init_ca(args: argparse.Namespace) -> int:
    """``ca init``: the one command besides ``run``, ``control`` and ``demo init`` that makes a CA."""
    from certs import ca

    existed = ca.ca_cert_path(args.state_dir).is_file()
    cert = ca.ensure_ca(args.state_dir)
    print(f"surrogate: CA {cert} ({'already there' if existed else 'created'})")
    return 0


def write_bundle(args: argparse.Namespace) -> int:
    from certs import ca

    _require_ca(args.state_dir)
    out = ca.write_sandbox_bundle(args.state_dir, args.out, args.format)
    if str(out) != "/dev/stdout":
        print(out)  # where it went, unless the bundle itself went to stdout
    return 0


def print_fence(args: argparse.Namespace) -> int:
    from proxy.core.netrules import transparent_rules

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
