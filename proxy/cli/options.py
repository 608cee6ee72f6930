"""Argument types and option groups that several ``surrogate`` commands share (argparse).

Each type raises ``argparse.ArgumentTypeError`` with a sentence naming the expected form, which
argparse prints as a usage error (exit 2).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import socket
from pathlib import Path

from proxy.core.errors import HostError
from proxy.core.hosts import canonical_host
from proxy.core.limits import DEFAULT_NODE_HOOK_PROCESSES, DEFAULT_WEBSOCKET_HELD
from proxy.core.node import node_name

# Parser-time values of modules a client command should not import (issue 19); a unit test
# (tests/unit/cli/test_lazy.py) holds each equal to its source.
BUNDLE_FORMATS = ("pem", "pkcs12")  # certs.ca.BUNDLE_FORMATS (certs.ca imports mitmproxy.certs)
EXPLAIN_EXIT_HELP = """exit status:
  0  allow (also an opaque tunnel, and report mode's would_deny)
  3  deny
  4  violation (a placeholder headed where its credential may not go)
  5  error (the proxy could not process the request)
  1  the input cannot be explained: the rules file does not load, unknown claim, bad URL or header
  2  usage error"""  # rules explain's epilog


def cores() -> int:
    """``run --workers``' default: one per core this process may run on (as
    proxy.engine.workers.default_count, which the parser does not import)."""
    count = os.process_cpu_count() if hasattr(os, "process_cpu_count") else os.cpu_count()
    return max(1, count or 1)


def plain(rst: str) -> str:
    """``rst`` (a docstring's reStructuredText) as --help shows it: roles (``:mod:`x```) and
    inline literals (````x````) become their text, so no markup reaches a terminal."""
    return _LITERAL.sub(r"\1", _ROLE.sub(r"\1", rst))


_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`~?([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")


def default_state_dir() -> Path:
    env = os.environ.get("SURROGATE_STATE_DIR")
    return Path(env) if env else Path.home() / ".local" / "state" / "surrogate"


def missing_state(state_dir: Path, what: str) -> ValueError:
    """The refusal of a command that reads the state ``surrogate run`` made (its CA, its store)
    and finds none: it names the dir and the option, and creates nothing (a new CA there would
    be one the running proxy does not sign with)."""
    which = "the default state dir" if state_dir == default_state_dir() else "the state dir given"
    create = ", or make one on purpose with 'surrogate ca init --state-dir DIR'" if what == "CA" else ""
    return ValueError(
        f"no {what} in {state_dir} ({which}): 'surrogate run --state-dir {state_dir}' creates it at "
        "its first start (make run's is .state), so start the proxy first or pass the --state-dir "
        f"it runs with{create}. Nothing was created"
    )


def state_parent() -> argparse.ArgumentParser:
    """The ``--state-dir`` option, as a parent parser for every command that uses the state dir."""
    state = argparse.ArgumentParser(add_help=False)
    state.add_argument(
        "--state-dir",
        type=Path,
        default=default_state_dir(),
        help="CA and trust bundle live here (default: %(default)s)",
    )
    return state


def listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{value!r} is not HOST:PORT (e.g. 127.0.0.1:8080)")
    return host.strip("[]") or "127.0.0.1", int(port)


def positive(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive whole number")
    return int(value)


def resolve(value: str) -> tuple[str, str]:
    name, sep, addr = value.partition(":")
    try:
        if not sep:
            raise ValueError
        return canonical_host(name), ipaddress.ip_address(addr.strip("[]")).compressed
    except (ValueError, HostError):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not NAME:ADDR with an IP address (e.g. api.example.com:127.0.0.1)"
        ) from None


def seconds(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 86400:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of seconds in 1..86400")
    return int(text)


def node_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--node",
        metavar="NAME",
        help="this node's name in every audit event and in /metrics (default: the host name)",
    )


def node(args: argparse.Namespace) -> str:
    """``--node``, else the host name; raises ValueError naming which was not a node name."""
    if args.node is not None:
        return node_name(args.node)
    host = socket.gethostname()
    try:
        return node_name(host)
    except ValueError as e:
        raise ValueError(f"the host name is not a node name ({e}); name this node with --node NAME") from None


def audit_args(p: argparse.ArgumentParser) -> None:
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


def control_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--control-socket", help="control API Unix socket (default <state dir>/control.sock; 'none')"
    )
    p.add_argument(
        "--control-tcp",
        type=listen,
        metavar="HOST:PORT",
        help="also serve the control API on loopback TCP (needs --control-token-file)",
    )
    p.add_argument("--control-token-file", type=Path, help="file holding the operator bearer token")


def store_args(p: argparse.ArgumentParser) -> None:
    # A plain string: argparse would echo a refused value (and a password in it) in its error.
    p.add_argument(
        "--store",
        metavar="URL",
        help="the credential store: postgresql://USER@HOST:PORT/DB[?password_file=PATH] for a fleet "
        "(never a password in the URL) (default: the SQLite file in the state dir)",
    )
    p.add_argument(
        "--key-file",
        type=Path,
        help="the store's key file, the same on every node (default <state dir>/store.key)",
    )


def served_control_args(p: argparse.ArgumentParser) -> None:
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


def limit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--header-timeout",
        type=seconds,
        default=60,
        metavar="S",
        help="close a client connection that has not sent a complete request head within S seconds "
        "of opening, of its CONNECT, or of its previous response (default %(default)s)",
    )
    p.add_argument(
        "--idle-timeout",
        type=seconds,
        default=600,
        metavar="S",
        help="close a connection on which no byte moved either way for S seconds (default %(default)s)",
    )
    p.add_argument(
        "--hook-processes",
        type=positive,
        default=DEFAULT_NODE_HOOK_PROCESSES,
        metavar="N",
        help="hook-route commands running at once on this node, all pools and workers together; "
        "a hook request past it gets 503 hook_node_limit (default %(default)s)",
    )
    p.add_argument(
        "--websocket-held-bytes",
        type=positive,
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
