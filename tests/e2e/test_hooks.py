"""Hook routes end to end: an operator command answers a route's requests, the upstream is never
contacted, the command sees placeholders only, and timeouts and bad output are clear errors."""

from __future__ import annotations

import json
import ssl
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from _env import env_rules
from harness import Env

pytestmark = pytest.mark.e2e

SCRIPTS = {
    # echoes what it was given, and prints the real secret, as a host-side CLI might
    "hook-ok.py": """\
        import json, sys
        got = sys.stdin.buffer.read()
        open(sys.argv[1], "wb").write(got)
        secret = open(sys.argv[2]).read().strip()
        body = json.dumps({"access_token": secret, "saw": json.loads(got)["path"]}).encode()
        sys.stdout.buffer.write(b"HTTP/1.1 201 Created\\r\\nContent-Type: application/json\\r\\n"
                                b"X-Hook: " + secret.encode() + b"\\r\\n\\r\\n" + body)
        """,
    "hook-slow.py": "import time; time.sleep(30)\n",
    "hook-bad.py": "print('this is not an HTTP response')\n",
    "hook-fails.py": "import sys; sys.exit(3)\n",
}


@pytest.fixture(scope="module")
def hooked(env: Env) -> Iterator[Path]:
    """Add hook routes to pool p of the module's rules (applied by a live reload)."""
    tmp = env.proxy.rules.parent
    for name, text in SCRIPTS.items():
        script = tmp / name
        script.write_text(f"#!{sys.executable}\n" + textwrap.dedent(text))
        script.chmod(0o755)
    stdin_file = tmp / "hook-stdin.json"
    hooks = [
        {
            "host": "api.test",
            "methods": ["POST"],
            "paths": ["/hook/ok"],
            "command": ["./hook-ok.py", str(stdin_file), str(env.secret_file)],
        },
        {"host": "api.test", "paths": ["/hook/slow"], "command": ["./hook-slow.py"], "timeout": 0.5},
        {"host": "api.test", "paths": ["/hook/bad"], "command": ["./hook-bad.py"]},
        {"host": "api.test", "paths": ["/hook/fails"], "command": ["./hook-fails.py"]},
    ]
    env.proxy.rules.write_text(env_rules(env.upstream.port, hooks=hooks))
    env.proxy.wait_event(event="reload", outcome="applied", timeout=10)
    return stdin_file


def _post(env: Env, path: str) -> httpx.Response:
    ctx = ssl.create_default_context(cafile=env.proxy.ca_pem)
    with httpx.Client(proxy=env.proxy_url, verify=ctx, timeout=20) as client:
        r = client.post(
            env.url("api.test", path),
            headers={"Authorization": f"Bearer {env.placeholder}"},
            content=json.dumps({"refresh_token": env.placeholder}).encode(),
        )
    env.received.append(b"\n".join(k + b": " + v for k, v in r.headers.raw) + b"\n\n" + r.content)
    return r


def test_a_hook_route_is_answered_by_its_command_and_never_reaches_the_upstream(
    env: Env, hooked: Path
) -> None:
    before = env.upstream.connections
    r = _post(env, "/hook/ok?x=1")
    assert r.status_code == 201
    assert r.json() == {"access_token": env.placeholder, "saw": "/hook/ok?x=1"}  # scrubbed
    assert r.headers["x-hook"] == env.placeholder
    assert [x for x in env.upstream.requests if x.path.startswith("/hook/")] == []
    assert env.upstream.connections == before
    event = env.proxy.wait_event(path="/hook/ok?x=REDACTED")
    assert (event["reason"], event["status"], event["decision"]) == ("hook_answered", 201, "allow")
    assert event["credentials"] == []


def test_the_command_gets_the_request_as_sent_with_placeholders_never_secrets(env: Env, hooked: Path) -> None:
    assert _post(env, "/hook/ok?x=2").status_code == 201
    got = json.loads(hooked.read_text())
    assert (got["method"], got["host"], got["path"]) == ("POST", "api.test", "/hook/ok?x=2")
    assert ["Authorization", f"Bearer {env.placeholder}"] in got["headers"]
    assert json.loads(got["body"]) == {"refresh_token": env.placeholder}
    assert env.secret not in hooked.read_text()
    assert not any(k.lower().startswith("proxy-") for k, _ in got["headers"])


@pytest.mark.parametrize(
    ("path", "status", "reason", "says"),
    [
        ("/hook/slow", 504, "hook_timeout", "ran past 0.5 s"),
        ("/hook/bad", 502, "hook_failed", "not an HTTP/1.1 response"),
        ("/hook/fails", 502, "hook_failed", "exited 3"),
    ],
    ids=["timeout", "bad-output", "non-zero-exit"],
)
def test_a_failing_command_is_a_clear_error(
    env: Env, hooked: Path, path: str, status: int, reason: str, says: str
) -> None:
    r = _post(env, path)
    assert r.status_code == status
    assert r.json()["error"] == reason
    assert says in r.json()["message"]
    assert [x for x in env.upstream.requests if x.path == path] == []


