"""`surrogate control` as a sidecar process: schemathesis against its OpenAPI document, and
acknowledged writes surviving SIGKILL at random moments."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from harness import ROOT, free_port
from world import egress, rules

from proxy.store.keyring import KeyRing
from proxy.store.sqlite import Store

pytestmark = pytest.mark.e2e

RULES = rules([egress("api.test"), egress("*.example.test")], claims=[])


def start_control(tmp: Path, *extra: str) -> subprocess.Popen[bytes]:
    (tmp / "rules.yaml").write_text(RULES)
    args = [
        sys.executable,
        "-m",
        "proxy",
        "control",
        "--rules",
        str(tmp / "rules.yaml"),
        "--state-dir",
        str(tmp / "state"),
        "--audit-file",
        str(tmp / "audit.jsonl"),
        *extra,
    ]
    with open(tmp / "control.stderr", "ab") as err:
        return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)


def wait_for(check, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (httpx.TransportError, OSError):
            pass
        time.sleep(0.05)
    raise AssertionError("control API did not come up")


def listening(path: Path) -> bool:
    # A plain socket probe: httpx's UDS transport leaks its socket when connect() is refused.
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, sig)
        proc.wait(timeout=10)


def test_schemathesis_finds_no_server_error_and_no_schema_violation(tmp_path: Path) -> None:
    port = free_port()
    token = "operator-token-" + os.urandom(8).hex()
    (tmp_path / "token").write_text(token + "\n")
    proc = start_control(
        tmp_path,
        "--control-socket",
        "none",
        "--control-tcp",
        f"127.0.0.1:{port}",
        "--control-token-file",
        str(tmp_path / "token"),
    )
    try:
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200)
        # positive_data_acceptance is left out on purpose: a pool must exist in the rules file and a
        # host must be covered by one of its rules, which no JSON schema can say; such requests get
        # a specific 422 (tested row by row in tests/unit/control/test_checks.py).
        done = subprocess.run(
            [
                str(Path(sys.executable).parent / "schemathesis"),
                "run",
                f"http://127.0.0.1:{port}/openapi.json",
                "--checks",
                "all",
                "--exclude-checks",
                "positive_data_acceptance",
                "--max-examples",
                "25",
                "--seed",
                "1",
                "-H",
                f"Authorization: Bearer {token}",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        stop(proc)
    assert done.returncode == 0, done.stdout[-4000:]
    assert " passed" in done.stdout


def test_acknowledged_writes_survive_sigkill(tmp_path: Path) -> None:
    sock = tmp_path / "state" / "control.sock"
    rng = random.Random(7)
    acked: dict[str, int] = {}  # credential name -> last acknowledged value number
    for round_ in range(5):
        proc = start_control(tmp_path)
        try:
            if sock.exists():
                sock.unlink()  # the killed run's socket file
            wait_for(lambda: listening(sock))
            transport = httpx.HTTPTransport(uds=str(sock))
            with httpx.Client(transport=transport, base_url="http://control", timeout=10) as api:
                if round_ == 0:
                    assert api.post("/v1/claims", json={"id": "c", "pool": "p"}).status_code == 201
                kill_after = rng.randint(5, 40)
                for n in range(kill_after):
                    name = f"k{n % 7}"
                    r = api.put(
                        f"/v1/claims/c/credentials/{name}",
                        json={"hosts": ["api.test"], "value": f"v{round_}-{n}"},
                    )
                    assert r.status_code in (200, 201), r.text
                    acked[name] = n + round_ * 1000
        finally:
            stop(proc, signal.SIGKILL)
    with Store.open(
        tmp_path / "state" / "store.sqlite3", KeyRing.load_or_create(tmp_path / "state" / "store.key")
    ) as store:
        for name, n in acked.items():
            value, _ = store.secret("c", name)
            assert value.decode() == f"v{n // 1000}-{n % 1000}"
        claims, creds = store.snapshot()
        assert [c.id for c in claims] == ["c"] and len(creds) == len(acked)


def test_keys_rotate_re_encrypts_and_values_still_read(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with Store.open(state / "store.sqlite3", KeyRing.load_or_create(state / "store.key")) as store:
        store.create_claim("c", "p")
        for i in range(5):
            store.put_credential("c", f"k{i}", value=f"CANARYrot{i}".encode(), hosts=["api.test"])
    old_key = KeyRing.load_or_create(state / "store.key").current
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "keys", "rotate", "--state-dir", str(state)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "5 stored values re-encrypted" in done.stdout
    ring = KeyRing.load_or_create(state / "store.key")
    assert ring.current != old_key and old_key not in ring.key_ids  # the old key is retired
    with Store.open(state / "store.sqlite3", ring) as store:
        assert [store.secret("c", f"k{i}")[0] for i in range(5)] == [
            f"CANARYrot{i}".encode() for i in range(5)
        ]
    resumed = subprocess.run(
        [sys.executable, "-m", "proxy", "keys", "rotate", "--resume", "--state-dir", str(state)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert resumed.returncode == 0 and "0 stored values" in resumed.stdout
