"""``surrogate approvals list|approve ID [--scope S]|deny ID|grants|revoke ID`` (issue 16): the
control API's approval routes (:mod:`proxy.control.approvalroutes`) over its socket, printed as
JSON like ``claims`` and ``creds`` (:mod:`proxy.control.client` sends them)."""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import quote

_ID = "the id from list/grants (one that begins with '-' goes after '--': revoke -- -0tE...)"


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
    approve.add_argument("id", help=_ID)
    approve.add_argument(
        "--scope", default="once", help="once (default), session, for:DURATION (for:10m), always"
    )
    deny = acts.add_parser("deny", parents=[sock], help="refuse a held request (403 approval_denied)")
    deny.add_argument("id", help=_ID)
    grants = acts.add_parser("grants", parents=[sock], help="standing grants (active ones unless --all)")
    grants.add_argument("--all", action="store_true")
    acts.add_parser("revoke", parents=[sock], help="revoke a grant").add_argument("id", help=_ID)


def request(args: argparse.Namespace) -> tuple[str, str, dict[str, Any] | None, dict[str, str]]:
    """The (method, path, JSON body, headers) of an ``approvals`` command."""
    if args.action == "list":
        return "GET", f"/approvals?state={args.state}", None, {}
    if args.action == "approve":
        return "POST", f"/approvals/{quote(args.id, safe='')}/approve", {"scope": args.scope}, {}
    if args.action == "deny":
        return "POST", f"/approvals/{quote(args.id, safe='')}/deny", None, {}
    if args.action == "grants":
        return "GET", "/grants" + ("?all=true" if args.all else ""), None, {}
    return "DELETE", f"/grants/{quote(args.id, safe='')}", None, {}