def test_a_request_outside_the_route_still_goes_upstream(env: Env, hooked: Path) -> None:
    ctx = ssl.create_default_context(cafile=env.proxy.ca_pem)
    with httpx.Client(proxy=env.proxy_url, verify=ctx) as client:
        r = client.get(env.url("api.test", "/hook/ok"))  # GET: the route is POST only
    assert r.status_code == 200
    assert [x.path for x in env.upstream.requests if x.path == "/hook/ok"] == ["/hook/ok"]


def test_a_body_over_the_hook_bound_is_refused_and_no_command_runs(env: Env, hooked: Path) -> None:
    hooked.unlink(missing_ok=True)
    ctx = ssl.create_default_context(cafile=env.proxy.ca_pem)
    with httpx.Client(proxy=env.proxy_url, verify=ctx, timeout=20) as client:
        try:
            status = client.post(
                env.url("api.test", "/hook/ok?big=1"), content=b"x" * (100 * 1024)
            ).status_code
        except httpx.HTTPError:
            status = None  # a refusal of a body this large closes the connection (facts.refuse)
    assert status in (None, 413)
    event = env.proxy.wait_event(path="/hook/ok?big=REDACTED")
    assert event["reason"] == "hook_failed" and "at most 65536 bytes" in event["message"]
    assert not hooked.exists()
    assert [x for x in env.upstream.requests if x.path.startswith("/hook/ok?big")] == []


# --- issue 13, class 1: a hook route is matched on the canonical path --------------------------

SPELLINGS = [
    ("/hook/%6Fk", "encoded-unreserved-letter"),
    ("/%68ook/%6f%4B", "mixed-case-escapes"),
    ("/hook/ok/", "trailing-slash"),
    ("/hook//ok", "doubled-slash"),
    ("/hook/ok;jsessionid=1", "matrix-param"),
    ("/HOOK/OK", "case-folded"),
]


@pytest.mark.parametrize("path", [s[0] for s in SPELLINGS], ids=[s[1] for s in SPELLINGS])
def test_every_spelling_of_a_hook_route_is_answered_by_its_command(env: Env, hooked: Path, path: str) -> None:
    """Each spelling names /hook/ok on some server: the command answers it, the upstream never
    sees it (/hook/%6Fk used to go to the upstream)."""
    r = _post(env, path)
    assert r.status_code == 201, r.text
    assert r.json()["saw"] == path  # the command gets the path as sent
    assert [x for x in env.upstream.requests if x.path == path] == []


OVERRIDES = [
    ({"X-HTTP-Method-Override": "POST"}, "/hook/ok?o=1"),
    ({"X-HTTP-Method": "post"}, "/hook/ok?o=2"),
    ({"X-Method-Override": "PUT, POST"}, "/hook/ok?o=3"),
    ({}, "/hook/ok?_method=POST"),
]


@pytest.mark.parametrize(("headers", "path"), OVERRIDES, ids=["override", "odata", "list", "query"])
def test_a_get_that_a_server_reads_as_the_routes_post_is_answered_by_its_command(
    env: Env, hooked: Path, headers: dict[str, str], path: str
) -> None:
    """The route is ``methods: [POST]``; a GET naming POST elsewhere (proxy/core/methods.py) is a
    POST to many servers, so the command answers it and the upstream never sees it."""
    ctx = ssl.create_default_context(cafile=env.proxy.ca_pem)
    with httpx.Client(proxy=env.proxy_url, verify=ctx, timeout=20) as client:
        r = client.get(env.url("api.test", path), headers=headers)
    env.received.append(r.content)
    assert r.status_code == 201, r.text
    assert [x for x in env.upstream.requests if x.path == path] == []


AMBIGUOUS = [
    ("/hook/%2e/ok", "encoded-dot-segment"),
    ("/hook/x/.%2E/ok", "half-encoded-dot-dot"),  # a raw /../ is resolved by httpx itself
    ("/hook/x/..;/ok", "dot-dot-with-param"),
    ("/hook%2fok", "encoded-slash"),
    ("/hook%5cok", "encoded-backslash"),
    ("/hook/%256Fk", "double-encoding"),
    ("/hook/o%00k", "encoded-nul"),
]


@pytest.mark.parametrize("path", [s[0] for s in AMBIGUOUS], ids=[s[1] for s in AMBIGUOUS])
def test_an_ambiguous_path_on_a_hooked_host_is_refused(env: Env, hooked: Path, path: str) -> None:
    hooked.unlink(missing_ok=True)
    r = _post(env, path)
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "ambiguous_path"
    assert not hooked.exists()  # no command ran
    assert [x for x in env.upstream.requests if x.path == path] == []
