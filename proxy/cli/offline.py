"""Commands that read files and start nothing: ``surrogate rules check``, ``surrogate rules
explain`` (answered by :mod:`proxy.cli.explain`), ``surrogate audit why`` (:mod:`proxy.cli.why`)
``surrogate audit verify`` (:mod:`proxy.cli.verify`) and ``surrogate placeholder mint|templates``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from proxy.cli.options import EXPLAIN_EXIT_HELP
from proxy.cli.verify import add_parser as add_verify_parser
from proxy.core import templates

# The parser is built for every command: the rules loader (and the Public Suffix List it reads)
# and the dry run are imported by the handlers (issue 19).


def main_explain(args: argparse.Namespace) -> int:
    from proxy.cli.explain import main_explain

    return main_explain(args)


def main_why(args: argparse.Namespace) -> int:
    from proxy.cli.why import main_why

    return main_why(args)


def main_verify(args: argparse.Namespace) -> int:
    from proxy.cli.verify import main_verify

    return main_verify(args)


def add_rules(sub: Any) -> None:
    rules = sub.add_parser("rules", help="rules files")
    rules_sub = rules.add_subparsers(dest="rules_command", required=True)
    check = rules_sub.add_parser("check", help="validate rules files without starting anything")
    check.add_argument("files", type=Path, nargs="+")
    _sources_arg(check)
    check.set_defaults(handler=lambda args: check_files(args.files, args.check_sources))
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
    explain.set_defaults(handler=main_explain)


def add_placeholder(sub: Any) -> None:
    """``surrogate placeholder mint TEMPLATE`` / ``surrogate placeholder templates``: offline, no
    secret involved (a rules file then holds the minted placeholder written out)."""
    ph = sub.add_parser("placeholder", help="mint placeholders of a provider's format (offline)")
    ph_sub = ph.add_subparsers(dest="placeholder_command", required=True)
    mint = ph_sub.add_parser("mint", help="print a fresh placeholder of a shipped template")
    mint.add_argument("template", choices=sorted(templates.SHIPPED), metavar="TEMPLATE")
    mint.set_defaults(handler=lambda args: _mint(args.template))
    ls = ph_sub.add_parser("templates", help="list the shipped templates and their sources")
    ls.set_defaults(handler=lambda args: _templates())


def _mint(name: str) -> int:
    print(templates.mint(templates.get(name)))
    return 0


def _templates() -> int:
    for t in templates.SHIPPED.values():
        print(f"{t.name}: {t.describe()}  [{t.source}]")
    return 0


def add_audit(sub: Any) -> None:
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
    why.set_defaults(handler=main_why)
    add_verify_parser(audit_sub)
    audit_sub.choices["verify"].set_defaults(handler=main_verify)


def _sources_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--check-sources",
        action="store_true",
        help="also read every env:/file: value source now, as 'run' does, and report one that "
        "cannot be read (by default only their form is checked: no secret is read)",
    )


def check_files(files: list[Path], read_sources: bool = False) -> int:
    """``rules check``: 0 when every file is valid (warnings on stderr), 1 when one is not."""
    from proxy.core import placeholders
    from proxy.core.errors import RulesError, SurrogateError
    from proxy.rules.loader import load_rules

    status = 0
    for f in files:
        try:
            policy = load_rules(f, read_secrets=read_sources)
            for w in policy.warnings:
                print(w, file=sys.stderr)
            print(f"{f}: ok" + (f" ({len(policy.warnings)} warnings)" if policy.warnings else ""))
            for claim in policy.claims.values():  # the template of each format-valid placeholder
                for cred in claim.credentials:
                    if placeholders.template_of(cred.placeholder) is not None:
                        shown = placeholders.describe(cred.placeholder)
                        print(f"  claim {claim.id} credential {cred.name}: placeholder {shown}")
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
