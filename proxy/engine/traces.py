"""OpenTelemetry traces (``surrogate run --otlp-endpoint URL``): one span per audited request
or tunnel, exported over OTLP/HTTP by opentelemetry-sdk (the optional ``otel`` extra).

The span is made from the audit event as written (:func:`proxy.audit.subscribe`), so it
knows what the audit line knows and no more. Its attributes are the decision and who and
where, never a value: no header, no query, no path, no message (a refusal's sentence quotes
what the sandbox sent), no placeholder; credentials by name only. The collector that receives
traces is usually guarded less than the audit file, so less goes there.

=================================  ==========================================================
span name                          ``surrogate.request`` or ``surrogate.tunnel``; kind SERVER
start, end                         end: when the event was written; start: end - duration_ms
``surrogate.decision``, ``.reason``, ``.rule``, ``.would_deny``, ``.claim``, ``.pool``,
``.request_id``, ``.violation_surface``, ``.worker``, ``.seq``
                                   the audit fields of those names (unset when null)
``surrogate.credentials``          names of the credentials swapped or injected
``surrogate.carried``              names of credentials whose placeholder passed inert
``http.request.method``            the method when HTTP registers it, else ``_OTHER``
                                   (OpenTelemetry's HTTP conventions)
``http.response.status_code``      ``status``; ``server.address``, ``server.port``: host, port;
                                   ``url.scheme``: scheme; ``client.address``: the client's ip
status                             ERROR for ``decision: error`` (description: the reason code)
=================================  ==========================================================

Each process exports its own spans (``--workers N``: each worker). Spans are batched (the
SDK's BatchSpanProcessor) and flushed when the proxy stops. The exporter is configured by the
standard ``OTEL_EXPORTER_OTLP_*`` variables too (headers, timeout, certificate); ``URL`` is the
full traces endpoint, e.g. ``http://127.0.0.1:4318/v1/traces``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer

from proxy import audit as a

_METHODS = {"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE"}
_PLAIN = (a.DECISION, a.REASON, a.RULE, a.WOULD_DENY, a.CLAIM, a.POOL, a.REQUEST_ID, a.VIOLATION_SURFACE)
_COUNTERS = (a.WORKER, a.SEQ)


def attributes(event: dict[str, Any]) -> dict[str, Any]:
    """The span attributes of one audit event (see the module doc)."""
    out: dict[str, Any] = {f"surrogate.{k}": str(event[k]) for k in _PLAIN if event.get(k) is not None}
    out.update({f"surrogate.{k}": event[k] for k in _COUNTERS if isinstance(event.get(k), int)})
    out["surrogate.credentials"] = [str(c.get("name")) for c in event.get(a.CREDENTIALS) or []]
    out["surrogate.carried"] = [str(n) for n in event.get(a.CARRIED) or []]
    method = event.get(a.METHOD)
    if method is not None:
        out["http.request.method"] = method if method in _METHODS else "_OTHER"
    if isinstance(event.get(a.STATUS), int):
        out["http.response.status_code"] = event[a.STATUS]
    if event.get(a.HOST):
        out["server.address"] = str(event[a.HOST])
    if isinstance(event.get(a.PORT), int):
        out["server.port"] = event[a.PORT]
    if event.get(a.SCHEME):
        out["url.scheme"] = str(event[a.SCHEME])
    client = event.get(a.CLIENT)
    if isinstance(client, str) and ":" in client:
        out["client.address"] = client.rpartition(":")[0]
    return out


def record(tracer: Tracer, event: dict[str, Any]) -> None:
    """One finished span for a ``request`` or ``tunnel`` event (other kinds: none)."""
    kind = event.get(a.EVENT)
    if kind not in ("request", "tunnel"):
        return
    end = time.time_ns()
    start = end - int(float(event.get(a.DURATION_MS) or 0) * 1_000_000)
    span = tracer.start_span(f"surrogate.{kind}", kind=SpanKind.SERVER, start_time=start)
    span.set_attributes(attributes(event))
    if event.get(a.DECISION) == "error":
        span.set_status(Status(StatusCode.ERROR, str(event.get(a.REASON))))
    span.end(end_time=end)


def start(endpoint: str | None, exporter: SpanExporter | None = None) -> Callable[[], None]:
    """Export a span per audited request to ``endpoint`` (or to ``exporter``, tests); returns the
    function that flushes and stops the exporter."""
    resource = Resource.create({"service.name": "surrogate", "process.pid": os.getpid()})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(exporter or OTLPSpanExporter(endpoint=endpoint)))
    tracer = provider.get_tracer("surrogate")
    listener = lambda event: record(tracer, event)  # noqa: E731 - kept to unsubscribe it
    a.subscribe(listener)

    def stop() -> None:
        a.unsubscribe(listener)
        provider.shutdown()

    return stop
