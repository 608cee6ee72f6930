"""refusals: the one builder of every answer surrogate gives instead of an upstream's.

:func:`answer` turns a decision into the response the sandbox gets (the JSON refusal, or a gRPC
Trailers-Only answer to a gRPC request), with ``Proxy-Status`` (RFC 9209), the request id and, on
HTTP/1, the reason code in the reason phrase (:mod:`proxy.core.refusals` says what and why).
Its callers: :func:`addons.facts.refuse` (every refusal decided in a hook), addons/errorpage.py
(mitmproxy's own error answers: an upstream that cannot be reached, a request it cannot read),
addons/malformed.py and addons/headlimit.py (refusals made inside mitmproxy's readers, before a
flow exists, so with no request id).
"""

from __future__ import annotations

from mitmproxy import http

from proxy.core import refusals
from proxy.core.decide import Decision

REQUEST_ID_HEADER = "X-Surrogate-Request-Id"


def answer(
    decision: Decision,
    request_id: str | None,
    request: http.Request | None = None,
    error: str | None = None,
    headers: dict[str, str] | None = None,
) -> http.Response:
    """The response for refusal ``decision`` of ``request`` (None: refused before any request
    was read); a gRPC request (:func:`proxy.core.refusals.grpc_request`) gets gRPC's answer;
    ``error``: an RFC 9209 type that overrides the table's (an upstream
    failure's kind); ``headers``: more fields (``Retry-After``, ``Connection: close``)."""
    fields = {"Proxy-Status": refusals.proxy_status(decision.reason, request_id, error)}
    if request_id is not None:
        fields[REQUEST_ID_HEADER] = request_id
    if request is not None and refusals.grpc_request(
        request.method, request.http_version, request.headers.get("content-type")
    ):
        response = http.Response.make(
            200,
            b"",
            {
                "content-type": "application/grpc",
                "grpc-status": str(int(refusals.row(decision.reason).grpc)),
                "grpc-message": refusals.grpc_message(decision, request_id),
                **fields,
                **(headers or {}),
            },
        )
        del response.headers["content-length"]  # Trailers-Only: one HEADERS frame, END_STREAM
    else:
        response = http.Response.make(
            decision.status,
            refusals.json_body(decision, request_id),
            {"Content-Type": "application/json", **fields, **(headers or {})},
        )
    if request is not None and request.method == "HEAD":
        # RFC 9110 §9.3.2: no content, the length GET would have had (review r-refusals: the
        # JSON after the head was read, on a kept-alive HTTP/1 connection, as the next response)
        response.raw_content = b""
    response.reason = refusals.reason_phrase(response.status_code, decision.reason)
    return response
