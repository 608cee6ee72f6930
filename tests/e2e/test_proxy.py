"""End to end: real clients (curl, httpx, git) → real proxy process → real HTTPS upstream.

Each test checks what the upstream received, what the client saw, and the audit event.
"""

from __future__ import annotations

import base64
import os
import re
import socket
import ssl
import subprocess
from pathlib import Path

import httpx
import pytest
from harness import Env
from servers import README_TEXT
from world import control

pytestmark = pytest.mark.e2e


def curl(env: Env, url: str, *args: str, proxy_url: str | None = None) -> subprocess.CompletedProcess[bytes]:
    cmd = [
        "curl",
        "-sS",
        "--max-time",
        "20",
        "-x",
        proxy_url or env.proxy_url,
        "--cacert",
        str(env.proxy.ca_pem),
        "-w",
        "\n%{http_code}",
        *args,
        url,
    ]
    done = subprocess.run(cmd, capture_output=True, timeout=30, check=False)
    env.received.append(done.stdout + done.stderr)
    return done


def status_of(done: subprocess.CompletedProcess[bytes]) -> int:
    return int(done.stdout.rsplit(b"\n", 1)[-1])


def requests_to(env: Env, path: str) -> list:
    return [r for r in env.upstream.requests if r.path == path]


def header(rec, name: str) -> list[str]:
    return [v for k, v in rec.headers if k.lower() == name.lower()]


def test_curl_bearer_placeholder_reaches_upstream_as_the_secret(env: Env) -> None:
    done = curl(
        env, env.url("api.test", "/t/curl-bearer?x=1"), "-H", f"Authorization: Bearer {env.placeholder}"
    )
    assert status_of(done) == 200, done
    [rec] = requests_to(env, "/t/curl-bearer?x=1")
    assert header(rec, "Authorization") == [f"Bearer {env.secret}"]
    assert env.placeholder.encode() not in b"".join(v.encode() for _, v in rec.headers)
    # The proxy credential never reaches the upstream.
    assert not [k for k, _ in rec.headers if k.lower().startswith("proxy-")]
    event = env.proxy.wait_event(path="/t/curl-bearer?x=REDACTED")
    assert event["decision"] == "allow" and event["claim"] == "c1" and event["pool"] == "p"
    assert event["status"] == 200 and event["rule"] == "p.egress[0] api.test"
    assert {"name": "gh", "version": 1} in event["credentials"]


def test_httpx_api_key_header_and_injection(env: Env) -> None:
    with httpx.Client(
        proxy=env.proxy_url, verify=ssl.create_default_context(cafile=env.proxy.ca_pem)
    ) as client:
        r = client.get(
            env.url("api.test", "/t/httpx"),
            headers={"X-Api-Key": env.placeholder, "X-Injected": "sandbox-chosen"},
        )
    env.received.append(r.content + str(r.headers).encode())
    assert r.status_code == 200
    [rec] = requests_to(env, "/t/httpx")
    assert header(rec, "X-Api-Key") == [env.secret]
    # Injection replaces whatever the sandbox sent.
    assert header(rec, "X-Injected") == [f"Token {env.injected}"]
    names = {c["name"] for c in env.proxy.wait_event(path="/t/httpx")["credentials"]}
    assert names == {"gh", "inj"}


def test_git_clone_with_placeholder_password(env: Env, tmp_path: Path) -> None:
    repo_url = f"https://git:{env.placeholder}@api.test:{env.upstream.port}/git/repo.git"
    git_env = {
        **os.environ,
        "GIT_SSL_CAINFO": str(env.proxy.ca_pem),
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_CONFIG_NOSYSTEM": "1",
        "HOME": str(tmp_path),
    }
    done = subprocess.run(
        ["git", "-c", f"http.proxy={env.proxy_url}", "clone", repo_url, str(tmp_path / "clone")],
        capture_output=True,
        env=git_env,
        timeout=60,
        check=False,
    )
    env.received.append(done.stdout + done.stderr)
    assert done.returncode == 0, done.stderr.decode()
    assert (tmp_path / "clone" / "README").read_text() == README_TEXT
    sent = [
        v for r in env.upstream.requests if r.path.startswith("/git/") for v in header(r, "Authorization")
    ]
    expected = "Basic " + base64.b64encode(f"git:{env.secret}".encode()).decode()
    assert expected in sent


