"""The ``surrogate`` command line (also ``python -m proxy``).

    surrogate run --rules FILE [--state-dir DIR] [--listen HOST:PORT] [--upstream-ca PEM]...
                  [--resolve NAME:ADDR]... [--audit-file PATH] [--workers N] [--node NAME]
                  [control listener options]
    surrogate control --rules FILE [--state-dir DIR] [--node NAME] [control listener options]
                      [--control-tls-cert PEM --control-tls-key PEM --control-name NAME...]
    (run, control and keys rotate take --store postgresql://USER@HOST/DB and --key-file FILE)
    surrogate claims create|list|get|delete|rotate-token ...
    surrogate creds put|patch|get|list|delete ...
    surrogate keys rotate|init [--state-dir DIR] [--resume]
    surrogate ca export|bundle|init [--state-dir DIR]
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

This module assembles the parser and maps errors to exit codes; the commands live by group:
:mod:`proxy.cli.serve` (``run``, ``control``), :mod:`proxy.control.client` (``claims``,
``creds``), :mod:`proxy.cli.sandbox` (``env``, ``ca``, ``transparent-rules``),
:mod:`proxy.cli.offline` (``rules``, ``audit``), :mod:`proxy.cli.admin` (``keys``, ``demo``),
with the shared option types in :mod:`proxy.cli.options`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import proxy.control.client as client  # not `from proxy.control import`: its __getattr__ loads the service
from proxy.cli import admin, offline, options, sandbox, serve
from proxy.core.errors import SurrogateError

Handler = Callable[[argparse.Namespace], int]


def _parser() -> argparse.ArgumentParser:
    """Every command; each sets ``handler`` (argparse's ``set_defaults``), which ``main`` calls."""
    p = argparse.ArgumentParser(prog="surrogate", description=options.plain(__doc__.split("\n\n")[0]))
    sub = p.add_subparsers(dest="command", required=True)
    state = options.state_parent()
    serve.add_run(sub, state)
    serve.add_control(sub, state)
    client.add_commands(sub, state)
    for name in ("claims", "creds", "approvals"):
        sub.choices[name].set_defaults(handler=client.run_command)
    sandbox.add_env(sub, state)
    sandbox.add_transparent_rules(sub)
    admin.add_keys(sub, state)
    sandbox.add_ca(sub, state)
    offline.add_rules(sub)
    offline.add_audit(sub)
    offline.add_placeholder(sub)
    admin.add_demo(sub, state)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    if args.command in ("run", "control"):  # before any secret is read: no core dump can hold one
        from proxy.engine import hardening  # the engine package: only for run and control

        for problem in hardening.harden():
            print(f"surrogate: warning: {problem}", file=sys.stderr)
    handler: Handler = args.handler
    try:
        if args.command == "run" and args.worker_index is None and args.workers > 1:
            return serve.supervise(args, argv)
        return handler(args)
    except SurrogateError as e:
        print(f"surrogate: {e}", file=sys.stderr)
        return 1
    except FileNotFoundError as e:
        print(f"surrogate: {e.filename}: not found", file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:
        print(f"surrogate: {e}", file=sys.stderr)
        return 1
