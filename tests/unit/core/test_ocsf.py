"""proxy.core.ocsf: every kind of native request and tunnel event becomes OCSF 1.5.0 HTTP
Activity (class_uid 4002) that the OCSF schema accepts, as checked by ocsf-json-schema (a
maintained PyPI package that builds JSON Schema from the OCSF schema it ships) and
jsonschema; with no more than the native event holds (no placeholder, no query value)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from ocsf_check import ocsf_errors

from proxy import audit
from proxy.core import ocsf

PLACEHOLDER = "surr_OcsfPlaceholder000000001"
T = 1_777_000_000_000


def problems(event: dict[str, Any]) -> list[str]:
    return ocsf_errors(event)


BASE: dict[str, Any] = {
    "time": "2026-05-01T12:00:00.123456Z",
    "event": "request",
    "request_id": "6f0c2a9e-0000-4000-8000-000000000000",
    "claim": "demo",
    "pool": "demo",
    "client": "127.0.0.1:51234",
    "method": "GET",
    "scheme": "https",
    "host": "api.github.com",
    "port": 443,
    "path": "/user?page=REDACTED&flag",
    "status": 200,
    "decision": "allow",
    "reason": "allowed",
    "rule": "demo.egress[0] api.github.com",
    "message": None,
    "seq": 7,
    "worker": 4242,
    "would_deny": None,
    "credentials": [{"name": "github", "version": 1}],
    "carried": [],
    "forged": [],
    "carried_on": [],
    "violation_surface": None,
    "bytes_out": 0,
    "bytes_in": 12,
    "duration_ms": 3.5,
    "prev": None,
}
REFUSED = {"status": 403, "rule": None, "credentials": []}
CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "allowed GET": (
        {},
        {"activity_id": 3, "action_id": 1, "disposition_id": 1, "severity_id": 1, "status_id": 1},
    ),
    "POST with a body": ({"method": "POST", "bytes_out": 99}, {"activity_id": 6}),
    "PATCH is Other": ({"method": "PATCH"}, {"activity_id": 99}),
    "a made-up method is Other": ({"method": "BREW"}, {"activity_id": 99}),
    "deny": (
        {**REFUSED, "decision": "deny", "reason": "no_rule", "message": "no egress rule allows api.x.test"},
        {"action_id": 2, "disposition_id": 2, "severity_id": 3, "status_id": 2, "status_code": "no_rule"},
    ),
    "violation": (
        {**REFUSED, "decision": "violation", "reason": "placeholder_violation", "message": "m"},
        {"action_id": 2, "severity_id": 4},
    ),
    "upstream error": (
        {"status": 502, "decision": "error", "reason": "upstream_error", "message": "connect failed"},
        {"action_id": 1, "severity_id": 2, "status_id": 2},
    ),
    "internal error": (
        {"status": 500, "decision": "error", "reason": "internal_error", "message": "failed closed"},
        {"action_id": 2},
    ),
    "no status (closed)": (
        {"status": None, "decision": "deny", "reason": "bad_request_body", "message": "m"},
        {},
    ),
    "unidentified": (
        {
            **REFUSED,
            "claim": None,
            "pool": None,
            "decision": "deny",
            "reason": "proxy_auth_required",
            "message": "m",
        },
        {},
    ),  # fmt: skip
    "IPv6 client and host": (
        {"client": "::1:4242", "host": "2001:db8::1"},
        {"dst_endpoint": {"ip": "2001:db8::1", "port": 443}},
    ),
    "refused CONNECT": (
        {
            **REFUSED,
            "event": "tunnel",
            "method": "CONNECT",
            "scheme": None,
            "path": None,
            "decision": "deny",
            "reason": "no_rule",
            "message": "m",
        },
        {"activity_id": 1, "type_uid": 400201},
    ),  # fmt: skip
    "opaque tunnel": (
        {"event": "tunnel", "method": "CONNECT", "scheme": None, "path": None, "credentials": []},
        {},
    ),
    "transparent pass-through": (
        {"event": "tunnel", "method": None, "scheme": None, "path": None, "status": None, "credentials": []},
        {"activity_id": 99},
    ),
}


@pytest.mark.parametrize("change,expected", list(CASES.values()), ids=list(CASES))
def test_each_kind_of_event_is_valid_ocsf_http_activity(
    change: dict[str, Any], expected: dict[str, Any]
) -> None:
    native = {**BASE, **change}
    out = ocsf.http_activity(native, T)
    assert out is not None
    assert problems(out) == []
    assert out["class_uid"] == 4002 and out["type_uid"] == 4002 * 100 + out["activity_id"]
    assert out["metadata"]["version"] == "1.5.0"
    for key, value in expected.items():
        assert out[key] == value, key


def test_times_and_ids_come_from_the_native_event() -> None:
    out = ocsf.http_activity(BASE, T)
    assert out is not None
    assert (out["time"], out["start_time"], out["duration"]) == (T, T - 3, 3)
    assert out["metadata"]["uid"] == out["http_request"]["uid"] == BASE["request_id"]
    assert out["http_request"]["url"] == {
        "hostname": "api.github.com",
        "port": 443,
        "scheme": "https",
        "path": "/user",
        "query_string": "page=REDACTED&flag",
        "url_string": "https://api.github.com:443/user?page=REDACTED&flag",
    }
    assert out["firewall_rule"]["name"] == BASE["rule"] and out["policy"]["name"] == "demo"
    assert out["src_endpoint"] == {"ip": "127.0.0.1", "port": 51234, "uid": "demo"}
    assert out["unmapped"]["credentials"] == [{"name": "github", "version": 1}]


@pytest.mark.parametrize("kind", ["control", "reload"])
def test_control_and_reload_events_are_not_http_activity(kind: str) -> None:
    assert ocsf.http_activity({"event": kind}, T) is None


def test_placeholders_are_redacted_as_in_the_native_event() -> None:
    native = {
        **BASE,
        "host": f"{PLACEHOLDER.lower()}.evil.test",
        "path": audit.redact_path(f"/{PLACEHOLDER}/x?k={PLACEHOLDER}"),
        "method": PLACEHOLDER.upper(),
        "decision": "deny",
        "reason": "no_rule",
        "message": f"no egress rule allows {PLACEHOLDER}.evil.test",
        "forged": [f"header X-{PLACEHOLDER}"],
    }
    audit.hide_placeholders(native)
    out = ocsf.http_activity(native, T)
    assert out is not None and problems(out) == []
    text = json.dumps(out).lower()
    assert "surr_" not in text and PLACEHOLDER.lower()[5:] not in text
