"""``surrogate approvals ...`` against a real ``surrogate control`` process (issue 16): a pending
approval another process stored is listed, approved for 10 minutes (a grant), denied twice is
refused, the grant revoked; the answers and the audit hold no canary."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import canary
import pytest
from harness import ROOT
from inprocess import surrogate as in_process
from test_control_process import listening, start_control, stop, wait_for

from proxy.store.base import ApprovalRecord, new_id
from proxy.store.keyring import KeyRing
from proxy.store.sqlite import Store

pytestmark = pytest.mark.e2e
SECRET = canary.make("approvals-cli")


def _cli(state: Path, action: str, *args: str, process: bool = False) -> subprocess.CompletedProcess[str]:
    """``surrogate approvals ACTION``: as a process, or (the default) through the same main() in
    this process (tests/inprocess.py: the same parser, client and answers, no interpreter start)."""
    argv = ["approvals", action, "--state-dir", str(state), *args]
    if not process:
        return in_process(*argv)
    return subprocess.run(
        [sys.executable, "-m", "proxy", *argv], cwd=ROOT, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip


def test_list_approve_for_a_while_then_revoke_through_the_cli(tmp_path: Path) -> None:
    proc = start_control(tmp_path)
    state = tmp_path / "state"
    try:
        wait_for(lambda: listening(state / "control.sock"))
        now = time.time()
        asked = ApprovalRecord(
            id="-" + new_id()[1:], claim_id="c1", pool="p", method="POST", host="api.test",
            port=443, path="/v1/x", credentials=("k",), preview='{"q": "REDACTED"}', rule="r",
            scopes=("once", "for"), created_at=now, expires_at=now + 60, request_id="req-9",
        )  # fmt: skip
        with Store.open(state / "store.sqlite3", KeyRing.load_or_create(state / "store.key")) as store:
            store.add_approval(asked)  # as the node holding the request would
        listed = _cli(state, "list", process=True)
        assert listed.returncode == 0, listed.stderr
        assert [a["id"] for a in json.loads(listed.stdout)] == [asked.id]
        # an id that begins with "-" (a stored one could: before new_id, 1 in 64 did) goes after "--"
        bad = _cli(state, "approve", "--scope", "always", "--", asked.id)
        assert bad.returncode == 1 and "not offered" in bad.stderr
        done = _cli(state, "approve", "--scope", "for:10m", "--", asked.id)
        assert done.returncode == 0, done.stderr
        grant = json.loads(done.stdout)["grant"]
        assert grant["scope"] == "for" and grant["path_prefix"] == "/v1/x"
        assert not grant["id"].startswith("-")  # the ids surrogate makes never need "--"
        again = _cli(state, "deny", "--", asked.id)
        assert again.returncode == 1 and "409" in again.stderr and "no longer pending" in again.stderr
        assert [g["id"] for g in json.loads(_cli(state, "grants").stdout)] == [grant["id"]]
        assert _cli(state, "revoke", grant["id"]).returncode == 0
        assert json.loads(_cli(state, "grants").stdout) == []
        assert json.loads(_cli(state, "list").stdout) == []
    finally:
        stop(proc)
    events = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert {"approval_decided", "grant_created", "grant_revoked"} <= set(kinds), kinds
    decided = next(e for e in events if e["event"] == "approval_decided")
    assert decided["request_id"] == "req-9" and decided["who"] == "socket"
    assert SECRET not in (tmp_path / "audit.jsonl").read_text()
