"""``surrogate claims …`` and ``surrogate creds …``: a client of the control API over its Unix
socket (default ``<state dir>/control.sock``).

A credential value is read from a file (``--value-file PATH``) or from standard input
(``--value-file -``), never from argv, which every user on the machine can see in ``ps``. One
trailing newline is dropped. Answers are printed as JSON; an API error prints its message and
exits 1, and so does a socket nobody answers on (a stopped proxy's socket file), said in one line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import proxy.control.approvalclient as approvalclient  # not `from proxy.control`: its __getattr__


def add_commands(sub: Any, state: argparse.ArgumentParser) -> None:
    sock = argparse.ArgumentParser(add_help=False, parents=[state])
    sock.add_argument("--socket", type=Path, help="control socket (default: <state dir>/control.sock)")

    approvalclient.add(sub, sock)  # surrogate approvals ... (issue 16)
    claims = sub.add_parser("claims", help="claims of the control API")
    cs = claims.add_subparsers(dest="action", required=True)
    create = cs.add_parser("create", parents=[sock], help="create a claim; prints its proxy token once")
    create.add_argument("--pool", required=True)
    create.add_argument("--id")
    create.add_argument("--source", action="append", default=[], help="source address/CIDR (repeatable)")
    create.add_argument(
        "--interface", help="transparent mode: the interface its connections must arrive on (needs --source)"
    )
    cs.add_parser("list", parents=[sock])
    for action in ("get", "delete", "rotate-token"):
        cs.add_parser(action, parents=[sock]).add_argument("claim")

    creds = sub.add_parser("creds", help="credentials of a claim")
    ks = creds.add_subparsers(dest="action", required=True)
    ks.add_parser("list", parents=[sock]).add_argument("claim")
    for action in ("get", "delete"):
        p = ks.add_parser(action, parents=[sock])
        p.add_argument("claim")
        p.add_argument("name")
        if action == "delete":
            p.add_argument("--if-match", type=int)
    for action in ("put", "patch"):
        p = ks.add_parser(action, parents=[sock], help=f"{action} a credential")
        p.add_argument("claim")
        p.add_argument("name")
        p.add_argument(
            "--host",
            action="append",
            dest="hosts",
            required=action == "put",
            help="a host the secret may go to (repeatable)",
        )
        p.add_argument(
            "--value-file",
            metavar="PATH",
            help="read the value from PATH, or '-' for standard input (put: needed but for kind aws_sigv4)",
        )
        if action == "put":  # a kind and its block change by PUT only (proxy/control/kinds.py)
            p.add_argument("--kind", choices=["static", "aws_sigv4", "oauth_client", "hmac"])
            p.add_argument(
                "--kind-file",
                metavar="PATH",
                help="the kind's block as a JSON object (aws_sigv4: its keys; oauth_client: mint; "
                "hmac: sign), from PATH or '-' for standard input",
            )
        p.add_argument("--placeholder")
        p.add_argument("--inject-header", help="set this header to the formatted value")
        p.add_argument("--format", help="injection format, default 'Bearer {value}'")
        p.add_argument("--expires-at", help="ISO 8601 time with zone, e.g. 2026-12-01T00:00:00Z")
        p.add_argument("--max-requests", type=int, help="request budget: refuse the credential after N uses")
        p.add_argument(
            "--surface",
            action="append",
            dest="surfaces",
            choices=["header", "basic", "query", "userinfo", "body"],
            help="where the placeholder is swapped (repeatable; default header and basic)",
        )
        p.add_argument(
            "--slot-header",
            action="append",
            dest="slot_headers",
            metavar="NAME",
            help="a header the placeholder is swapped in (repeatable; default: the credential headers)",
        )
        p.add_argument(
            "--basic-part",
            action="append",
            dest="basic_parts",
            choices=["user", "password"],
            help="a part of Basic credentials the placeholder is swapped in (repeatable; default password)",
        )
        p.add_argument(
            "--on-misplaced",
            choices=["carry", "block", "terminate"],
            help="a placeholder where it is not swapped: pass it inert (default), refuse, or close",
        )
        p.add_argument("--if-match", type=int, help="only if the version is still this")


def _read_value(spec: str) -> str:
    text = sys.stdin.read() if spec == "-" else Path(spec).read_text(encoding="utf-8")
    return text[:-1] if text.endswith("\n") else text


def _read_block(args: argparse.Namespace) -> dict[str, Any]:
    """The ``--kind-file`` JSON object; SystemExit naming the file (never its content)."""
    if not args.kind_file:
        raise SystemExit(f"surrogate: creds put --kind {args.kind} needs --kind-file (its block as JSON)")
    text = sys.stdin.read() if args.kind_file == "-" else Path(args.kind_file).read_text(encoding="utf-8")
    try:
        block = json.loads(text)
    except ValueError:
        block = None
    if not isinstance(block, dict):
        raise SystemExit(f"surrogate: --kind-file {args.kind_file} is not a JSON object")
    return block


def run_command(args: argparse.Namespace) -> int:
    path = args.socket or args.state_dir / "control.sock"
    if not path.exists():
        print(
            f"surrogate: no control socket at {path}; is 'surrogate run' or 'surrogate control' "
            "running with this --state-dir?",
            file=sys.stderr,
        )
        return 1
    import httpx  # only to send: ``--help`` and usage errors never import it

    method, url, body, headers = _request(args)
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), base_url="http://control") as c:
            r = c.request(method, url, json=body, headers=headers)
    except httpx.ConnectError:  # nothing was sent: a socket file left by a proxy that stopped
        print(
            f"surrogate: nothing answers on the control socket {path} (a proxy that stopped leaves "
            "its socket file); is 'surrogate run' or 'surrogate control' running with this --state-dir?",
            file=sys.stderr,
        )
        return 1
    except httpx.TransportError as e:  # sent, no answer: a write may or may not have been applied
        print(
            f"surrogate: the control API at {path} did not answer ({type(e).__name__}); whether the "
            "request was applied is not known: read the claim or credential back before retrying",
            file=sys.stderr,
        )
        return 1
    if r.status_code >= 400:
        try:
            message = r.json().get("message", r.text)
        except ValueError:
            message = r.text
        print(f"surrogate: {r.status_code}: {message}", file=sys.stderr)
        return 1
    if r.content:
        print(json.dumps(r.json(), indent=2))
    return 0


def _request(args: argparse.Namespace) -> tuple[str, str, dict[str, Any] | None, dict[str, str]]:
    headers = {"If-Match": f'"{args.if_match}"'} if getattr(args, "if_match", None) else {}
    if args.command == "approvals":
        return approvalclient.request(args)
    if args.command == "claims":
        base = "/v1/claims"
        if args.action == "create":
            claim_body = {"id": args.id, "pool": args.pool, "sources": args.source}
            claim_body["interface"] = args.interface
            return "POST", base, claim_body, headers
        if args.action == "list":
            return "GET", base, None, headers
        if args.action == "rotate-token":
            return "POST", f"{base}/{args.claim}/token", None, headers
        return args.action.upper(), f"{base}/{args.claim}", None, headers
    base = f"/v1/claims/{args.claim}/credentials"
    if args.action == "list":
        return "GET", base, None, headers
    url = f"{base}/{args.name}"
    if args.action in ("get", "delete"):
        return args.action.upper(), url, None, headers
    body: dict[str, Any] = {}
    if args.hosts:
        body["hosts"] = args.hosts
    kind = getattr(args, "kind", None) or "static"
    if getattr(args, "kind_file", None) and kind == "static":  # its block would be dropped unsaid
        raise SystemExit(
            "surrogate: --kind-file is the block of --kind aws_sigv4|oauth_client|hmac: give --kind"
        )
    if args.action == "put" and not args.value_file and kind != "aws_sigv4":
        raise SystemExit(f"surrogate: creds put of kind {kind} needs --value-file")
    if args.value_file:
        body["value"] = _read_value(args.value_file)
    if args.action == "put" and kind != "static":
        body["kind"] = kind
        if kind != "hmac" or args.kind_file:  # hmac's sign block has a default (the example scheme)
            body[{"aws_sigv4": "aws_sigv4", "oauth_client": "mint", "hmac": "sign"}[kind]] = _read_block(args)
    if args.placeholder:
        body["placeholder"] = args.placeholder
    if args.inject_header:
        body["inject"] = {"set_header": args.inject_header, "format": args.format or "Bearer {value}"}
    if args.expires_at:
        body["expires_at"] = args.expires_at
    if args.max_requests is not None:
        body["max_requests"] = args.max_requests  # the API refuses < 1 with a 422 naming the field
    if args.surfaces:
        body["surfaces"] = args.surfaces
    if args.on_misplaced:
        body["on_misplaced"] = args.on_misplaced
    if args.slot_headers:
        body["headers"] = args.slot_headers
    if args.basic_parts:
        body["basic_parts"] = args.basic_parts
    return args.action.upper(), url, body, headers
