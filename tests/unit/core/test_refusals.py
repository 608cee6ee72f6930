"""The one table from reason code to Proxy-Status error type and gRPC status, and the pieces of a
refusal (proxy/core/refusals.py): every Reason has a row, every piece is valid where it goes."""

from __future__ import annotations

import re
from urllib.parse import unquote

import http_sf
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core import refusals
from proxy.core.decide import Action, Decision, Reason, deny

# RFC 9209 §2.3 (and the IANA "HTTP Proxy Error Types" registry it creates)
RFC9209_TYPES = {
    "dns_timeout", "dns_error", "destination_not_found", "destination_unavailable",
    "destination_ip_prohibited", "destination_ip_unroutable", "connection_refused",
    "connection_terminated", "connection_timeout", "connection_read_timeout",
    "connection_write_timeout", "connection_limit_reached", "tls_protocol_error",
    "tls_certificate_error", "tls_alert_received", "http_request_error", "http_request_denied",
    "http_response_incomplete", "http_response_header_section_size", "http_response_header_size",
    "http_response_body_size", "http_response_trailer_section_size", "http_response_trailer_size",
    "http_response_transfer_coding", "http_response_content_coding", "http_response_timeout",
    "http_upgrade_failed", "http_protocol_error", "proxy_internal_response", "proxy_internal_error",
    "proxy_configuration_error", "proxy_loop_detected",
}  # fmt: skip
NOT_REFUSALS = {Reason.ALLOWED, Reason.HOOK_ANSWERED}
REFUSALS = [r for r in Reason if r not in NOT_REFUSALS]


def test_every_reason_has_a_row() -> None:
    assert set(refusals.ROWS) == set(Reason)
    assert {r for r, row in refusals.ROWS.items() if row is None} == NOT_REFUSALS


@pytest.mark.parametrize("reason", REFUSALS, ids=[r.value for r in REFUSALS])
def test_each_refusal_has_a_registered_type_and_a_grpc_status(reason: Reason) -> None:
    row = refusals.ROWS[reason]
    assert row is not None and row.proxy_error in RFC9209_TYPES
    assert row.grpc in refusals.Grpc and row.grpc != 0  # never OK


@pytest.mark.parametrize(
    ("reasons", "grpc"),
    [
        (
            [Reason.NO_RULE, Reason.PLACEHOLDER_VIOLATION, Reason.FORGED_PLACEHOLDER],
            refusals.Grpc.PERMISSION_DENIED,
        ),
        ([Reason.RATE_LIMITED, Reason.CREDENTIAL_BUDGET_SPENT], refusals.Grpc.RESOURCE_EXHAUSTED),
        ([Reason.UPSTREAM_ERROR, Reason.UNRESOLVABLE], refusals.Grpc.UNAVAILABLE),
        ([Reason.PROXY_AUTH_REQUIRED], refusals.Grpc.UNAUTHENTICATED),
    ],
    ids=["denied", "limited", "upstream", "auth"],
)
def test_grpc_codes_by_kind_of_refusal(reasons: list[Reason], grpc: refusals.Grpc) -> None:
    assert {refusals.row(r).grpc for r in reasons} == {grpc}


@pytest.mark.parametrize("reason", list(Reason), ids=[r.value for r in Reason])
def test_proxy_status_is_one_rfc8941_list_member_naming_surrogate(reason: Reason) -> None:
    value = refusals.proxy_status(reason, "0f3c-request-id")
    [(name, params)] = http_sf.parse(value.encode(), tltype="list")  # type: ignore[misc]
    assert name == http_sf.Token("surrogate")
    assert str(params["error"]) == refusals.row(reason).proxy_error
    assert isinstance(params["error"], http_sf.Token)
    assert params["details"] == f"{reason.value}; request_id=0f3c-request-id"


def test_proxy_status_with_an_upstream_kind_and_without_a_request_id() -> None:
    value = refusals.proxy_status(Reason.UPSTREAM_ERROR, None, "connection_refused")
    assert value == 'surrogate;error=connection_refused;details="upstream_error"'


