"""The audit where security teams read it, from a real proxy process: the hash chain over
``--workers 2`` and rotated files, checked by the real ``surrogate audit verify``; a restart that
continues the chain; and OpenTelemetry spans exported over OTLP/HTTP to a collector on loopback.
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import canary
import httpx
import pytest
from harness import ROOT
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from world import Stage, credential, egress, rules

pytestmark = pytest.mark.e2e
PLACEHOLDER = "surr_ChainPlaceholder00000001"


class Collector(ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver on loopback: keeps every request body it was sent."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path == "/v1/traces":
                    collector.bodies.append(body)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1/traces"

    def spans(self) -> list[dict[str, Any]]:
        out = []
        for body in self.bodies:
            req = ExportTraceServiceRequest.FromString(body)
            for rs in req.resource_spans:
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        out.append({"name": span.name, **{a.key: _plain(a.value) for a in span.attributes}})
        return out

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


def _plain(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_plain(v) for v in value.array_value.values]
    return getattr(value, kind)


class World:
    def __init__(self, st: Stage, workers: int | None = None, args: Sequence[str] = ()) -> None:
        self.tmp = st.tmp
        self.secret = st.secret("gh", tag="chain", file="secret")
        st.token("chain-token")
        self.ca = st.ca
        self.upstream = st.upstream(["api.test"])
        text = rules(
            [egress("api.test", self.upstream.port, paths=["/ok"])],
            claim_id="c",
            credentials=[credential("gh", PLACEHOLDER, ["api.test"], "file:secret")],
        )
        self.proxy = st.proxy(text, ["api.test"], workers=workers, args=args, start=False)

    def get(self, path: str, **headers: str) -> int:
        """One request on a new connection (with workers, the kernel picks one)."""
        ctx = ssl.create_default_context(cafile=self.proxy.ca_pem)
        with httpx.Client(proxy=self.proxy.url("c", "chain-token"), verify=ctx, timeout=20) as client:
            return client.get(f"https://api.test:{self.upstream.port}{path}", headers=headers).status_code

    def raw(self, head: bytes) -> bytes:
        """``head`` sent as is inside a CONNECT tunnel and TLS to api.test; the reply."""
        with socket.create_connection(("127.0.0.1", self.proxy.port), timeout=10) as sock:
            auth = base64.b64encode(b"c:chain-token").decode()
            target = f"api.test:{self.upstream.port}"
            sock.sendall(
                f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n"
                f"Proxy-Authorization: Basic {auth}\r\n\r\n".encode()
            )
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
            ctx = ssl.create_default_context(cafile=str(self.proxy.ca_pem))
            with ctx.wrap_socket(sock, server_hostname="api.test") as tls:
                tls.sendall(head)
                return tls.recv(65536)

    def wait_lines(self, count: int) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if sum(len(f.read_bytes().splitlines()) for f in self.files()) >= count:
                return
            time.sleep(0.05)

    def request_workers(self) -> set[object]:
        """The ``worker`` of every request event written so far (a line being written is skipped)."""
        seen = set()
        for f in self.files():
            for line in f.read_bytes().splitlines():
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if event.get("event") == "request":
                    seen.add(event.get("worker"))
        return seen

    def files(self) -> list[Path]:
        return sorted(self.tmp.glob("audit.jsonl*"))


def verify(*files: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "proxy", "audit", "verify", *map(str, files)]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def workers_world(tmp_path: Path) -> Iterator[World]:
    with Stage(tmp_path) as st:
        w = World(st, workers=2, args=["--audit-max-bytes", "4000", "--audit-backups", "50"])
        w.proxy.start()
        yield w


def test_workers_and_rotation_write_one_chain_that_verifies_and_edits_break(workers_world: World) -> None:
    w = workers_world
    for i in range(30):
        assert w.get(f"/ok/{i}", authorization=f"Bearer {PLACEHOLDER}") == 200
    # the proxy answers once one worker listens: on a loaded machine the second may bind after
    # these 30 connections went to the first (CI), so go on until it has written too
    deadline = time.monotonic() + 60
    while len(w.request_workers()) < 2 and time.monotonic() < deadline:
        assert w.get("/ok/more", authorization=f"Bearer {PLACEHOLDER}") == 200
    w.wait_lines(30)
    w.proxy.stop()
    files = w.files()
    assert len(files) >= 3  # rotated
    events = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    assert len({e["worker"] for e in events if e["event"] == "request"}) == 2  # both workers wrote

    done = verify(*files)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "intact: " in done.stdout

    rotated = files[1]  # audit.jsonl.1: the newest backup
    original = rotated.read_bytes()
    lines = original.splitlines(keepends=True)
    lines[2] = lines[2].replace(b'"decision": "allow"', b'"decision": "deny"')
    rotated.write_bytes(b"".join(lines))
    done = verify(*files)
    assert done.returncode == 1
    assert f"{rotated}:3: broken: changed" in done.stdout, done.stdout

    kept = original.splitlines(keepends=True)
    rotated.write_bytes(b"".join(kept[:2] + kept[3:]))
    done = verify(*files)
    assert done.returncode == 1
    assert f"{rotated}:3: broken: removed" in done.stdout, done.stdout


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    try:
        yield c
    finally:
        c.stop()


def test_a_restart_continues_the_chain_and_spans_reach_an_otlp_collector(
    tmp_path: Path, collector: Collector
) -> None:
    with Stage(tmp_path) as st:
        w = World(st, args=["--otlp-endpoint", collector.url])
        w.proxy.start()
        assert w.get("/ok/swapped", authorization=f"Bearer {PLACEHOLDER}") == 200
        assert w.get("/denied") == 403
        # a target byte that is not UTF-8: the event was lost (UnicodeEncodeError in the sink)
        reply = w.raw(b"GET /ok/\xff HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 "), reply
        w.wait_lines(3)
        w.proxy.stop()  # flushes the batched spans
        w.proxy.start()  # the same audit file: the chain goes on
        assert w.get("/ok/after-restart") == 200
        w.wait_lines(4)
    done = verify(*w.files())
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("a new chain starts") == 1  # at line 1 only: the restart followed on

    text = w.files()[0].read_text()
    assert '"path": "/ok/\\udcff"' in text, text  # written, with the byte escaped
    spans = collector.spans()
    by_path = {s["surrogate.request_id"]: s for s in spans}
    events = {e["request_id"]: e for e in map(json.loads, w.files()[0].read_text().splitlines())}
    assert set(by_path) == set(events)  # one span per audited request, from both runs
    for rid, span in by_path.items():
        e = events[rid]
        assert span["name"] == f"surrogate.{e['event']}"
        assert (span["surrogate.decision"], span["surrogate.reason"]) == (e["decision"], e["reason"])
        assert span["server.address"] == "api.test" and span["http.response.status_code"] == e["status"]
    assert [s["surrogate.credentials"] for s in spans if s["surrogate.credentials"]] == [["gh"]]
    raw = b"".join(collector.bodies)
    canary.assert_absent({"otlp export": raw}, [w.secret])
    assert PLACEHOLDER.encode() not in raw and b"/ok/" not in raw and b"/denied" not in raw


def test_no_placeholder_reaches_the_audit_ocsf_or_spans_through_a_method_or_header_name(
    tmp_path: Path, collector: Collector
) -> None:
    """Hostile review: the audit hides placeholder-shaped strings in ``host``, ``message`` and
    ``forged``; a sandbox also chooses the method (any token) and the header names, which the
    event quotes as ``method`` and in surfaces ("header NAME")."""
    ocsf_path = tmp_path / "audit.ocsf.jsonl"
    end = "Host: api.test\r\nConnection: close\r\n\r\n"
    heads = [
        f"{PLACEHOLDER} /ok/m HTTP/1.1\r\n{end}",
        f"{PLACEHOLDER.upper()} /ok/m HTTP/1.1\r\n{end}",
        f"{PLACEHOLDER}{'A' * 60} /ok/m HTTP/1.1\r\n{end}",
        f"GET /ok/h HTTP/1.1\r\n{PLACEHOLDER}: 1\r\n{end}",
        f"GET /ok/h HTTP/1.1\r\nX-{PLACEHOLDER}: {PLACEHOLDER}\r\n{end}",
        f"GET /denied HTTP/1.1\r\nX-{PLACEHOLDER}: {PLACEHOLDER}\r\n{end}",
    ]
    with Stage(tmp_path) as st:
        w = World(st, args=["--otlp-endpoint", collector.url, "--audit-ocsf-file", str(ocsf_path)])
        w.proxy.start()
        for head in heads:
            w.raw(head.encode())
        w.wait_lines(len(heads))
        w.proxy.stop()  # flushes the batched spans
    audit_text = b"".join(f.read_bytes() for f in w.files())
    assert audit_text.count(b"\n") >= len(heads), audit_text
    for name, data in {
        "audit": audit_text,
        "ocsf": ocsf_path.read_bytes(),
        "otlp": b"".join(collector.bodies),
    }.items():
        for form in (PLACEHOLDER, PLACEHOLDER.upper(), PLACEHOLDER.lower(), PLACEHOLDER[5:]):
            assert form.encode() not in data, (name, form, data[:2000])
        canary.assert_absent({name: data}, [w.secret])