def test_placeholder_toward_unbound_host_is_a_violation(env: Env) -> None:
    done = curl(env, env.url("other.test", "/t/violation"), "-H", f"Authorization: Bearer {env.placeholder}")
    assert status_of(done) == 403
    assert b"placeholder_violation" in done.stdout
    assert requests_to(env, "/t/violation") == []
    event = env.proxy.wait_event(path="/t/violation")
    assert (event["decision"], event["reason"], event["status"]) == (
        "violation",
        "placeholder_violation",
        403,
    )
    assert event["request_id"].encode() in done.stdout


def test_placeholder_in_query_toward_unbound_host_is_a_violation(env: Env) -> None:
    done = curl(env, env.url("other.test", f"/t/violation-query?key={env.placeholder}"))
    assert status_of(done) == 403
    assert [r for r in env.upstream.requests if r.path.startswith("/t/violation-query")] == []


def test_other_claims_placeholder_is_never_swapped(env: Env) -> None:
    """Invariant 3: claim c1 cannot cause claim c2's secret to be used."""
    done = curl(env, env.url("api.test", "/t/cross-claim"), "-H", f"Authorization: Bearer {env.placeholder2}")
    assert status_of(done) == 200
    [rec] = requests_to(env, "/t/cross-claim")
    assert header(rec, "Authorization") == [f"Bearer {env.placeholder2}"]


def test_wrong_or_missing_proxy_credential_gets_407_before_any_connection(env: Env) -> None:
    before = env.upstream.connections
    wrong = curl(env, env.url("api.test", "/t/407"), proxy_url=env.proxy.url("c1", "wrong"))
    other = curl(env, env.url("api.test", "/t/407"), proxy_url=env.proxy.url("c2", env.token))
    missing = curl(env, env.url("api.test", "/t/407"), proxy_url=f"http://127.0.0.1:{env.proxy.port}")
    for done in (wrong, other, missing):
        assert b"407" in done.stderr, done
    assert env.upstream.connections == before
    assert requests_to(env, "/t/407") == []


def test_denied_host_is_refused_before_any_upstream_connection(env: Env) -> None:
    before = env.upstream.connections
    done = curl(env, env.url("denied.test", "/t/denied"))
    assert b"403" in done.stderr
    assert env.upstream.connections == before  # no TCP to the upstream at all
    events = [e for e in env.proxy.audit_events() if e["host"] == "denied.test"]
    assert [(e["event"], e["method"], e["decision"], e["reason"]) for e in events] == [
        ("tunnel", "CONNECT", "deny", "no_rule")
    ]


def test_host_header_mismatch_gets_421(env: Env) -> None:
    done = curl(env, env.url("api.test", "/t/421-host"), "-H", "Host: other.test")
    assert status_of(done) == 421
    assert b"authority_mismatch" in done.stdout
    assert requests_to(env, "/t/421-host") == []