@pytest.mark.parametrize("reason", REFUSALS, ids=[r.value for r in REFUSALS])
@pytest.mark.parametrize("status", [400, 403, 407, 421, 429, 431, 502, 503, 504, 599])
def test_reason_phrase_is_rfc9112_and_names_the_reason(reason: Reason, status: int) -> None:
    phrase = refusals.reason_phrase(status, reason)
    assert re.fullmatch(r"[\t \x21-\x7e]+", phrase)  # reason-phrase = 1*( HTAB / SP / VCHAR )
    assert phrase.endswith(f"({reason.value})")


@pytest.mark.parametrize(
    ("content_type", "grpc"),
    [
        ("application/grpc", True),
        ("application/grpc+proto", True),
        ("Application/GRPC; charset=x", True),
        ("application/grpc-web", False),
        ("application/grpc-web+proto", False),
        ("application/json", False),
        ("", False),
        (None, False),
    ],
)
def test_is_grpc(content_type: str | None, grpc: bool) -> None:
    assert refusals.is_grpc(content_type) is grpc


@pytest.mark.parametrize(
    ("method", "version", "grpc"),
    [
        ("POST", "HTTP/2.0", True),
        ("POST", "HTTP/3", True),
        ("POST", "HTTP/1.1", False),
        ("POST", "HTTP/1.0", False),
        ("CONNECT", "HTTP/1.1", False),
        ("CONNECT", "HTTP/2.0", False),
        ("GET", "HTTP/2.0", False),
        ("PUT", "HTTP/2.0", False),
        ("post", "HTTP/2.0", False),
    ],
)
@pytest.mark.parametrize("content_type", ["application/grpc", "application/grpc+proto"])
def test_only_a_post_over_http2_is_answered_as_grpc(
    method: str, version: str, grpc: bool, content_type: str
) -> None:
    """Review r-refusals: the gRPC answer is a 200; only gRPC's own requests get it."""
    assert refusals.grpc_request(method, version, content_type) is grpc
    assert refusals.grpc_request(method, version, "application/json") is False


@given(st.text(max_size=200))
def test_grpc_message_is_percent_encoded_as_grpc_says(message: str) -> None:
    decision = Decision(Action.DENY, Reason.NO_RULE, message, status=403)
    encoded = refusals.grpc_message(decision, "rid-1")
    assert re.fullmatch(r"[\x20-\x24\x26-\x7e]*(%[0-9A-F]{2}[\x20-\x24\x26-\x7e]*)*", encoded)
    assert (
        unquote(encoded, errors="strict")
        == f"surrogate refused this request (no_rule): {message} (request_id rid-1)"
    )


# mitmproxy 12.3's messages for each upstream failure, as measured (tests/e2e/test_refusals.py
# prints them in the audit event), and the kind each is.
UPSTREAM_MESSAGES = [
    ("[Errno 111] Connect call failed ('127.0.0.1', 53845)", True, "connection_refused"),
    ("[Errno 110] Connect call failed ('10.245.9.2', 443)", True, "connection_timeout"),
    ("[Errno 113] No route to host", True, "destination_ip_unroutable"),
    ("[Errno 101] Network is unreachable", True, "destination_ip_unroutable"),
    ("Certificate verify failed: hostname mismatch", True, "tls_certificate_error"),
    ("Certificate verify failed: unable to get local issuer certificate", True, "tls_certificate_error"),
    ("The remote server does not speak TLS.", True, "tls_protocol_error"),
    ("server closed connection", False, "connection_terminated"),
    ("peer closed connection", False, "connection_terminated"),
    ("Cannot parse HTTP response: Bad HTTP response line: b'THIS IS NOT HTTP'", False, "http_protocol_error"),
    ("Response body exceeds mitmproxy's body_size_limit.", False, "http_response_body_size"),
    (
        "upstream response head larger than 262144 bytes without its end",
        False,
        "http_response_header_section_size",
    ),
    ("something new", True, "destination_unavailable"),
    ("something new", False, "http_protocol_error"),
]


@pytest.mark.parametrize(("message", "connecting", "kind"), UPSTREAM_MESSAGES)
def test_upstream_failure_kinds(message: str, connecting: bool, kind: str) -> None:
    found, sentence = refusals.upstream_failure(message, connecting)
    assert found == kind and found in RFC9209_TYPES
    assert message not in sentence


