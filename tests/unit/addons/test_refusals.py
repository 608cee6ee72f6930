"""The one builder of refusals (addons/refusals.py) and mitmproxy's error answers turned into
refusals (addons/errorpage.py), in mitmproxy's test harness (tflow)."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Generator
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import unquote

import http_sf
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mitmproxy import flow as mflow
from mitmproxy import http
from mitmproxy.net.http import http1
from mitmproxy.proxy.layers.http._events import ErrorCode, ResponseProtocolError
from mitmproxy.proxy.layers.http._hooks import HttpErrorHook
from mitmproxy.test import tflow, tutils

from addons import errorpage, facts, framing, refusals
from proxy.core import refusals as table
from proxy.core.decide import Action, Decision, Reason, deny

ADDONS = Path(__file__).resolve().parents[3] / "addons"
REFUSALS = [r for r, row in table.ROWS.items() if row is not None]


def _params(response: object) -> dict[str, str]:
    [(name, params)] = http_sf.parse(response.headers["proxy-status"].encode(), tltype="list")  # type: ignore[attr-defined, misc]
    assert str(name) == "surrogate"
    return {k: str(v) for k, v in params.items()}


@pytest.mark.parametrize("reason", REFUSALS, ids=[r.value for r in REFUSALS])
def test_every_refusal_answer_carries_proxy_status_and_its_reason(reason: Reason) -> None:
    r = refusals.answer(deny(reason, "why", 403), "rid-7")
    assert json.loads(r.content or b"") == {
        "error": reason.value,
        "decision": deny(reason, "why").action.value,
        "message": "why",
        "request_id": "rid-7",
    }
    assert _params(r) == {
        "error": table.row(reason).proxy_error,
        "details": f"{reason.value}; request_id=rid-7",
    }
    assert (r.status_code, r.reason) == (403, f"Forbidden ({reason.value})")
    assert r.headers[refusals.REQUEST_ID_HEADER] == "rid-7"
    assert "server" not in r.headers


def _grpc_request(method: bytes = b"POST", version: bytes = b"HTTP/2.0") -> http.Request:
    headers = http.Headers(content_type="application/grpc+proto")
    return tutils.treq(method=method, http_version=version, headers=headers)


@pytest.mark.parametrize("reason", REFUSALS, ids=[r.value for r in REFUSALS])
def test_a_grpc_request_gets_a_trailers_only_grpc_answer(reason: Reason) -> None:
    r = refusals.answer(deny(reason, "why ü%", 403), "rid-7", _grpc_request())
    assert (r.status_code, r.content) == (200, b"")
    assert "content-length" not in r.headers
    assert r.headers["content-type"] == "application/grpc"
    assert r.headers["grpc-status"] == str(int(table.row(reason).grpc))
    message = unquote(r.headers["grpc-message"])
    assert message == f"surrogate refused this request ({reason.value}): why ü% (request_id rid-7)"
    assert _params(r)["details"] == f"{reason.value}; request_id=rid-7"


@pytest.mark.parametrize(
    ("method", "version"),
    [(b"CONNECT", b"HTTP/1.1"), (b"CONNECT", b"HTTP/2.0"), (b"POST", b"HTTP/1.1"), (b"GET", b"HTTP/2.0")],
    ids=["connect-h1", "connect-h2", "post-h1", "get-h2"],
)
def test_a_request_that_only_says_grpc_gets_the_plain_refusal(method: bytes, version: bytes) -> None:
    """Review r-refusals: a gRPC answer is a 200, which to a CONNECT opens the tunnel."""
    r = refusals.answer(deny(Reason.NO_RULE, "why", 403), "rid-7", _grpc_request(method, version))
    assert r.status_code == 403 and "grpc-status" not in r.headers
    assert json.loads(r.content or b"")["error"] == "no_rule"


@pytest.mark.parametrize("status", [400, 403, 407, 429, 502, 503])
def test_a_refused_connect_is_never_2xx(status: int) -> None:
    flow = tflow.tflow()
    flow.request = _grpc_request(b"CONNECT", b"HTTP/1.1")
    facts.refuse(flow, deny(Reason.NO_RULE, "no egress rule", status))
    assert flow.response is not None and flow.response.status_code == status


def test_refuse_answers_through_the_builder() -> None:
    flow = tflow.tflow()
    flow.metadata[facts.REQUEST_ID] = "rid-1"
    facts.refuse(flow, deny(Reason.NO_RULE, "no egress rule"), {"Retry-After": "1"})
    assert flow.response is not None and flow.response.headers["retry-after"] == "1"
    assert _params(flow.response)["error"] == "http_request_denied"
    assert flow.response.reason == "Forbidden (no_rule)"


@pytest.mark.parametrize(
    ("code", "message", "reason", "kind", "status"),
    [
        (
            ErrorCode.CONNECT_FAILED,
            "[Errno 111] Connect call failed ('127.0.0.1', 9)",
            "upstream_error",
            "connection_refused",
            502,
        ),
        (
            ErrorCode.CONNECT_FAILED,
            "Certificate verify failed: hostname mismatch",
            "upstream_error",
            "tls_certificate_error",
            502,
        ),
        (
            ErrorCode.GENERIC_SERVER_ERROR,
            "server closed connection",
            "upstream_error",
            "connection_terminated",
            502,
        ),
        (
            ErrorCode.RESPONSE_TOO_LARGE,
            "Response body exceeds mitmproxy's body_size_limit.",
            "upstream_error",
            "http_response_body_size",
            502,
        ),
        (
            ErrorCode.RESPONSE_VALIDATION_FAILED,
            "Received invalid header from server",
            "upstream_error",
            "http_protocol_error",
            502,
        ),
        (
            ErrorCode.REQUEST_TOO_LARGE,
            "Request body exceeds mitmproxy's body_size_limit.",
            "bad_request_body",
            "http_request_error",
            413,
        ),
        (
            ErrorCode.REQUEST_VALIDATION_FAILED,
            "Received both a Transfer-Encoding and a Content-Length",
            "bad_request_head",
            "http_request_error",
            400,
        ),
        (
            ErrorCode.DESTINATION_UNKNOWN,
            "HTTP request has no host header, destination unknown.",
            "bad_request_head",
            "destination_not_found",
            400,
        ),
        (
            ErrorCode.GENERIC_SERVER_ERROR,
            "surrogate refused to send a request whose body disagrees with its framing: x",
            "bad_request_body",
            "http_request_error",
            502,
        ),
    ],
    ids=[
        "refused",
        "tls",
        "closed",
        "response-too-large",
        "response-invalid",
        "request-too-large",
        "request-invalid",
        "no-host",
        "framing",
    ],
)
def test_mitmproxys_errors_become_refusals(
    code: ErrorCode, message: str, reason: str, kind: str, status: int
) -> None:
    flow = tflow.tflow()
    flow.metadata[facts.REQUEST_ID] = "rid-2"
    r = errorpage.answer_for(flow, ResponseProtocolError(1, message, code), status)
    body = json.loads(r.content or b"")
    assert (r.status_code, body["error"], body["request_id"]) == (status, reason, "rid-2")
    assert _params(r) == {"error": kind, "details": f"{reason}; request_id=rid-2"}
    assert message not in body["message"] and "mitmproxy" not in (r.content or b"").decode()


def test_a_refusal_already_decided_is_the_answer() -> None:
    flow = tflow.tflow()
    flow.metadata[facts.DECISION] = deny(Reason.PLACEHOLDER_VIOLATION, "headed elsewhere")
    error = ResponseProtocolError(1, "server closed connection", ErrorCode.GENERIC_SERVER_ERROR)
    assert (
        json.loads(errorpage.answer_for(flow, error, 502).content or b"")["error"] == "placeholder_violation"
    )


def test_mitmproxys_own_error_page_writer_is_replaced() -> None:
    errorpage.install()
    from mitmproxy.proxy.layers.http import _http1

    raw = _http1.make_error_response(400, "Bad HTTP request line: b'<script>'")
    assert raw.startswith(b"HTTP/1.1 400 Bad Request (bad_request_head)\r\n")
    assert b"mitmproxy" not in raw and b"<script>" not in raw and b"proxy-status: surrogate" in raw.lower()


def _calls(path: Path, names: set[str]) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in names:
                found.append(f"{path.name}:{node.lineno} {name}")
    return found


def test_every_answer_of_surrogates_own_is_built_in_one_place() -> None:
    """No second path that could forget Proxy-Status: responses are made only by the builder; a
    hook route's answer (the operator command's own response) and a token endpoint's answer
    re-stated from a concurrent refresh's captured tokens (addons/refresh.py: a 200, not a
    refusal) are the other makers, one call each."""
    made = [
        c for p in sorted(ADDONS.glob("*.py")) for c in _calls(p, {"make", "Response", "make_error_response"})
    ]
    assert [c for c in made if not c.startswith(("refusals.py:", "hooks.py:", "refresh.py:"))] == []
    assert len([c for c in made if c.startswith("hooks.py:")]) == 1
    assert len([c for c in made if c.startswith("refresh.py:")]) == 1


def _fake_check(flow: http.HTTPFlow, result: bool) -> Any:
    """A stand-in for HttpStream.check_invalid: flags the flow, yields its error hook, returns."""

    def check(self: Any, request: bool) -> Generator[Any, Any, bool]:
        flow.error = mflow.Error("Received both a Transfer-Encoding and a Content-Length from client")
        reply = yield HttpErrorHook(flow)
        assert reply == "hook done"
        return result

    return check


def _drive(gen: Generator[Any, Any, Any]) -> tuple[list[Any], Any]:
    seen, reply = [], None
    while True:
        try:
            seen.append(gen.send(reply))
        except StopIteration as done:
            return seen, done.value
        reply = "hook done"


@pytest.mark.parametrize("request_side", [True, False])
def test_mitmproxys_refusal_of_a_request_is_the_decision_before_the_error_hook(request_side: bool) -> None:
    """Review r-refusals: audit and metrics read the decision in the error hook; the sandbox is
    told ``400 bad_request_head``, so that is what they record (the response's side: nothing)."""
    flow = tflow.tflow()
    flow.metadata[facts.DECISION] = Decision(Action.ALLOW, Reason.ALLOWED, "allowed")
    stream = SimpleNamespace(flow=flow)
    check = errorpage._deciding(_fake_check(flow, True), Reason.BAD_REQUEST_HEAD, "two ways", 400, None)
    seen, result = _drive(check(stream, request_side))
    assert result is True and [type(c) for c in seen] == [HttpErrorHook]
    decided = flow.metadata[facts.DECISION]
    if request_side:
        assert (decided.reason, decided.status, flow.metadata[facts.ANSWERED]) == (
            Reason.BAD_REQUEST_HEAD,
            400,
            400,
        )
    else:
        assert decided.allowed and facts.ANSWERED not in flow.metadata


def test_a_refusal_decided_before_mitmproxys_stays_the_decision() -> None:
    flow = tflow.tflow()
    flow.metadata[facts.DECISION] = deny(Reason.PROXY_AUTH_REQUIRED, "send a token", 407)
    check = errorpage._deciding(_fake_check(flow, False), Reason.BAD_REQUEST_HEAD, "two ways", 400, None)
    assert _drive(check(SimpleNamespace(flow=flow), True))[1] is False
    assert (
        flow.metadata[facts.DECISION].reason is Reason.PROXY_AUTH_REQUIRED
        and facts.ANSWERED not in flow.metadata
    )


def test_a_body_surrogate_refused_to_send_is_the_decision_before_the_error_hook() -> None:
    """addons/framing.py's refusal arrives as an upstream error; it is the request's fault."""
    flow = tflow.tflow()

    def original(self: Any, event: Any) -> Generator[Any, Any, None]:
        yield HttpErrorHook(flow)

    event = ResponseProtocolError(1, framing.BROKEN + ": 3 bytes past", ErrorCode.GENERIC_SERVER_ERROR)
    list(errorpage._answering(original)(SimpleNamespace(flow=flow), event))
    decided = flow.metadata[facts.DECISION]
    assert (decided.reason, flow.metadata[facts.ANSWERED]) == (Reason.BAD_REQUEST_BODY, 502)


def test_a_flow_no_hook_saw_is_answered_without_a_request_id() -> None:
    flow = tflow.tflow()
    error = ResponseProtocolError(1, "HTTP request has no host header", ErrorCode.DESTINATION_UNKNOWN)
    r = errorpage.answer_for(flow, error, 400)
    assert json.loads(r.content or b"")["request_id"] is None and refusals.REQUEST_ID_HEADER not in r.headers


def test_a_refused_head_request_gets_the_head_alone() -> None:
    """RFC 9110 §9.3.2 (review r-refusals): the JSON's length, none of its bytes."""
    get = refusals.answer(deny(Reason.NO_RULE, "why"), "rid", tutils.treq(method=b"GET"))
    head = refusals.answer(deny(Reason.NO_RULE, "why"), "rid", tutils.treq(method=b"HEAD"))
    assert head.raw_content == b"" and head.headers["content-length"] == str(len(get.raw_content or b""))
    assert (head.status_code, head.reason, head.headers["proxy-status"]) == (
        get.status_code,
        get.reason,
        get.headers["proxy-status"],
    )


_FIELD_LINE = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+: [\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?")


@settings(max_examples=200, deadline=None)
@given(
    st.text(max_size=80),
    st.sampled_from(REFUSALS),
    st.sampled_from([b"GET", b"POST", b"HEAD", b"CONNECT"]),
    st.sampled_from([b"HTTP/1.1", b"HTTP/2.0"]),
    st.booleans(),
)
def test_no_sandbox_or_upstream_text_reaches_a_header_or_the_status_line(
    text: str, reason: Reason, method: bytes, version: bytes, grpc: bool
) -> None:
    """Review r-refusals: whatever a decision's sentence or a host name holds (CR, LF, NUL,
    non-latin-1: the sandbox's host names and paths end up in sentences), the head is only
    surrogate's own visible-ASCII fields and a reason phrase naming the reason code."""
    headers = http.Headers(content_type="application/grpc" if grpc else "application/json")
    req = tutils.treq(method=method, http_version=version, headers=headers)
    req.host = "h\r\nX-Evil: 1" + text
    flow = tflow.tflow()
    flow.request = req
    flow.metadata[facts.REQUEST_ID] = "rid-9"
    for r in (
        refusals.answer(deny(reason, text + "\r\nX-Evil: 1\x00", 403), "rid-9", req),
        errorpage.answer_for(flow, ResponseProtocolError(1, text, ErrorCode.CONNECT_FAILED), 502),
    ):
        r.http_version = "HTTP/1.1"
        head = http1.assemble_response_head(r)
        status, *lines = head.removesuffix(b"\r\n\r\n").split(b"\r\n")
        assert re.fullmatch(rb"HTTP/1\.1 \d{3} [\x20-\x7e]+ \([a-z0-9_]+\)", status), status
        assert all(_FIELD_LINE.fullmatch(line) for line in lines), lines
        assert not any(line.lower().startswith(b"x-evil") for line in lines)


def test_an_upstream_failure_inside_the_body_size_check_is_not_taken_for_its_refusal() -> None:
    """check_body_size starts streaming past stream_large_bodies (1m here), which connects
    upstream; that connection's failure hook is the upstream's, not the check's own refusal."""
    flow = tflow.tflow()
    flow.metadata[facts.DECISION] = Decision(Action.ALLOW, Reason.ALLOWED, "allowed")

    def check(self: Any, request: bool) -> Generator[Any, Any, bool]:
        flow.error = mflow.Error("[Errno 111] Connect call failed ('127.0.0.1', 9)")
        yield HttpErrorHook(flow)  # from the nested make_server_connection
        return False

    reason, sentence, status, own = errorpage._CHECKS["check_body_size"]
    _drive(errorpage._deciding(check, reason, sentence, status, own)(SimpleNamespace(flow=flow), True))
    assert flow.metadata[facts.DECISION].allowed and facts.ANSWERED not in flow.metadata
    flow.error = None

    def refusing(self: Any, request: bool) -> Generator[Any, Any, bool]:
        flow.error = mflow.Error("Request body exceeds mitmproxy's body_size_limit.")
        yield HttpErrorHook(flow)
        return True

    _drive(errorpage._deciding(refusing, reason, sentence, status, own)(SimpleNamespace(flow=flow), True))
    assert (flow.metadata[facts.DECISION].reason, flow.metadata[facts.ANSWERED]) == (
        Reason.BAD_REQUEST_BODY,
        413,
    )
