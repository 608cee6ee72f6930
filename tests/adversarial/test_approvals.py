"""A hostile sandbox against approvals (issue 16; review r-approve): a real proxy process with its
control socket, an ask rule (``approve:``) on POSTs under ``/send`` of api.test (a real HTTPS
upstream on loopback), a rules-file claim ``c1`` and store claims made through the control API.

- A grant is made only from a path with one reading: an approval of an ambiguous path (dot
  segment, encoded slash) would otherwise grant ``/`` (its canonical reading), and one of
  ``/send//x`` or ``/send/x;p`` a path the server may read as another resource.
- A ``session`` grant is the claim's *generation*: a store claim deleted and created again under
  the same id (a new sandbox, version 1 again) does not inherit it.
- A held request whose claim is deleted (or changed) while it waits is refused when approved:
  it never reaches the upstream with the revoked claim's credentials.
- The approvals a claim may have pending at once are bounded (429 ``approval_limit``): a
  sandbox cannot fill the store and the page with held requests.
"""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import ProxyProcess
from servers import Upstream
from world import Stage, claim, control, credential, egress, rules

pytestmark = pytest.mark.e2e
PH = "surr_RApproveHoldPlaceholder01"
HELD = 3  # limits.approvals: requests of one claim held at once


def _rules(port: int) -> str:
    ask = {"methods": ["POST"], "paths": ["/send"], "timeout": 30}
    return rules(
        [egress("api.test", port, approve=ask), egress("other.test", port)],
        claims=[claim("c1", [credential("api", PH, ["api.test"])])],
        pool_extra={"limits": {"approvals": HELD}},
    )


@dataclass
class Asked:
    stage: Stage
    upstream: Upstream
    proxy: ProxyProcess
    token: str

    def post(self, path: str, who: str = "c1", token: str | None = None) -> subprocess.Popen[bytes]:
        """curl -X POST through the proxy as ``who``, in the background (it waits while held)."""
        return subprocess.Popen(
            [
                "curl", "-sS", "--path-as-is", "--max-time", "40", "-x",
                self.proxy.url(who, token or self.token), "--cacert", str(self.proxy.ca_pem),
                "-w", "\n%{http_code}", "-X", "POST", "-H", f"Authorization: Bearer {PH}",
                "--data-binary", "{}", f"https://api.test:{self.upstream.port}{path}",
            ],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip

    def done(self, proc: subprocess.Popen[bytes], timeout: float = 45) -> tuple[int, bytes]:
        out, err = proc.communicate(timeout=timeout)
        self.stage.received.append(out + err)
        body, _, code = out.rpartition(b"\n")
        return int(code or 0), body

    def pending(self, path: str, timeout: float = 10) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with control(self.proxy) as api:
            while time.monotonic() < deadline:
                got = [a for a in api.get("/approvals").json() if a["path"] == path]
                if got:
                    [one] = got
                    return dict(one)
                time.sleep(0.05)
        raise AssertionError(f"no pending approval for {path}")

    def none_pending(self, path: str, wait: float = 1.0) -> bool:
        time.sleep(wait)
        with control(self.proxy) as api:
            return not [a for a in api.get("/approvals").json() if a["path"] == path]

    def decide(self, approval_id: str, verdict: str, scope: str | None = None) -> httpx.Response:
        with control(self.proxy) as api:
            return api.post(f"/approvals/{approval_id}/{verdict}", json={"scope": scope} if scope else {})

    def seen(self, path: str) -> int:
        return sum(1 for r in list(self.upstream.requests) if r.path == path)


@pytest.fixture(scope="module")
def asked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Asked]:
    with Stage(tmp_path_factory.mktemp("rapprove")) as st:
        token = st.token()
        st.secret("api")
        up = st.upstream(["api.test"])
        proxy = st.proxy(_rules(up.port), resolve=["api.test"], control=True)
        yield Asked(st, up, proxy, token)


# each: a path whose approval must not become a grant (no single reading of what it names)
MANY_READINGS = {
    "dot-segment": "/send/a/%2e%2e/b",
    "raw-dot-segment": "/send/a/../b",
    "encoded-slash": "/send/a%2Fb",
    "double-slash": "/send//c",
    "matrix-param": "/send/d;p",
}


