"""Audit output: size-based rotation of the audit file and per-process sequence numbers."""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from harness import ROOT
from world import Stage, claim, egress, rules

pytestmark = pytest.mark.e2e


def test_rotation_keeps_backups_and_sequence_numbers_have_no_gap(tmp_path: Path) -> None:
    with Stage(tmp_path) as st:
        st.token("tok", newline=False)
        upstream = st.upstream(["api.test"])
        text = rules([egress("api.test", upstream.port)], claims=[claim("c")])
        proxy = st.proxy(text, ["api.test"], args=["--audit-max-bytes", "4000", "--audit-backups", "2"])
        ctx = ssl.create_default_context(cafile=proxy.ca_pem)
        with httpx.Client(proxy=proxy.url("c", "tok"), verify=ctx, timeout=10) as client:
            for i in range(40):
                assert client.get(f"https://api.test:{upstream.port}/rot/{i}").status_code == 200
        proxy.wait_event(path="/rot/39")
    files = sorted(tmp_path.glob("audit.jsonl*"))
    assert [f.name for f in files] == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2"]  # 2 backups kept
    assert all(f.stat().st_size <= 4000 for f in files)
    seqs = sorted(json.loads(line)["seq"] for f in files for line in f.read_text().splitlines())
    assert seqs == list(range(seqs[0], seqs[-1] + 1))  # contiguous: no line lost inside the kept files
    assert seqs[-1] == 40 and seqs[0] > 1  # the oldest rotated away

    # `audit why` finds an event wherever rotation moved it (was: only in FILE itself, exit 1)
    for name in ("audit.jsonl.2", "audit.jsonl.1", "audit.jsonl"):
        event = json.loads((tmp_path / name).read_text().splitlines()[0])
        why = subprocess.run(
            [sys.executable, "-m", "proxy", "audit", "why", event["request_id"], "--json",
             "--audit-file", str(tmp_path / "audit.jsonl"), "--rules", str(tmp_path / "rules.yaml")],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert why.returncode == 0, (name, why.stderr)
        assert json.loads(why.stdout)["event"]["path"] == event["path"]


def test_why_on_a_missing_audit_file_says_so(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(rules(pools={}, claims=[]))
    why = subprocess.run(
        [sys.executable, "-m", "proxy", "audit", "why", "some-id",
         "--audit-file", str(tmp_path / "nowhere.jsonl"), "--rules", str(tmp_path / "rules.yaml")],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert why.returncode == 1
    assert "nowhere.jsonl does not exist" in why.stderr and "Traceback" not in why.stderr
