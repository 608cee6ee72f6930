"""``surrogate approvals list|approve ID [--scope S]|deny ID|grants|revoke ID`` (issue 16): the
control API's approval routes (:mod:`proxy.control.approvalroutes`) over its socket, printed as
JSON like ``claims`` and ``creds`` (:mod:`proxy.control.client` sends them)."""

from __future__ import annotations

import argparse
from typing import Any


def add(sub: Any, sock: argparse.ArgumentParser) -> None:
    approvals = sub.add_parser("approvals", help="held requests waiting for an operator, and grants")
    acts = approvals.add_subparsers(dest="action", required=True)
    listing = acts.add_parser("list", parents=[sock], help="approvals (default: the pending ones)")
    listing.add_argument(
        "--state",
        default="pending",
        choices=["pending", "approved", "denied", "timed_out", "withdrawn", "all"],
    )
    approve = acts.add_parser("approve", parents=[sock], help="let a held request through")
    approve.add_argument("id")
    approve.add_argument(
        "--scope", default="once", help="once (default), session, for:DURATION (for:10m), always"
    )
    acts.add_parser("deny", parents=[sock], help="refuse a held request (403 approval_denied)").add_argument(
        "id"
    )
    grants = acts.add_parser("grants", parents=[sock], help="standing grants (active ones unless --all)")
    grants.add_argument("--all", action="store_true")
    acts.add_parser("revoke", parents=[sock], help="revoke a grant").add_argument("id")


def request(args: argparse.Namespace) -> tuple[str, str, dict[str, Any] | None, dict[str, str]]:
    """The (method, path, JSON body, headers) of an ``approvals`` command."""
    if args.action == "list":
        return "GET", f"/approvals?state={args.state}", None, {}
    if args.action == "approve":
        return "POST", f"/approvals/{args.id}/approve", {"scope": args.scope}, {}
    if args.action == "deny":
        return "POST", f"/approvals/{args.id}/deny", None, {}
    if args.action == "grants":
        return "GET", "/grants" + ("?all=true" if args.all else ""), None, {}
    return "DELETE", f"/grants/{args.id}", None, {}