def _over_sni(env: Env, sni: str, path: str) -> bytes:
    """CONNECT api.test, TLS with ``sni`` as sent (hostname not checked), Host api.test."""
    port = env.upstream.port
    with socket.create_connection(("127.0.0.1", env.proxy.port), timeout=10) as raw:
        auth = base64.b64encode(f"c1:{env.token}".encode()).decode()
        raw.sendall(
            f"CONNECT api.test:{port} HTTP/1.1\r\nHost: api.test:{port}\r\n"
            f"Proxy-Authorization: Basic {auth}\r\n\r\n".encode()
        )
        assert raw.recv(4096).startswith(b"HTTP/1.1 200")
        ctx = ssl.create_default_context(cafile=str(env.proxy.ca_pem))
        ctx.check_hostname = False  # the name is meant to be one no certificate holds
        with ctx.wrap_socket(raw, server_hostname=sni) as tls:
            tls.sendall(f"GET {path} HTTP/1.1\r\nHost: api.test:{port}\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while chunk := tls.recv(65536):
                data += chunk
    env.received.append(data)
    return data


def test_sni_mismatch_gets_421(env: Env) -> None:
    """CONNECT api.test, TLS SNI other.test, Host api.test: the client chose all three."""
    assert _over_sni(env, "other.test", "/t/421-sni").startswith(b"HTTP/1.1 421")
    assert requests_to(env, "/t/421-sni") == []


@pytest.mark.parametrize("sni", ["other.test:443", "api.test:{port}", "api.test/x", "api.test."])
def test_an_sni_mitmproxy_cannot_read_as_a_host_gets_421_not_ignored(env: Env, sni: str) -> None:
    """mitmproxy's ClientHello.sni drops a server name that is not one valid host name; the
    request was then decided on its Host alone (attack session 2026-12-04, transparent mode).
    ``api.test.`` (a valid name, the same host) is the control."""
    path = f"/t/421-badsni-{len(sni)}"
    data = _over_sni(env, sni.format(port=env.upstream.port), path)
    if sni == "api.test.":
        assert data.startswith(b"HTTP/1.1 200"), data[:200]
        return
    assert data.startswith(b"HTTP/1.1 421"), data[:200]
    assert b"server name" in data
    assert requests_to(env, path) == []


def test_sse_first_event_arrives_before_the_stream_ends(env: Env) -> None:
    """The upstream sends one event and then waits for us: a buffering proxy would hang here."""
    env.upstream.sse_release.clear()
    with (
        httpx.Client(
            proxy=env.proxy_url, verify=ssl.create_default_context(cafile=env.proxy.ca_pem), timeout=15
        ) as client,
        client.stream("GET", env.url("api.test", "/sse")) as r,
    ):
        lines = r.iter_lines()
        assert next(lines) == "data: one"
        assert not env.upstream.sse_release.is_set()  # the stream has not ended
        env.upstream.sse_release.set()
        rest = [line for line in lines if line]
    assert rest == ["data: two"]


def test_large_bodies_stream_both_ways(env: Env) -> None:
    n = 50 * 1024 * 1024
    done = curl(env, env.url("api.test", f"/bytes/{n}"), "-o", os.devnull)
    assert status_of(done) == 200
    assert env.proxy.wait_event(path=f"/bytes/{n}")["bytes_in"] == n

    def body():
        block = b"u" * 65536
        for _ in range(20 * 16):
            yield block

    with httpx.Client(
        proxy=env.proxy_url, verify=ssl.create_default_context(cafile=env.proxy.ca_pem), timeout=60
    ) as client:
        r = client.post(env.url("api.test", "/upload"), content=body())
    assert r.json() == {"received": 20 * 1024 * 1024}


def test_opaque_tunnel_is_not_intercepted_and_gets_no_secret(env: Env) -> None:
    """intercept: false — the client talks TLS to the upstream itself (trusting only the upstream
    CA), so nothing can be swapped: the placeholder passes as it is."""
    done = subprocess.run(
        [
            "curl",
            "-sS",
            "-x",
            env.proxy_url,
            "--cacert",
            str(env.upstream_ca),
            "-w",
            "\n%{http_code}",
            "-H",
            f"Authorization: Bearer {env.placeholder}",
            env.url("opaque.test", "/t/opaque"),
        ],
        capture_output=True,
        timeout=30,
        check=False,
    )
    env.received.append(done.stdout + done.stderr)
    assert status_of(done) == 200, done.stderr
    [rec] = requests_to(env, "/t/opaque")
    assert header(rec, "Authorization") == [f"Bearer {env.placeholder}"]
    event = env.proxy.wait_event(host="opaque.test", event="tunnel")
    assert (event["decision"], event["rule"]) == ("allow", "p.egress[2] opaque.test")


def test_placeholder_over_cleartext_http_is_refused(env: Env) -> None:
    """api.test is bound, and allowed on port 80, but a secret only leaves over verified TLS."""
    done = curl(env, "http://api.test/t/cleartext", "-H", f"Authorization: Bearer {env.placeholder}")
    assert status_of(done) == 403
    assert b"cleartext_credential" in done.stdout
    event = env.proxy.wait_event(path="/t/cleartext")
    assert (event["decision"], event["scheme"]) == ("violation", "http")


def test_audit_event_has_every_documented_field(env: Env) -> None:
    curl(env, env.url("api.test", "/t/audit?a=1&b=2&flag"), "-d", "hello")
    event = env.proxy.wait_event(path="/t/audit?a=REDACTED&b=REDACTED&flag")
    assert set(event) == {
        "time",
        "seq",
        "worker",
        "node",
        "event",
        "request_id",
        "claim",
        "pool",
        "client",
        "method",
        "scheme",
        "host",
        "port",
        "path",
        "status",
        "decision",
        "reason",
        "rule",
        "message",
        "would_deny",
        "credentials",
        "carried",
        "forged",
        "carried_on",
        "violation_surface",
        "bytes_out",
        "bytes_in",
        "duration_ms",
        "prev",
    }
    assert event["method"] == "POST" and event["bytes_out"] == 5 and event["scheme"] == "https"
    assert event["client"].startswith("127.0.0.1:") and event["duration_ms"] >= 0


def test_keep_alive_tunnel_reuses_one_upstream_connection(env: Env) -> None:
    """Was: pinning the checked address on the upstream connection broke mitmproxy's reuse, so
    every request opened a new upstream connection and the 6th on one HTTP/1.1 tunnel hung on
    mitmproxy's per-address connection limit."""
    before = env.upstream.connections
    ctx = ssl.create_default_context(cafile=env.proxy.ca_pem)
    with httpx.Client(proxy=env.proxy_url, verify=ctx, timeout=10) as client:
        codes = [
            client.get(
                env.url("api.test", f"/t/reuse/{i}"), headers={"X-Api-Key": env.placeholder}
            ).status_code
            for i in range(12)
        ]
    assert codes == [200] * 12
    assert env.upstream.connections - before == 1


def test_client_hanging_up_mid_response_is_audited_as_client_closed(env: Env) -> None:
    """Was: audited as upstream_error, though the upstream was fine. curl leaves after the first
    whole event (the upstream holds the second): it stopped reading at an event boundary, so the
    request was served as allowed (issue 18 item 6, addons/ending.py; mid-event: an error,
    tests/e2e/test_endings.py)."""
    env.upstream.sse_release.clear()
    curl(env, env.url("api.test", "/sse"), "--max-time", "1")  # curl's last --max-time counts
    env.upstream.sse_release.set()
    event = env.proxy.wait_event(path="/sse", reason="client_closed")
    assert (event["decision"], event["status"]) == ("allow", 200)


def test_http1_client_hanging_up_is_client_closed_too(env: Env) -> None:
    env.upstream.sse_release.clear()
    curl(env, env.url("api.test", "/sse?h1"), "--http1.1", "--max-time", "1")
    env.upstream.sse_release.set()
    assert env.proxy.wait_event(path="/sse?h1")["reason"] == "client_closed"


def test_zz_metrics_moved_with_the_traffic_above(env: Env) -> None:
    """Scraped from the control socket after this module's traffic (runs last)."""
    with control(env.proxy) as api:
        text = api.get("/metrics").text

    def value(sample: str) -> float:
        line = next((x for x in text.splitlines() if x.startswith(sample + " ")), None)
        assert line is not None, f"{sample} not in /metrics"
        return float(line.rsplit(" ", 1)[1])

    assert value('surrogate_requests_total{decision="allow",reason="allowed",status_class="2xx"}') >= 10
    assert value('surrogate_requests_total{decision="deny",reason="no_rule",status_class="4xx"}') >= 1
    assert (
        value(
            'surrogate_requests_total{decision="violation",reason="placeholder_violation",status_class="4xx"}'
        )
        >= 2
    )
    assert value('surrogate_substitutions_total{credential="gh"}') >= 5
    assert value('surrogate_violations_total{credential="gh"}') >= 2
    assert value("surrogate_upstream_seconds_count") >= 10
    assert "surrogate_open_connections" in text
    for c in env.canaries:
        assert c not in text
    assert "api.test" not in text  # no sandbox-chosen host as a label


def test_git_push_with_placeholder_password(env: Env, tmp_path: Path) -> None:
    repo_url = f"https://git:{env.placeholder}@api.test:{env.upstream.port}/git/repo.git"
    git_env = {
        **os.environ,
        "GIT_SSL_CAINFO": str(env.proxy.ca_pem),
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_CONFIG_NOSYSTEM": "1",
        "HOME": str(tmp_path),
    }

    def git(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
        done = subprocess.run(
            ["git", "-c", f"http.proxy={env.proxy_url}", "-c", "user.name=t", "-c", "user.email=t@t", *args],
            capture_output=True,
            env=git_env,
            cwd=cwd,
            timeout=60,
            check=False,
        )
        env.received.append(done.stdout + done.stderr)
        return done

    assert git("clone", repo_url, str(tmp_path / "w")).returncode == 0
    (tmp_path / "w" / "pushed.txt").write_text("from the sandbox\n")
    assert git("add", "pushed.txt", cwd=tmp_path / "w").returncode == 0
    assert git("commit", "-m", "push through surrogate", cwd=tmp_path / "w").returncode == 0
    pushed = git("push", "origin", "HEAD", cwd=tmp_path / "w")
    assert pushed.returncode == 0, pushed.stderr.decode()
    again = git("clone", repo_url, str(tmp_path / "again"))
    assert again.returncode == 0 and (tmp_path / "again" / "pushed.txt").read_text() == "from the sandbox\n"
    assert [r for r in env.upstream.requests if "git-receive-pack" in r.path]


@pytest.mark.parametrize("binary", [False, True], ids=["text", "octet-stream"])
@pytest.mark.parametrize("path", ["/reflect", "/reflect-split", "/reflect-gzip"])
@pytest.mark.parametrize("http", ["--http1.1", "--http2"])
def test_an_upstream_reflecting_the_secret_hands_back_only_the_placeholder(
    env: Env, path: str, http: str, binary: bool
) -> None:
    """Binary bodies are searched for plain spellings only (proxy/scrub.escapes_matter): the
    secret itself, cut across reads or gzip-encoded, is still replaced in them."""
    target = path + ("?binary=1" if binary else "")
    done = curl(
        env,
        env.url("api.test", target),
        http,
        "--compressed",
        "-D",
        "-",
        "-H",
        f"Authorization: Bearer {env.placeholder}",
    )
    assert status_of(done) == 200, done
    assert env.secret.encode() not in done.stdout
    assert f"you sent: Bearer {env.placeholder}".encode() in done.stdout
    if path != "/reflect-split":
        echoed = [
            line.split(b":", 1)[1].strip()
            for line in done.stdout.splitlines()
            if line.lower().startswith(b"x-echo:")
        ]
        assert echoed == [f"Bearer {env.placeholder}".encode()]
    ctype = "application/octet-stream" if binary else "text/plain"
    assert re.search(rb"(?im)^content-type: " + ctype.encode() + rb"\r?$", done.stdout)
    sent = [v for r in env.upstream.requests if r.path == target for v in header(r, "Authorization")]
    assert f"Bearer {env.secret}" in sent  # the upstream did get the secret (and reflected it)
