"""Node identity and readiness with real processes (issue 14): two ``surrogate run`` nodes with
different ``--node`` (one of them with two workers) and a ``surrogate control`` sidecar, each
writing its own audit file; every event says which node wrote it, ``/metrics`` says the node
once (``surrogate_node_info``), and ``/readyz`` answers on the control listeners."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import ROOT, ProxyProcess, free_port
from servers import Upstream
from world import Stage, claim, egress, rules

pytestmark = pytest.mark.e2e

OPERATOR = "operator-token-" + secrets.token_hex(8)


def _rules(port: int) -> str:
    return rules([egress("api.test", port)], claims=[claim("c1", token="file:token1")])


def api(socket_path: Path) -> httpx.Client:
    return httpx.Client(
        transport=httpx.HTTPTransport(uds=str(socket_path)), base_url="http://control", timeout=10
    )


def wait_socket(path: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_socket():
            try:
                with api(path) as c:
                    if c.get("/readyz").status_code == 200:
                        return
            except httpx.TransportError:
                pass
        time.sleep(0.05)
    raise AssertionError(f"{path} did not answer /readyz 200")


def read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line]


def wait_events(path: Path, count: int, timeout: float = 10.0, **match: Any) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        found = [e for e in read_events(path) if all(e.get(k) == v for k, v in match.items())]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


@dataclass
class Fleet:
    a: ProxyProcess
    b: ProxyProcess
    upstream: Upstream
    control: subprocess.Popen[bytes]
    control_dir: Path
    control_tcp: int

    def curl(self, node: ProxyProcess, path: str) -> str:
        url = f"https://api.test:{self.upstream.port}{path}"
        cmd = [
            "curl",
            "-sS",
            "--max-time",
            "20",
            "-x",
            node.url("c1", "node-test-token-1"),
            "-o",
            "/dev/null",
        ]
        cmd += ["--cacert", str(node.ca_pem), "-w", "%{http_code}", url]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False).stdout


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Stage(tmp_path_factory.mktemp("fleet")) as st:
        tmp = st.tmp
        upstream = st.upstream(["api.test"])
        st.token("node-test-token-1", file="token1")
        path = st.write(_rules(upstream.port))
        st.token(OPERATOR, file="operator")
        control_dir = tmp / "ctl"
        args = [sys.executable, "-m", "proxy", "control", "--rules", str(path), "--node", "ctl-1"]
        args += ["--state-dir", str(control_dir / "state"), "--audit-file", str(control_dir / "audit.jsonl")]
        control = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        st.defer(_stop, control)
        tcp = free_port()
        a_args = ["--node", "node-a", "--control-tcp", f"127.0.0.1:{tcp}"]
        a_args += ["--control-token-file", str(tmp / "operator")]
        (tmp / "a").mkdir()
        (tmp / "b").mkdir()
        a = st.proxy(path, ["api.test"], workdir=tmp / "a", workers=1, start=False, args=a_args)
        b = st.proxy(
            path, ["api.test"], workdir=tmp / "b", workers=2, start=False, args=["--node", "node-b.example_1"]
        )
        for node in (a, b):
            node.start()
            wait_socket(node.state_dir / "control.sock")
        wait_socket(control_dir / "state" / "control.sock")
        yield Fleet(a, b, upstream, control, control_dir, tcp)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)


def test_every_event_says_which_node_wrote_it(fleet: Fleet) -> None:
    for n in range(3):
        assert fleet.curl(fleet.a, f"/from-a/{n}") == "200"
    for n in range(8):  # two workers: the kernel spreads connections over both
        assert fleet.curl(fleet.b, f"/from-b/{n}") == "200"
    for node, tag in ((fleet.a, "a"), (fleet.b, "b")):
        with api(node.state_dir / "control.sock") as c:
            assert c.post("/v1/claims", json={"id": f"made-on-{tag}", "pool": "p"}).status_code == 201
    with api(fleet.control_dir / "state" / "control.sock") as c:
        assert c.post("/v1/claims", json={"id": "made-on-ctl", "pool": "p"}).status_code == 201
    os.kill(fleet.a.proc.pid, signal.SIGHUP)  # type: ignore[union-attr]  # a reload event
    a_events = wait_events(fleet.a.audit_path, 5, event="request") + wait_events(
        fleet.a.audit_path, 1, event="reload"
    )
    b_events = wait_events(fleet.b.audit_path, 8, event="request")
    ctl_events = wait_events(fleet.control_dir / "audit.jsonl", 1, event="control")
    everything = {
        "node-a": read_events(fleet.a.audit_path),
        "node-b.example_1": read_events(fleet.b.audit_path),
        "ctl-1": read_events(fleet.control_dir / "audit.jsonl"),
    }
    # every line of every process says its node; node-b's lines come from its two workers
    # (requests: whichever worker the kernel gave the connection; control: worker 0)
    for name, events in everything.items():
        assert events and {e["node"] for e in events} == {name}, name
    kinds_a = {e["event"] for e in everything["node-a"]}
    assert {"request", "control", "reload"} <= kinds_a
    assert {"request", "control"} <= {e["event"] for e in everything["node-b.example_1"]}
    paths_a = {e["path"] for e in a_events if e["event"] == "request"}
    paths_b = {e["path"] for e in b_events}
    assert {f"/from-a/{n}" for n in range(3)} <= paths_a and not any(p.startswith("/from-b") for p in paths_a)
    assert {f"/from-b/{n}" for n in range(8)} == paths_b
    assert [e["claim"] for e in ctl_events] == ["made-on-ctl"]


NODE_INFO = re.compile(r'^surrogate_node_info\{node="([^"]*)"\} 1\.0$', re.M)


@pytest.mark.parametrize(("which", "name"), [("a", "node-a"), ("b", "node-b.example_1"), ("ctl", "ctl-1")])
def test_metrics_name_the_node_once_and_on_no_other_series(fleet: Fleet, which: str, name: str) -> None:
    sock = {
        "a": fleet.a.state_dir,
        "b": fleet.b.state_dir,
        "ctl": fleet.control_dir / "state",
    }[which] / "control.sock"
    with api(sock) as c:
        text = c.get("/metrics").text
    assert NODE_INFO.findall(text) == [name]
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert [s for s in samples if "node=" in s and not s.startswith("surrogate_node_info")] == []


@pytest.mark.parametrize(("which", "name"), [("a", "node-a"), ("b", "node-b.example_1"), ("ctl", "ctl-1")])
def test_readyz_says_ready_with_the_store_version(fleet: Fleet, which: str, name: str) -> None:
    sock = {"a": fleet.a.state_dir, "b": fleet.b.state_dir, "ctl": fleet.control_dir / "state"}[which]
    with api(sock / "control.sock") as c:
        r = c.get("/readyz")
        health = c.get("/healthz")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["ready"] is True and body["node"] == name and isinstance(body["store_version"], int)
    assert set(body) == {"ready", "node", "store_version"}
    assert health.status_code == 200 and health.json() == {"status": "ok"}


def test_readyz_on_the_tcp_listener_needs_no_token_and_the_rest_still_does(fleet: Fleet) -> None:
    base = f"http://127.0.0.1:{fleet.control_tcp}"
    with httpx.Client(base_url=base, timeout=10) as c:
        ready = c.get("/readyz")
        assert ready.status_code == 200 and ready.json()["node"] == "node-a"
        assert c.get("/metrics").status_code == 401
        assert c.get("/metrics", headers={"Authorization": f"Bearer {OPERATOR}"}).status_code == 200
        assert c.get("/readyz", headers={"Host": "evil.example"}).status_code == 403


def _run(tmp: Path, *extra: str, wrap: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    (tmp / "rules.yaml").write_text(rules(claims=[]))
    cmd = [
        sys.executable,
        "-m",
        "proxy",
        "run",
        "--rules",
        str(tmp / "rules.yaml"),
        "--state-dir",
        str(tmp / "s"),
    ]
    cmd += ["--listen", f"127.0.0.1:{free_port()}", "--workers", "1", *extra]
    return subprocess.run(
        (wrap or []) + cmd, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize("bad", ["bad name", "-lead", "x" * 64, "n\u00f6de", "a/b"])
def test_a_bad_node_name_is_refused_before_anything_starts(tmp_path: Path, bad: str) -> None:
    done = _run(tmp_path, f"--node={bad}")  # "=": argparse would take "-lead" for an option
    assert done.returncode == 1
    assert f"surrogate: {bad!r} is not a node name: use 1 to 63 ASCII letters" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare(1)")
def test_a_host_name_that_is_no_node_name_asks_for_node(tmp_path: Path) -> None:
    """The default is the host name; one that is not a valid name (here ``bad_``, set in a UTS
    namespace of this test's own) is refused with the fix, never truncated or rewritten."""
    rename = [
        sys.executable,
        "-c",
        "import os, socket, sys; socket.sethostname('bad_'); os.execv(sys.argv[1], sys.argv[1:])",
    ]
    done = _run(tmp_path, wrap=["unshare", "--uts", *rename])
    assert done.returncode == 1, done.stderr
    assert "the host name is not a node name ('bad_' is not a node name" in done.stderr
    assert "name this node with --node NAME" in done.stderr


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare(1)")
def test_without_node_the_host_name_names_the_node(tmp_path: Path) -> None:
    """Run in a UTS namespace whose host name is ``ns-host-1``: readiness, metrics and a control
    event all say that name."""
    (tmp_path / "rules.yaml").write_text(rules(claims=[]))
    rename = "import os, socket, sys; socket.sethostname('ns-host-1'); os.execv(sys.argv[1], sys.argv[1:])"
    cmd = ["unshare", "--uts", sys.executable, "-c", rename, sys.executable, "-m", "proxy", "run"]
    cmd += ["--rules", str(tmp_path / "rules.yaml"), "--state-dir", str(tmp_path / "s"), "--workers", "1"]
    cmd += ["--listen", f"127.0.0.1:{free_port()}", "--audit-file", str(tmp_path / "audit.jsonl")]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_socket(tmp_path / "s" / "control.sock")
        with api(tmp_path / "s" / "control.sock") as c:
            assert c.get("/readyz").json()["node"] == "ns-host-1"
            assert NODE_INFO.findall(c.get("/metrics").text) == ["ns-host-1"]
            assert c.post("/v1/claims", json={"id": "c9", "pool": "p"}).status_code == 201
        [event] = wait_events(tmp_path / "audit.jsonl", 1, event="control")
        assert event["node"] == "ns-host-1"
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