@pytest.mark.parametrize(("name", "path"), list(MANY_READINGS.items()), ids=list(MANY_READINGS))
def test_a_path_with_more_than_one_reading_is_approved_only_once(asked: Asked, name: str, path: str) -> None:
    proc = asked.post(path)
    record = asked.pending(path)
    assert record["scopes"] == ["once"], record
    for scope in ("for:10m", "always", "session"):
        refused = asked.decide(record["id"], "approve", scope)
        assert refused.status_code == 422 and refused.json()["error"] == "bad_scope", refused.text
    with control(asked.proxy) as api:
        assert not [g for g in api.get("/grants").json() if g["approval_id"] == record["id"]]
    assert asked.decide(record["id"], "approve", "once").status_code == 200
    asked.done(proc)
    # nothing was granted: the next POST under /send asks again
    probe = asked.post(f"/send/probe-{name}")
    again = asked.pending(f"/send/probe-{name}")
    assert asked.decide(again["id"], "deny").status_code == 200
    assert asked.done(probe)[0] == 403


def test_a_plain_path_still_offers_every_scope(asked: Asked) -> None:
    proc = asked.post("/send/plain")
    record = asked.pending("/send/plain")
    assert record["scopes"] == ["once", "session", "for", "always"]
    assert asked.decide(record["id"], "deny").status_code == 200
    assert asked.done(proc)[0] == 403


def _store_claim(asked: Asked, cid: str) -> str:
    with control(asked.proxy) as api:
        made = api.post("/v1/claims", json={"id": cid, "pool": "p"})
        assert made.status_code == 201, made.text
        return str(made.json()["proxy_token"])


def test_a_session_grant_is_not_inherited_by_a_claim_made_again_under_its_id(asked: Asked) -> None:
    token = _store_claim(asked, "s1")
    proc = asked.post("/send/session", "s1", token)
    record = asked.pending("/send/session")
    assert asked.decide(record["id"], "approve", "session").status_code == 200
    assert asked.done(proc)[0] == 200
    code, _ = asked.done(asked.post("/send/session", "s1", token))  # inside the session: unasked
    assert code == 200 and asked.seen("/send/session") == 2
    with control(asked.proxy) as api:
        assert api.delete("/v1/claims/s1").status_code == 204
    fresh = _store_claim(asked, "s1")  # another sandbox, the same id, version 1 again
    proc = asked.post("/send/session", "s1", fresh)
    record = asked.pending("/send/session")  # asked again: another session
    assert asked.decide(record["id"], "deny").status_code == 200
    assert asked.done(proc)[0] == 403 and asked.seen("/send/session") == 2
    with control(asked.proxy) as api:
        assert api.delete("/v1/claims/s1").status_code == 204


def test_a_held_request_whose_claim_is_deleted_is_not_sent_when_approved(asked: Asked) -> None:
    token = _store_claim(asked, "s2")
    before = asked.upstream.connections
    proc = asked.post("/send/revoked", "s2", token)
    record = asked.pending("/send/revoked")
    with control(asked.proxy) as api:
        assert api.delete("/v1/claims/s2").status_code == 204
    answer = asked.decide(record["id"], "approve", "once")
    assert answer.status_code in (200, 409), answer.text  # 409: already withdrawn (client closed)
    code, _ = asked.done(proc)
    assert code != 200
    time.sleep(0.5)
    assert asked.seen("/send/revoked") == 0 and asked.upstream.connections == before


def test_a_claims_grants_end_with_it_and_a_claim_made_again_under_its_id_is_asked(asked: Asked) -> None:
    token = _store_claim(asked, "s3")
    proc = asked.post("/send/standing", "s3", token)
    record = asked.pending("/send/standing")
    grant = asked.decide(record["id"], "approve", "always").json()["grant"]
    assert asked.done(proc)[0] == 200
    with control(asked.proxy) as api:
        assert api.delete("/v1/claims/s3").status_code == 204
        assert grant["id"] not in [g["id"] for g in api.get("/grants").json()]
        [gone] = [g for g in api.get("/grants", params={"all": "true"}).json() if g["id"] == grant["id"]]
        assert gone["revoked_at"] is not None and gone["revoked_by"] == "claim deleted"
    fresh = _store_claim(asked, "s3")  # another sandbox under the same id
    proc = asked.post("/send/standing", "s3", fresh)
    again = asked.pending("/send/standing")
    assert asked.decide(again["id"], "deny").status_code == 200
    assert asked.done(proc)[0] == 403 and asked.seen("/send/standing") == 1
    with control(asked.proxy) as api:
        assert api.delete("/v1/claims/s3").status_code == 204


