"""proxy.engine.traces: one span per audited request or tunnel, made from the event as
written, with the decision as attributes and never a value, a path, a message or a
placeholder (the SDK's in-memory exporter; tests/e2e/test_audit_chain.py exports over OTLP)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from proxy import audit
from proxy.engine import traces

PLACEHOLDER = "surr_TracePlaceholder00000001"


Finish = Callable[[], Sequence[ReadableSpan]]


@pytest.fixture
def spans(tmp_path: Path) -> Iterator[Finish]:
    """Call it to stop the exporter (flushing the batch) and get the spans."""
    audit.configure(tmp_path / "audit.jsonl")
    exporter = InMemorySpanExporter()
    stop = traces.start(None, exporter=exporter)
    stopped: list[bool] = []

    def finish() -> Sequence[ReadableSpan]:
        if not stopped:
            stop()
            stopped.append(True)
        return exporter.get_finished_spans()

    try:
        yield finish
    finally:
        finish()
        audit.configure(None)


def request(**change: Any) -> dict[str, Any]:
    return {
        audit.REQUEST_ID: "r1",
        audit.CLAIM: "c1",
        audit.POOL: "p",
        audit.CLIENT: "127.0.0.1:5000",
        audit.METHOD: "GET",
        audit.SCHEME: "https",
        audit.HOST: "api.test",
        audit.PORT: 443,
        audit.PATH: audit.redact_path(f"/v1/{PLACEHOLDER}?key={PLACEHOLDER}&q=secretish"),
        audit.STATUS: 200,
        audit.DECISION: "allow",
        audit.REASON: "allowed",
        audit.RULE: "p.egress[0] api.test",
        audit.MESSAGE: None,
        audit.WOULD_DENY: None,
        audit.CREDENTIALS: [{"name": "gh", "version": 3}],
        audit.CARRIED: ["other"],
        audit.DURATION_MS: 12.5,
        **change,
    }


def test_one_span_per_request_and_tunnel_with_the_decision(spans: Finish, tmp_path: Path) -> None:
    audit.emit("request", request())
    audit.emit("tunnel", request(**{audit.METHOD: "CONNECT", audit.DECISION: "deny", audit.REASON: "no_rule",
                                    audit.MESSAGE: "no egress rule allows x", audit.RULE: None}))  # fmt: skip
    audit.emit("request", request(**{audit.METHOD: "BREW", audit.STATUS: 502, audit.DECISION: "error",
                                     audit.REASON: "upstream_error", audit.MESSAGE: "boom"}))  # fmt: skip
    audit.logger().info("reload", **{audit.OUTCOME: "applied"})  # not a request: no span
    traces_done = spans()
    assert [s.name for s in traces_done] == ["surrogate.request", "surrogate.tunnel", "surrogate.request"]
    first, tunnel, failed = traces_done
    assert first.kind is SpanKind.SERVER
    assert dict(first.attributes or {}) == {
        "surrogate.decision": "allow",
        "surrogate.reason": "allowed",
        "surrogate.rule": "p.egress[0] api.test",
        "surrogate.claim": "c1",
        "surrogate.pool": "p",
        "surrogate.request_id": "r1",
        "surrogate.worker": json.loads((tmp_path / "audit.jsonl").read_text().splitlines()[0])["worker"],
        "surrogate.seq": 1,
        "surrogate.credentials": ("gh",),
        "surrogate.carried": ("other",),
        "http.request.method": "GET",
        "http.response.status_code": 200,
        "server.address": "api.test",
        "server.port": 443,
        "url.scheme": "https",
        "client.address": "127.0.0.1",
    }
    assert first.end_time is not None and first.start_time is not None
    assert first.end_time - first.start_time == 12_500_000
    assert tunnel.attributes is not None and tunnel.attributes["surrogate.reason"] == "no_rule"
    assert "surrogate.rule" not in tunnel.attributes  # null: unset
    assert failed.attributes is not None and failed.attributes["http.request.method"] == "_OTHER"
    assert failed.status.status_code is StatusCode.ERROR and failed.status.description == "upstream_error"


def test_no_span_holds_a_path_a_message_or_a_placeholder(spans: Finish) -> None:
    refusal = {audit.DECISION: "deny", audit.REASON: "no_rule", audit.MESSAGE: f"no rule for {PLACEHOLDER}"}
    audit.emit("request", request(**{audit.HOST: f"{PLACEHOLDER}.evil.test", **refusal}))
    (span,) = spans()
    text = json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in (span.attributes or {}).items()})
    assert PLACEHOLDER.lower() not in text.lower() and "REDACTED" in text  # the host, redacted
    assert "/v1" not in text and "secretish" not in text and "no rule" not in text


def test_a_failing_exporter_never_fails_the_audit(tmp_path: Path) -> None:
    audit.configure(tmp_path / "audit.jsonl")

    def broken(event: dict[str, Any]) -> None:
        raise RuntimeError("collector down")

    audit.subscribe(broken)
    try:
        audit.emit("request", request())
    finally:
        audit.unsubscribe(broken)
        audit.configure(None)
    assert len((tmp_path / "audit.jsonl").read_text().splitlines()) == 1


def test_without_the_otel_extra_the_option_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import proxy.engine
    from proxy.cli import serve as main  # (the CLI split moved _start_traces to proxy/cli/serve.py)

    monkeypatch.delitem(sys.modules, "proxy.engine.traces")
    monkeypatch.delattr(proxy.engine, "traces")
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(ValueError, match=r"pip install 'surrogate\[otel\]'"):
        main._start_traces("http://127.0.0.1:4318/v1/traces")
    assert main._start_traces(None)() is None  # no option: nothing imported, nothing to stop
