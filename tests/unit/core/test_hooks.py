"""Hook routes' pure parts: matching, the command's stdin, parsing its stdout, and the rules."""

from __future__ import annotations

import base64
import json
import textwrap
from pathlib import Path

import pytest

from proxy.core.errors import RulesError
from proxy.core.hooks import HookOutputError, HookRoute, find, parse_response, request_json
from proxy.core.hosts import HostPattern
from proxy.rules.loader import load_rules

ROUTE = HookRoute(
    "p.hooks[0]", HostPattern.parse("auth.test"), frozenset({"POST"}), ("/oauth/token",), ("x",)
)


@pytest.mark.parametrize(
    ("host", "method", "path", "hit"),
    [
        ("auth.test", "POST", "/oauth/token", True),
        ("auth.test", "POST", "/oauth/token?grant_type=x", True),
        ("auth.test", "POST", "/oauth/token/sub", True),
        ("auth.test", "POST", "/oauth/tokenx", False),
        # an upstream resolves it to /oauth/token: the route must catch it, never pass it to the
        # upstream (policy refuses it first: 400 ambiguous_path)
        ("auth.test", "POST", "/oauth/../oauth/token", True),
        ("auth.test", "GET", "/oauth/token", False),
        ("other.test", "POST", "/oauth/token", False),
    ],
    ids=["exact", "query", "below", "not-a-segment", "dot-segments", "method", "host"],
)
def test_routes_match_host_method_and_segment_prefix(host: str, method: str, path: str, hit: bool) -> None:
    assert (find((ROUTE,), host, method, path) is ROUTE) is hit


def test_stdin_is_json_with_text_or_base64_body() -> None:
    doc = json.loads(request_json("POST", "https", "a.test", 443, "/p?q=1", "HTTP/2.0", [("A", "1")], b"x=1"))
    assert doc == {
        "method": "POST", "scheme": "https", "host": "a.test", "port": 443, "path": "/p?q=1",
        "http_version": "HTTP/2.0", "headers": [["A", "1"]], "body": "x=1",
    }  # fmt: skip
    binary = json.loads(request_json("POST", "https", "a.test", 443, "/", "HTTP/1.1", [], b"\xff\x00"))
    assert binary["body"] is None and base64.b64decode(binary["body_base64"]) == b"\xff\x00"


@pytest.mark.parametrize(
    ("out", "status", "headers", "body"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: b\r\n\r\n{}", 200, [(b"x-a", b"b")], b"{}"),
        (b"HTTP/1.1 201 Created\r\n\r\nto the end", 201, [], b"to the end"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", 200, [], b"ok"),
        (b"HTTP/1.1 204 No Content\nConnection: close\n\n", 204, [], b""),
    ],
    ids=["content-length", "to-eof", "chunked", "bare-lf-and-hop-by-hop-dropped"],
)
def test_stdout_is_parsed_as_an_http_response(
    out: bytes, status: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    r = parse_response(out)
    assert (r.status, r.headers, r.body) == (status, headers, body)


@pytest.mark.parametrize(
    ("out", "says"),
    [
        (b"", "printed nothing"),
        (b"hello", "not an HTTP/1.1 response"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort", "not an HTTP/1.1 response"),
        (b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * (2 << 20), "more than"),
    ],
    ids=["empty", "not-http", "cut-short", "too-long"],
)
def test_bad_stdout_is_a_clear_error_quoting_none_of_it(out: bytes, says: str) -> None:
    with pytest.raises(HookOutputError, match=says) as info:
        parse_response(out)
    assert "hello" not in str(info.value)


def _rules(tmp_path: Path, hooks: str) -> Path:
    (tmp_path / "token").write_text("t\n")
    prog = tmp_path / "hook.sh"
    prog.write_text("#!/bin/sh\n")
    prog.chmod(0o755)
    (tmp_path / "plain.txt").write_text("")
    path = tmp_path / "rules.yaml"
    path.write_text(
        "version: 1\npools:\n  p:\n    egress:\n      - host: auth.test\n    hooks:\n"
        + textwrap.indent(textwrap.dedent(hooks), "      ")
    )
    return path


def test_a_valid_hook_route_loads(tmp_path: Path) -> None:
    policy = load_rules(
        _rules(
            tmp_path,
            "- host: auth.test\n  methods: [POST]\n  paths: [/t]\n  command: [./hook.sh, -v]\n  timeout: 2\n",
        )
    )
    [route] = policy.pools["p"].hooks
    assert (route.id, route.methods, route.paths, route.timeout) == ("p.hooks[0]", {"POST"}, ("/t",), 2.0)
    assert route.command == (str(tmp_path / "hook.sh"), "-v")


@pytest.mark.parametrize(
    ("hook", "where", "says"),
    [
        ("- host: 'a b'\n  command: [./hook.sh]\n", "7:15: pools.p.hooks[0].host", "host"),
        (
            "- host: auth.test\n  methods: [post]\n  command: [./hook.sh]\n",
            "8:19: pools.p.hooks[0].methods[0]",
            "upper-case",
        ),
        (
            "- host: auth.test\n  paths: [x]\n  command: [./hook.sh]\n",
            "8:17: pools.p.hooks[0].paths[0]",
            "start with '/'",
        ),
        (
            "- host: auth.test\n  command: [./nope]\n",
            "8:19: pools.p.hooks[0].command[0]",
            "not an executable file",
        ),
        (
            "- host: auth.test\n  command: [./plain.txt]\n",
            "8:19: pools.p.hooks[0].command[0]",
            "not an executable file",
        ),
        ("- host: auth.test\n  command: []\n", "8:18: pools.p.hooks[0].command", "non-empty list"),
        (
            "- host: auth.test\n  command: [./hook.sh]\n  timeout: 0\n",
            "9:18: pools.p.hooks[0].timeout",
            "more than 0",
        ),
        ("- host: auth.test\n", "7:9: pools.p.hooks[0]", "command"),
    ],
    ids=[
        "host",
        "method",
        "path",
        "missing-program",
        "not-executable",
        "empty-command",
        "timeout",
        "no-command",
    ],
)
def test_bad_hook_routes_are_reported_where_they_are(
    tmp_path: Path, hook: str, where: str, says: str
) -> None:
    with pytest.raises(RulesError) as info:
        load_rules(_rules(tmp_path, hook))
    text = str(info.value)
    assert where in text, text
    assert says in text


def test_a_route_catches_a_request_a_server_reads_as_its_method() -> None:
    assert not ROUTE.matches("auth.test", "GET", "/oauth/token")
    assert ROUTE.matches("auth.test", "GET", "/oauth/token", frozenset({"GET", "POST"}))
    assert not ROUTE.matches("auth.test", "GET", "/oauth/token", frozenset({"PUT"}))
