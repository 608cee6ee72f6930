"""An acknowledged store write survives ``kill -9`` of the writer at any moment (invariant 6).

A child process writes one credential over and over, printing ``ACK <n>`` once each
``put_credential`` has returned. The parent SIGKILLs it at a random point, several rounds on the
same file, and after each kill checks that the file is intact and that no acknowledged write is
lost (the value written at version ``n`` is ``n``, so the stored version is at least the last ack).
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from proxy.store.keyring import KeyRing
from proxy.store.sqlite import FILENAME, Store

ROOT = Path(__file__).resolve().parents[3]

WRITER = """
import sys
from pathlib import Path
from proxy.store.keyring import KeyRing
from proxy.store.sqlite import Store

state = Path(sys.argv[1])
with Store.open(state, KeyRing.load_or_create(state / "keys.json")) as store:
    if store.get_claim("c1") is None:
        store.create_claim("c1", "agents")
    current = store.get_credential("c1", "gh")
    n = current.version if current else 0
    while True:
        n += 1
        rec = store.put_credential("c1", "gh", value=b"value %d" % n, hosts=["api.github.com"])
        assert rec.version == n, (rec.version, n)
        print("ACK", n, flush=True)
"""


def _integrity(path: Path) -> str:
    db = sqlite3.connect(path)
    try:
        return str(db.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        db.close()


@pytest.mark.e2e
def test_acknowledged_writes_survive_sigkill_at_random_points(tmp_path: Path) -> None:
    rng = random.Random(os.environ.get("STORE_CRASH_SEED", time.time_ns()))
    acked = 0
    deadline = time.monotonic() + 12
    rounds = 0
    while rounds < 5 or (rounds < 8 and time.monotonic() < deadline - 2):
        rounds += 1
        stop_after = rng.randint(5, 60)
        with subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
        ) as child:
            assert child.stdout is not None
            seen = 0
            while seen < stop_after:
                line = child.stdout.readline()
                assert line.startswith("ACK "), f"writer died early (round {rounds}): {line!r}"
                acked = int(line.split()[1])
                seen += 1
            time.sleep(rng.random() * 0.004)  # land the kill anywhere in the next write
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=10)
        assert child.returncode == -signal.SIGKILL
        assert _integrity(tmp_path / FILENAME) == "ok"
        with Store.open(tmp_path, KeyRing.load_or_create(tmp_path / "keys.json")) as store:
            value, version = store.secret("c1", "gh")
        assert version >= acked, f"round {rounds}: acked {acked}, found version {version}"
        assert value == b"value %d" % version
    assert rounds >= 5 and time.monotonic() < deadline + 3