@given(st.text(max_size=300), st.booleans())
def test_an_upstream_failure_sentence_never_quotes_the_upstream(message: str, connecting: bool) -> None:
    kind, sentence = refusals.upstream_failure(message, connecting)
    sentences = {s for _, _, s in refusals._UPSTREAM_KINDS}
    sentences |= {"surrogate could not connect to the upstream", "the upstream's response could not be read"}
    assert sentence in sentences and kind in RFC9209_TYPES


def test_json_body() -> None:
    body = refusals.json_body(deny(Reason.NO_RULE, "no egress rule"), "rid")
    assert (
        body == b'{"error": "no_rule", "decision": "deny", "message": "no egress rule", "request_id": "rid"}'
    )


def test_the_upstreams_quoted_bytes_do_not_choose_the_kind() -> None:
    message = "Cannot parse HTTP response: Bad HTTP response line: b'[Errno 111] TLS timed out'"
    assert refusals.upstream_failure(message, False)[0] == "http_protocol_error"


# mitmproxy 12.3's messages that quote the upstream's bytes (mitmproxy/proxy/layers/http/_http1.py,
# _http2.py, mitmproxy/net/http/validate.py), with QUOTED where the upstream's bytes go, and the
# kind each must be whatever those bytes say (review r-refusals).
QUOTING = [
    ("unexpected server response: b'QUOTED'", "http_protocol_error"),
    ("Cannot parse HTTP response: Bad HTTP response line: b'QUOTED'", "http_protocol_error"),
    ("HTTP/1 protocol error: illegal chunk header: b'QUOTED'", "http_protocol_error"),
    ("HTTP/1 protocol error: malformed chunk footer: b'QUOTED' (expected b'\\r\\n')", "http_protocol_error"),
    ("Invalid HTTP/2 response headers: Unknown pseudo headers: {b':x': b'QUOTED'}", "http_protocol_error"),
    (
        "Received invalid content-length header: 'QUOTED' from server, refusing to prevent request "
        "smuggling attacks. Disable the validate_inbound_headers option to skip this security check.",
        "http_protocol_error",
    ),
    (
        "HTTP/2 connection closed: <ConnectionTerminated error_code:ErrorCodes.NO_ERROR, "
        "last_stream_id:0, additional_data:b'QUOTED'>",
        "connection_terminated",
    ),
]
LIES = [
    "certificate verify failed",
    "[Errno 111] connection refused",
    "timed out",
    "no route",
    "body exceeds",
    "head larger",
    "TLS",
    "closed",
    "cannot parse",
]


@pytest.mark.parametrize("lie", LIES)
@pytest.mark.parametrize(("message", "kind"), QUOTING, ids=[m[:30] for m, _ in QUOTING])
def test_the_upstreams_quoted_bytes_never_choose_the_kind(message: str, kind: str, lie: str) -> None:
    for quoted in (lie, lie.upper(), f"x {lie} x"):
        assert refusals.upstream_failure(message.replace("QUOTED", quoted), False)[0] == kind


@given(st.text(max_size=100))
def test_no_quoted_text_changes_the_kind(quoted: str) -> None:
    for message, kind in QUOTING:
        assert refusals.upstream_failure(message.replace("QUOTED", quoted), False)[0] == kind


@pytest.mark.parametrize(
    ("value", "kept"),
    [
        ("next-hop;error=dns_error", "next-hop;error=dns_error"),
        ('surrogate;error=http_request_denied;details="no_rule"', None),
        ("Surrogate;error=x, next-hop;error=y", "next-hop;error=y"),
        ('"surrogate";error=x', None),
        ("SURROGATE, a, surrogate;x=1, b", "a, b"),
        ('surrogate;details="unclosed', None),
        ("surrogatex;error=y", "surrogatex;error=y"),
        ("caf\u00e9", None),
    ],
)
def test_an_upstreams_proxy_status_loses_the_members_naming_surrogate(value: str, kept: str | None) -> None:
    """Review r-refusals: only surrogate writes its member; an invalid field is dropped whole."""
    assert refusals.without_ours(value) == kept
