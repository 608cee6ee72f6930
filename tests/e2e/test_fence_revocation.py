"""Revocation is the same for transparent claims (issue 13 class 8, issue 21): a connection belongs
to the claim its source address identified when it opened. Once the source identifies another claim
or none (a control-API claim deleted, a rules reload that drops the claim), the open connection is
closed, a long-lived stream included, and a new connection from that source is refused.

    netns sg-host-*: surrogate (root) --transparent, the printed ``--uid`` fence for ``nobody``;
                     the sandbox is a ``nobody`` process there, source 10.247.0.1
        ──veth── netns sg-up-*: 10.247.0.2:80, a plain-HTTP upstream streaming a chunk every 0.2 s
"""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from _netns import Lab, NsProxy, load_printed, missing, sh
from harness import ROOT, free_port
from world import Stage, claim, control, egress, rules

pytestmark = pytest.mark.e2e

SANDBOX, UPSTREAM = "10.247.0.1", "10.247.0.2"
SYSTEM_PYTHON = "/usr/bin/python3"

STREAMER = """
import http.server, time
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(150):  # 30 s: far longer than the test waits for the close
            data = f"data: {i}\\n\\n".encode()
            self.wfile.write(b"%x\\r\\n%s\\r\\n" % (len(data), data))
            self.wfile.flush()
            time.sleep(0.2)
        self.wfile.write(b"0\\r\\n\\r\\n")
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("UPSTREAM_ADDR", 80), H).serve_forever()
""".replace("UPSTREAM_ADDR", UPSTREAM)

CLIENT = """
import socket, sys, time
s = socket.create_connection(("UPSTREAM_ADDR", 80), timeout=40)
s.sendall(b"GET /PATH HTTP/1.1\\r\\nHost: api.test\\r\\n\\r\\n")
first = s.recv(65536)
print("first", first.split(b"\\r\\n", 1)[0].decode(), flush=True)
while True:
    try:
        data = s.recv(65536)
    except OSError as e:
        print("error", type(e).__name__, flush=True)
        break
    if not data:
        print("eof", flush=True)
        break
""".replace("UPSTREAM_ADDR", UPSTREAM)

_POOL = {"egress": [egress("api.test", 80, scheme="http")], "allow_cidrs": ["10.247.0.0/16"]}
RULES = rules(pools={"p": _POOL}, claims=[])
RULES_CLAIM = rules(pools={"p": _POOL}, claims=[claim("sbx", sources=[f"{SANDBOX}/32"])])


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[Lab, str, NsProxy, Path]]:
    why = missing("runuser") or (None if Path(SYSTEM_PYTHON).exists() else f"needs {SYSTEM_PYTHON}")
    if why:
        pytest.skip(why)
    with Stage(tmp_path) as st:
        lab = Lab()
        st.defer(lab.teardown)
        host, up = lab.add("host"), lab.add("up")
        lab.link(host, f"sg-hu-{lab.tag}", up, "eth0")
        lab.addr(host, f"sg-hu-{lab.tag}", f"{SANDBOX}/24")
        lab.addr(up, "eth0", f"{UPSTREAM}/24")
        upstream = subprocess.Popen(["ip", "netns", "exec", up, sys.executable, "-c", STREAMER])
        st.defer(upstream.wait)
        st.defer(upstream.kill)
        st.token("unused-in-transparent-mode", newline=False)
        tport = free_port()
        proxy = st.proxy(
            RULES_CLAIM,
            {"api.test": UPSTREAM},
            upstream_ca=None,
            cls=partial(NsProxy, host),
            args=["--transparent", f"[::]:{tport}"],
        )
        nobody = pwd.getpwnam("nobody").pw_uid
        printed = subprocess.run(
            [sys.executable, "-m", "proxy", "transparent-rules", "--port", str(tport),
             "--uid", str(nobody), "--proxy-uid", str(os.geteuid())],
            cwd=ROOT, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        load_printed(printed, host, "iptables")
        yield lab, host, proxy, proxy.rules


def open_stream(host: str, path: str) -> subprocess.Popen[str]:
    script = CLIENT.replace("PATH", path)
    client = subprocess.Popen(  # the system Python: nobody may not read the test's venv
        ["ip", "netns", "exec", host, "runuser", "-u", "nobody", "--", SYSTEM_PYTHON, "-c", script],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert client.stdout is not None
    first = client.stdout.readline().split()
    assert first[:2] == ["first", "HTTP/1.1"] and first[2] == "200", first
    return client


def ends_within(client: subprocess.Popen[str], seconds: float) -> str | None:
    try:
        out, _ = client.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        return None
    return out.strip()


@pytest.mark.parametrize("how", ["store-claim-deleted", "rules-claim-reloaded-away"])
def test_a_revoked_transparent_claims_open_stream_is_closed(
    world: tuple[Lab, str, NsProxy, Path], how: str
) -> None:
    _, host, proxy, rules = world
    if how == "store-claim-deleted":
        rules.write_text(RULES)
        assert proxy.proc is not None
        os.kill(proxy.proc.pid, signal.SIGHUP)  # the rules-file claim goes: a store claim takes the source
        time.sleep(0.5)
        with control(proxy, timeout=10) as api:
            made = api.post("/v1/claims", json={"id": "sbx", "pool": "p", "sources": [f"{SANDBOX}/32"]})
            assert made.status_code == 201, made.text
        time.sleep(0.5)  # the next poll sees it
    client = open_stream(host, f"stream/{how}")
    try:
        assert ends_within(client, 1.5) is None  # a live stream: it does not end on its own
        revoked_at = time.monotonic()
        if how == "store-claim-deleted":
            with control(proxy, timeout=10) as api:
                assert api.delete("/v1/claims/sbx").status_code == 204
        else:
            rules.write_text(RULES)
            assert proxy.proc is not None
            os.kill(proxy.proc.pid, signal.SIGHUP)
        ended = ends_within(client, 5)
        assert ended is not None, "the revoked claim's stream went on"
        assert time.monotonic() - revoked_at < 3
    finally:
        client.kill()
        client.wait()
    # a new connection from that source is refused: the source identifies no claim now
    again = sh("runuser", "-u", "nobody", "--", "curl", "-sS", "--max-time", "10", "-w", "\n%{http_code}",
               f"http://{UPSTREAM}/again", "-H", "Host: api.test", ns=host, check=False)  # fmt: skip
    assert again.stdout.endswith("403") and "unknown_source" in again.stdout, again
    event = proxy.wait_event(path="/again")
    assert event["reason"] == "unknown_source"