def test_a_claim_holds_at_most_its_limit_of_requests_and_others_are_still_asked(asked: Asked) -> None:
    held = [asked.post(f"/send/cap{i}") for i in range(HELD)]
    records = [asked.pending(f"/send/cap{i}") for i in range(HELD)]
    started = time.monotonic()
    code, body = asked.done(asked.post("/send/cap-over"))
    assert code == 429 and b'"error": "approval_limit"' in body, body
    assert time.monotonic() - started < 10  # refused at once, not held
    assert asked.none_pending("/send/cap-over", wait=0) and asked.seen("/send/cap-over") == 0
    event = asked.proxy.wait_event(event="request", path="/send/cap-over")
    assert event["reason"] == "approval_limit" and event["status"] == 429
    token = _store_claim(asked, "s4")  # another claim of the pool is not held hostage
    other = asked.post("/send/cap-other", "s4", token)
    theirs = asked.pending("/send/cap-other")
    assert asked.decide(theirs["id"], "deny").status_code == 200
    assert asked.done(other)[0] == 403
    for proc, record in zip(held, records, strict=True):
        assert asked.decide(record["id"], "deny").status_code == 200
        assert asked.done(proc)[0] == 403
    again = asked.post("/send/cap-again")  # decided ones no longer count
    record = asked.pending("/send/cap-again")
    assert asked.decide(record["id"], "deny").status_code == 200
    assert asked.done(again)[0] == 403
    with control(asked.proxy) as api:
        assert api.delete("/v1/claims/s4").status_code == 204


def _rss_mib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    raise AssertionError("no VmRSS")


BIG = 96 * 1024 * 1024


