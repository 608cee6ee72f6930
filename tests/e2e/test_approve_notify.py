"""The approvals notification command (issue 16): run once per new pending approval with a JSON
document on its stdin (a real script writes what it read to a file: the fields an operator
needs, the redacted preview, never a secret: the canary scan reads the file); a command that
fails or runs past its timeout blocks nothing and approves nothing, and is audited with why."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from harness import ProxyProcess
from servers import Upstream
from world import Stage, claim, control, credential, egress, rules

pytestmark = pytest.mark.e2e
PH = "surr_ApproveNotifyPlaceholder001"
SCRIPT = """#!{python}
import json, pathlib, sys, time
data = sys.stdin.buffer.read()
doc = json.loads(data)
(pathlib.Path(sys.argv[1]) / (doc["id"] + ".json")).write_bytes(data)
if "/fail" in doc["path"]:
    sys.exit(3)
if "/slow" in doc["path"]:
    time.sleep(30)
"""


@dataclass
class World:
    stage: Stage
    upstream: Upstream
    proxy: ProxyProcess
    token: str
    secret: str
    out: Path

    def post(self, path: str, body: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                "curl", "-sS", "--max-time", "40", "-x", self.proxy.url("c1", self.token),
                "--cacert", str(self.proxy.ca_pem), "-w", "\n%{http_code}",
                "-H", f"Authorization: Bearer {PH}", "-H", "Content-Type: application/json",
                "--data-binary", body,
                f"https://api.test:{self.upstream.port}{path}",
            ],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip

    def done(self, proc: subprocess.Popen[bytes]) -> int:
        out, err = proc.communicate(timeout=60)
        self.stage.received.append(out + err)
        return int(out.rpartition(b"\n")[2] or 0)

    def pending(self, path: str) -> dict[str, Any]:
        deadline = time.monotonic() + 15
        with control(self.proxy) as api:
            while time.monotonic() < deadline:
                mine = [a for a in api.get("/approvals").json() if a["path"] == path]
                if mine:
                    return dict(mine[0])
                time.sleep(0.05)
        raise AssertionError(f"no pending approval for {path}")

    def state(self, approval_id: str) -> str:
        with control(self.proxy) as api:
            every = api.get("/approvals", params={"state": "all"}).json()
        return str(next(a["state"] for a in every if a["id"] == approval_id))

    def decide(self, approval_id: str, verdict: str) -> None:
        with control(self.proxy) as api:
            got = api.post(
                f"/approvals/{approval_id}/{verdict}", json={"scope": "once"} if verdict == "approve" else {}
            )
        assert got.status_code == 200, got.text

    def told(self, approval_id: str) -> bytes:
        path = self.out / f"{approval_id}.json"
        deadline = time.monotonic() + 15
        while not path.exists() or not path.read_bytes().endswith(b"\n"):
            assert time.monotonic() < deadline, "the notification command never ran"
            time.sleep(0.05)
        return path.read_bytes()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with Stage(tmp_path_factory.mktemp("notify")) as st:
        token, secret = st.token(), st.secret("api")
        out = st.tmp / "told"
        out.mkdir()
        script = st.tmp / "notify-ops"
        script.write_text(SCRIPT.format(python=sys.executable))
        script.chmod(0o755)
        up = st.upstream(["api.test"])
        text = rules(
            [egress("api.test", up.port, approve={"methods": ["POST"], "paths": ["/send"], "timeout": 30})],
            claims=[claim("c1", [credential("api", PH, ["api.test"], surfaces=["header", "body"])])],
            approvals={"notify": [str(script), str(out)], "timeout": 1},
        )
        proxy = st.proxy(text, resolve=["api.test"], control=True)
        yield World(st, up, proxy, token, secret, out)


def test_each_new_approval_is_told_to_the_command_without_a_secret(world: World) -> None:
    proc = world.post("/send/mail", json.dumps({"to": "ops@example.com", "key": PH, "pasted": world.secret}))
    asked = world.pending("/send/mail")
    raw = world.told(asked["id"])
    assert world.secret.encode() not in raw
    doc = json.loads(raw)
    assert {k: doc[k] for k in ("event", "id", "request_id", "claim", "pool", "method", "host", "path")} == {
        "event": "approval_asked", "id": asked["id"], "request_id": asked["request_id"], "claim": "c1",
        "pool": "p", "method": "POST", "host": "api.test", "path": "/send/mail",
    }  # fmt: skip
    assert doc["credentials"] == ["api"] and doc["expires_at"] == asked["expires_at"]
    assert doc["preview"] == asked["preview"] and '"to": "ops@example.com"' in doc["preview"]
    assert f'"pasted": "{PH}"' in doc["preview"]
    world.decide(asked["id"], "approve")
    assert world.done(proc) == 200
    event = world.proxy.wait_event(event="approval_notified", approval=asked["id"])
    assert event["outcome"] == "sent" and event["reason"] is None
    assert len(list(world.out.glob(f"{asked['id']}.json"))) == 1  # once per approval


@pytest.mark.parametrize(
    ("path", "reason"), [("/send/fail", "exited 3"), ("/send/slow", "ran past its timeout of 1 s")]
)
def test_a_failing_command_neither_blocks_nor_decides(world: World, path: str, reason: str) -> None:
    before = world.upstream.connections
    proc = world.post(path, '{"n": 1}')
    asked = world.pending(path)
    world.told(asked["id"])
    event = world.proxy.wait_event(timeout=10, event="approval_notified", approval=asked["id"])
    assert event["outcome"] == "failed" and event["reason"] == reason
    assert world.state(asked["id"]) == "pending" and proc.poll() is None  # still held, undecided
    assert world.upstream.connections == before
    world.decide(asked["id"], "deny")
    assert world.done(proc) == 403
    assert world.upstream.connections == before
