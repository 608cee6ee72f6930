"""Hot reload: a valid change applies to the next request on an open connection; an invalid one
is rejected with check's messages and traffic keeps flowing under the old rules."""

from __future__ import annotations

import json
import os
import signal
import ssl
import time
from pathlib import Path

import httpx
import pytest
from harness import ROOT, ProxyProcess
from jsonschema import Draft202012Validator
from world import Stage, claim, dump, egress, rules

pytestmark = pytest.mark.e2e


def _rules(port: int, paths: list[str], **pool: object) -> str:
    return rules([egress("api.test", port, paths=paths)], pool_extra=pool, claims=[claim("c")])


def wait_reload(proxy: ProxyProcess, count: int) -> list[dict]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        events = [e for e in proxy.audit_events() if e["event"] == "reload"]
        if len(events) >= count:
            return events
        time.sleep(0.1)
    raise AssertionError(f"no reload event #{count}: {proxy.audit_events()}")


def test_reload_on_change_and_on_sighup(tmp_path: Path) -> None:
    with Stage(tmp_path) as st:
        st.token("tok", newline=False)
        upstream = st.upstream(["api.test"])
        proxy = st.proxy(_rules(upstream.port, ["/"]), ["api.test"])
        path = proxy.rules
        ctx = ssl.create_default_context(cafile=proxy.ca_pem)
        with httpx.Client(proxy=proxy.url("c", "tok"), verify=ctx, timeout=10) as client:
            url = f"https://api.test:{upstream.port}"
            assert client.get(f"{url}/admin/1").status_code == 200
            before = upstream.connections

            path.write_text(_rules(upstream.port, ["/v1"]))  # valid: narrows the paths
            [applied] = wait_reload(proxy, 1)
            assert (applied["outcome"], applied["trigger"], applied["problems"]) == (
                "applied",
                "file_change",
                [],
            )
            r = client.get(f"{url}/admin/2")  # same keep-alive tunnel, new rules
            assert r.status_code == 403 and r.json()["error"] == "path_not_allowed"
            assert client.get(f"{url}/v1/ok").status_code == 200

            path.write_text(_rules(upstream.port, ["/v1"]) + "    colour: red\n")  # invalid
            rejected = wait_reload(proxy, 2)[1]
            assert rejected["outcome"] == "rejected"
            assert any("unknown field 'colour'" in p for p in rejected["problems"])
            assert "unknown field 'colour'" in proxy.stderr()
            assert client.get(f"{url}/v1/still").status_code == 200  # old rules in force
            assert client.get(f"{url}/admin/3").status_code == 403

            path.write_text(_rules(upstream.port, ["/"]))
            wait_reload(proxy, 3)
            assert proxy.proc is not None
            os.kill(proxy.proc.pid, signal.SIGHUP)
            assert wait_reload(proxy, 4)[3]["trigger"] == "sighup"
            assert client.get(f"{url}/admin/4").status_code == 200
            assert upstream.connections == before  # all of it on the one open connection
        schema = json.loads((ROOT / "docs" / "audit-schema.json").read_text())
        validator = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
        for event in proxy.audit_events():
            validator.validate(event)  # reload events included


def test_report_mode_allows_and_audits_would_deny(tmp_path: Path) -> None:
    with Stage(tmp_path) as st:
        st.token("tok", newline=False)
        upstream = st.upstream(["api.test"])
        proxy = st.proxy(_rules(upstream.port, ["/v1"], report=True), ["api.test"])
        ctx = ssl.create_default_context(cafile=proxy.ca_pem)
        with httpx.Client(proxy=proxy.url("c", "tok"), verify=ctx, timeout=10) as client:
            assert client.get(f"https://api.test:{upstream.port}/admin/report").status_code == 200
            assert client.get(f"https://api.test:{upstream.port}/v1/fine").status_code == 200
        reported = proxy.wait_event(path="/admin/report")
        assert (reported["decision"], reported["would_deny"]) == ("allow", "path_not_allowed")
        assert proxy.wait_event(path="/v1/fine")["would_deny"] is None


def test_a_file_written_in_two_parts_is_applied_only_whole(tmp_path: Path) -> None:
    """Regression (issue 20, item 10): the watcher applied the first half of a two-part write, a
    valid file whose rule, cut after its ``ports:``, allowed every method and path."""
    with Stage(tmp_path) as st:
        st.token("tok", newline=False)
        upstream = st.upstream(["api.test"])
        # claims first: the file cut after the rule's ports is itself a valid one
        rule = egress("api.test", upstream.port, methods=["GET"], paths=["/public"])
        whole = dump({"version": 1, "claims": [claim("c")], "pools": {"p": {"egress": [rule]}}})
        cut = whole.rindex("\n", 0, whole.index("methods:")) + 1  # after the rule's ports: line
        proxy = st.proxy(whole, ["api.test"])
        path = proxy.rules
        ctx = ssl.create_default_context(cafile=proxy.ca_pem)
        with httpx.Client(proxy=proxy.url("c", "tok"), verify=ctx, timeout=10) as client:
            url = f"https://api.test:{upstream.port}"
            assert client.post(f"{url}/private", content=b"x").status_code == 403
            with open(path, "w") as f:  # in place, in two parts, as a slow writer would
                f.write(whole[:cut])
                f.flush()
                time.sleep(2.0)  # four polls of the watcher
                r = client.post(f"{url}/private", content=b"x")
                assert r.status_code == 403, "the half-written file was applied"
                f.write(whole[cut:])
            [applied] = wait_reload(proxy, 1)
            assert applied["outcome"] == "applied"
            assert client.post(f"{url}/private", content=b"x").status_code == 403
            assert client.get(f"{url}/public").status_code == 200
        assert not [r for r in upstream.requests if r.path == "/private"]
        assert len([e for e in proxy.audit_events() if e["event"] == "reload"]) == 1