@pytest.mark.parametrize("proto", ["--http1.1", "--http2"])
def test_a_held_upload_is_not_read_into_memory_and_goes_out_whole_once_approved(
    asked: Asked, proto: str
) -> None:
    """mitmproxy queued everything it read while a hook was pending: a held 96 MiB upload grew
    the proxy by about as much. Now the client is back-pressured until the decision."""
    path = f"/send/big{proto[2:]}"
    before = _rss_mib(asked.proxy.proc.pid)  # type: ignore[union-attr]
    zeros = subprocess.Popen(["head", "-c", str(BIG), "/dev/zero"], stdout=subprocess.PIPE)
    upload = subprocess.Popen(
        ["curl", "-sS", proto, "--max-time", "60", "-x", asked.proxy.url("c1", asked.token),
         "--cacert", str(asked.proxy.ca_pem), "-H", "Expect:", "-X", "POST", "-T", "-",
         "-w", "\\n%{http_code}", f"https://api.test:{asked.upstream.port}{path}"],
        stdin=zeros.stdout, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert zeros.stdout is not None
    zeros.stdout.close()  # curl holds the pipe; head ends when it has written BIG bytes
    record = asked.pending(path)
    time.sleep(3)  # long enough for a loopback client to send all of it, were it read
    grown = _rss_mib(asked.proxy.proc.pid) - before  # type: ignore[union-attr]
    assert grown < 32, f"the proxy grew by {grown} MiB while holding a {BIG >> 20} MiB upload"
    assert asked.seen(path) == 0
    assert asked.decide(record["id"], "approve", "once").status_code == 200
    code, body = asked.done(upload)
    zeros.wait(timeout=30)
    assert code == 200, body
    [got] = [r for r in list(asked.upstream.requests) if r.path == path]
    assert got.body_len == BIG


def test_a_held_request_whose_approval_vanished_from_the_store_is_refused_at_once(asked: Asked) -> None:
    """A store restored from a backup, or a row removed by hand: the node stopped at nothing
    (it polled a missing row until the client gave up). Now it is refused as withdrawn."""
    proc = asked.post("/send/vanished")
    record = asked.pending("/send/vanished")
    with contextlib.closing(sqlite3.connect(asked.proxy.state_dir / "store.sqlite3")) as db, db:
        db.execute("DELETE FROM approvals WHERE id = ?", (record["id"],))
    started = time.monotonic()
    code, body = asked.done(proc)
    assert code == 403 and b"approval_denied" in body, body
    assert time.monotonic() - started < 10 and asked.seen("/send/vanished") == 0


def test_a_credential_narrowed_while_its_request_is_held_is_not_sent_when_approved(asked: Asked) -> None:
    """The held flow kept the claim object of its start: approved after the operator moved the
    credential off this host, its value was swapped in toward the host anyway."""
    token = _store_claim(asked, "s5")
    secret = asked.stage.secret("s5k")
    with control(asked.proxy) as api:
        put = api.put("/v1/claims/s5/credentials/k", json={"hosts": ["api.test"], "value": secret})
        assert put.status_code in (200, 201), put.text
        placeholder = put.json()["placeholder"]
    proc = subprocess.Popen(
        [
            "curl", "-sS", "--max-time", "40", "-x", asked.proxy.url("s5", token),
            "--cacert", str(asked.proxy.ca_pem), "-w", "\n%{http_code}", "-X", "POST",
            "-H", f"Authorization: Bearer {placeholder}", "--data-binary", "{}",
            f"https://api.test:{asked.upstream.port}/send/narrowed",
        ],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    record = asked.pending("/send/narrowed")
    assert record["credentials"] == ["k"]
    with control(asked.proxy) as api:
        moved = api.patch("/v1/claims/s5/credentials/k", json={"hosts": ["other.test"]})
        assert moved.status_code == 200, moved.text
    assert asked.decide(record["id"], "approve", "once").status_code == 200
    code, body = asked.done(proc)
    assert code == 403, body
    got = [r for r in list(asked.upstream.requests) if r.path == "/send/narrowed"]
    assert all(secret not in " ".join(v for _, v in r.headers) for r in got)
    assert not got
    with control(asked.proxy) as api:
        assert api.delete("/v1/claims/s5").status_code == 204


def test_a_credential_added_for_the_host_while_held_makes_the_approval_void(asked: Asked) -> None:
    """The operator approved a request carrying the claim's credentials for the host as listed;
    one added meanwhile would ride along unseen: refused, to be asked again."""
    token = _store_claim(asked, "s6")
    proc = asked.post("/send/widened", "s6", token)
    record = asked.pending("/send/widened")
    assert record["credentials"] == []
    with control(asked.proxy) as api:
        value = asked.stage.secret("s6k")
        put = api.put("/v1/claims/s6/credentials/k", json={"hosts": ["api.test"], "value": value})
        assert put.status_code in (200, 201), put.text
    assert asked.decide(record["id"], "approve", "once").status_code == 200
    code, body = asked.done(proc)
    assert code == 403 and b"approval_denied" in body and b"changed while it was held" in body, body
    assert asked.seen("/send/widened") == 0
    with control(asked.proxy) as api:
        assert api.delete("/v1/claims/s6").status_code == 204


# spellings of "more than the grant": each must be asked again (None: the same claim)
NOT_COVERED = {
    "sibling-prefix": ("POST", "/send/grantx", None),
    "case": ("POST", "/send/GRANT", None),
    "dot-segment-out": ("POST", "/send/grant/../other", None),
    "encoded-dot-out": ("POST", "/send/grant/%2e%2e/other", None),
    "double-slash": ("POST", "/send//grant", None),
    "matrix-param": ("POST", "/send/grant;x", None),
    "method-case": ("post", "/send/grant", None),
    "another-claim": ("POST", "/send/grant", "s7"),
}


def test_a_grant_covers_its_path_and_below_and_nothing_spelled_otherwise(asked: Asked) -> None:
    proc = asked.post("/send/grant")
    record = asked.pending("/send/grant")
    grant = asked.decide(record["id"], "approve", "for:10m").json()["grant"]
    assert asked.done(proc)[0] == 200
    try:
        for path in ("/send/grant", "/send/grant/", "/send/grant/sub", "/send/%67rant", "/send/grant?q=1"):
            assert asked.done(asked.post(path))[0] == 200, path  # covered: no approval asked
        token = _store_claim(asked, "s7")
        for name, (method, path, who) in NOT_COVERED.items():
            proc = subprocess.Popen(
                [
                    "curl", "-sS", "--path-as-is", "--max-time", "40", "-x",
                    asked.proxy.url(who or "c1", token if who else asked.token), "--cacert",
                    str(asked.proxy.ca_pem), "-w", "\n%{http_code}", "-X", method, "--data-binary", "{}",
                    f"https://api.test:{asked.upstream.port}{path}",
                ],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )  # fmt: skip
            again = asked.pending(path)
            assert (again["method"], again["claim_id"]) == (method, who or "c1"), name
            assert asked.decide(again["id"], "deny").status_code == 200
            assert asked.done(proc)[0] == 403, name
    finally:
        with control(asked.proxy) as api:
            api.delete(f"/grants/{grant['id']}")
            api.delete("/v1/claims/s7")
