"""Refusals every client can read (issue 18): one table from reason code to what each kind of
client is told, and the text pieces of a refusal. Pure: the addons (addons/refusals.py) build the
response from these.

Every refusal, and every upstream failure surrogate answers for, carries

- an RFC 9209 ``Proxy-Status`` field (a Structured Fields List, RFC 8941 §3.1, serialised by the
  ``http-sf`` library): one member, the token ``surrogate``, with the parameters ``error`` (the
  proxy error type of RFC 9209 §2.3, a Token) and ``details`` (§2.1.5, a String: the reason code
  and the request id), e.g. ``surrogate;error=http_request_denied;details="no_rule;
  request_id=…"``;
- on HTTP/1, the reason code in the status line's reason phrase (``403 Forbidden (no_rule)``),
  which is all curl shows of a refused CONNECT (``curl -v``);
- for a gRPC request (a ``POST`` over HTTP/2 whose ``content-type`` is ``application/grpc`` or
  ``application/grpc+…``), instead of the JSON body: HTTP 200 with ``grpc-status`` and
  ``grpc-message`` in the headers (a Trailers-Only response, gRPC's "PROTOCOL-HTTP2" document),
  the message percent-encoded as that document says. ``application/grpc-web`` is not gRPC here:
  it gets the JSON refusal; so does any other method or HTTP version that claims gRPC's
  Content-Type (review r-refusals: a refused ``CONNECT`` that said gRPC was answered 200, which
  mitmproxy took for "tunnel established"; an HTTP/1 request read a 200 as success).

Only surrogate's own words go into these fields: the reason code, the request id, surrogate's
sentence (which never holds a secret) and, for an upstream failure, a sentence chosen here by the
kind of failure, never the upstream's or mitmproxy's own text (that stays in the audit event,
after the scrubber checked it: addons/scrub.py ``error``).

Decisions (where issue 18 was silent): a policy refusal is ``http_request_denied``; a request
surrogate cannot read is ``http_request_error`` (RFC 9209: a 4xx made by the intermediary);
a destination that resolves to a special-purpose address is ``destination_ip_prohibited``; one of
surrogate's own listeners (or a loop) is ``proxy_loop_detected``; an upstream failure's type is
the failure's kind (:func:`upstream_failure`). gRPC: denials and violations
``PERMISSION_DENIED``, a missing proxy credential ``UNAUTHENTICATED``, rates, budgets and
connection bounds ``RESOURCE_EXHAUSTED``, upstream failures ``UNAVAILABLE``, a request that cannot
be read ``INVALID_ARGUMENT``, surrogate's own failure ``INTERNAL`` (codes: grpc/grpc
doc/statuscodes.md).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import IntEnum
from http import HTTPStatus
from urllib.parse import quote

import http_sf

from proxy.core.decide import Decision, Reason

PROXY_NAME = "surrogate"  # the Proxy-Status member that names this intermediary (RFC 9209 §2)


class Grpc(IntEnum):
    """gRPC status codes (grpc/grpc doc/statuscodes.md) that refusals use."""

    CANCELLED = 1
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    INTERNAL = 13
    UNAVAILABLE = 14
    UNAUTHENTICATED = 16


@dataclass(frozen=True, slots=True)
class Row:
    proxy_error: str  # RFC 9209 §2.3 proxy error type
    grpc: Grpc


_DENIED = Row("http_request_denied", Grpc.PERMISSION_DENIED)
_LIMITED = Row("http_request_denied", Grpc.RESOURCE_EXHAUSTED)
_UNREADABLE = Row("http_request_error", Grpc.INVALID_ARGUMENT)

# Every reason code has a row; None: not a refusal (nothing is refused with it).
ROWS: dict[Reason, Row | None] = {
    Reason.ALLOWED: None,
    Reason.HOOK_ANSWERED: None,  # the hook's own answer, not a refusal
    Reason.NO_RULE: _DENIED,
    Reason.PORT_NOT_ALLOWED: _DENIED,
    Reason.SCHEME_NOT_ALLOWED: _DENIED,
    Reason.METHOD_NOT_ALLOWED: _DENIED,
    Reason.PATH_NOT_ALLOWED: _DENIED,
    Reason.PROXY_AUTH_REQUIRED: Row("http_request_denied", Grpc.UNAUTHENTICATED),
    Reason.AUTHORITY_MISMATCH: _DENIED,
    Reason.PLACEHOLDER_VIOLATION: _DENIED,
    Reason.PLACEHOLDER_MISPLACED: _DENIED,
    Reason.CLEARTEXT_CREDENTIAL: _DENIED,
    Reason.FORGED_PLACEHOLDER: _DENIED,
    Reason.CREDENTIAL_EXPIRED: _DENIED,
    Reason.CREDENTIAL_UNAVAILABLE: Row("proxy_configuration_error", Grpc.UNAVAILABLE),
    Reason.CREDENTIAL_BUDGET_SPENT: _LIMITED,
    Reason.UPSTREAM_ERROR: Row("destination_unavailable", Grpc.UNAVAILABLE),  # refined by kind
    Reason.CLIENT_CLOSED: Row("connection_terminated", Grpc.CANCELLED),  # audit only
    Reason.INTERNAL_ERROR: Row("proxy_internal_error", Grpc.INTERNAL),
    Reason.OWN_LISTENER: Row("proxy_loop_detected", Grpc.PERMISSION_DENIED),
    Reason.UNKNOWN_SOURCE: _DENIED,
    Reason.WRONG_INTERFACE: _DENIED,
    Reason.SPECIAL_ADDRESS: Row("destination_ip_prohibited", Grpc.PERMISSION_DENIED),
    Reason.BAD_REQUEST_HEAD: _UNREADABLE,
    Reason.BAD_REQUEST_BODY: _UNREADABLE,
    Reason.AMBIGUOUS_PATH: Row("http_request_denied", Grpc.INVALID_ARGUMENT),
    Reason.UNRESOLVABLE: Row("dns_error", Grpc.UNAVAILABLE),
    Reason.TOO_MANY_CONNECTIONS: _LIMITED,
    Reason.RATE_LIMITED: _LIMITED,
    Reason.HOOK_TIMEOUT: Row("http_response_timeout", Grpc.DEADLINE_EXCEEDED),
    Reason.HOOK_FAILED: Row("proxy_internal_error", Grpc.UNAVAILABLE),
    Reason.APPROVAL_DENIED: _DENIED,  # an operator denied it (or the rules no longer allow it)
    Reason.APPROVAL_TIMEOUT: _DENIED,  # nobody decided before the ask rule's timeout
    Reason.APPROVAL_LIMIT: _LIMITED,  # the claim already holds limits.approvals requests
    Reason.HOOK_POOL_LIMIT: _LIMITED,
    Reason.HOOK_NODE_LIMIT: _LIMITED,
    Reason.UNSCANNABLE_RESPONSE: Row("http_response_content_coding", Grpc.INTERNAL),  # audit only
    Reason.NOT_HTTP: Row("http_protocol_error", Grpc.INTERNAL),  # audit only
    Reason.STORE_STALE: Row("proxy_internal_error", Grpc.UNAVAILABLE),
    Reason.STORE_NEVER_SYNCED: Row("proxy_internal_error", Grpc.UNAVAILABLE),
    Reason.TOKEN_MINT_FAILED: Row("proxy_internal_error", Grpc.UNAVAILABLE),  # no access token minted
    Reason.SIGV4_BAD_SIGNATURE: Row("http_request_denied", Grpc.UNAUTHENTICATED),  # not the placeholder's
    Reason.SIGV4_SCOPE_REFUSED: _DENIED,
    Reason.SIGV4_UNSIGNED: _DENIED,
    Reason.SIGV4_WRONG_KEY: _DENIED,
    Reason.SIGV4_MALFORMED: _UNREADABLE,
    Reason.SIGV4_BAD_CHUNK: Row("http_request_error", Grpc.UNAUTHENTICATED),  # audit only: connection closed
}

# An upstream failure, by what mitmproxy 12.3's message says (lower-cased substrings, first match
# wins; measured in tests/e2e/test_refusals.py and test_refusals_netns.py):
# (needles, RFC 9209 type, surrogate's sentence).
_UPSTREAM_KINDS: tuple[tuple[tuple[str, ...], str, str], ...] = (
    # first: these messages quote the upstream's bytes, which may say anything
    (("cannot parse", "from server"), "http_protocol_error", "the upstream's response is not valid HTTP"),
    (("errno 111", "connection refused"), "connection_refused", "the upstream refused the connection"),
    (("errno 110", "timed out", "timeout"), "connection_timeout", "the connection to the upstream timed out"),
    (
        ("errno 101", "errno 113", "unreachable", "no route"),
        "destination_ip_unroutable",
        "the upstream's address cannot be reached",
    ),
    (
        ("certificate verify failed",),
        "tls_certificate_error",
        "the upstream's TLS certificate did not verify",
    ),
    (("body exceeds",), "http_response_body_size", "the upstream's response body is too large"),
    (("head larger",), "http_response_header_section_size", "the upstream's response head is too large"),
    (("tls", "ssl"), "tls_protocol_error", "the TLS handshake with the upstream failed"),
    (("closed", "reset"), "connection_terminated", "the upstream closed the connection before it answered"),
)


# Where mitmproxy's message starts quoting someone else's bytes: a repr (``b'…'``, ``'…'``, an
# event's ``<…>``, a dict's ``{…}``). Its messages quote the upstream's bytes that way: "unexpected
# server response: b'…'", "HTTP/1 protocol error: illegal chunk header: b'…'", "Unknown pseudo
# headers: {…}", "HTTP/2 connection closed: <ConnectionTerminated … additional_data:b'…'>".
_QUOTING = re.compile(r"['\"<{]")


def _own_words(message: str) -> str:
    """``message`` up to the first quotation: what mitmproxy itself wrote."""
    found = _QUOTING.search(message)
    return message if found is None else message[: found.start()]


def upstream_failure(message: str, connecting: bool) -> tuple[str, str]:
    """(RFC 9209 §2.3 error type, a sentence of surrogate's) for an upstream failure that mitmproxy
    described as ``message``; ``connecting``: it failed while opening the connection. The
    sentence never quotes ``message``, and the kind is read from mitmproxy's own words only (up
    to the first quotation): an upstream whose bytes mitmproxy quotes cannot choose it (review
    r-refusals: a partial head saying "certificate verify failed" was a ``tls_certificate_error``)."""
    low = _own_words(message).lower()
    for needles, kind, sentence in _UPSTREAM_KINDS:
        if any(n in low for n in needles):
            return kind, sentence
    if connecting:
        return "destination_unavailable", "surrogate could not connect to the upstream"
    return "http_protocol_error", "the upstream's response could not be read"


def row(reason: Reason) -> Row:
    """The table's row for a refusal's reason (an allow reason, never refused, gets surrogate's
    internal-error row rather than none: a refusal always says something)."""
    found = ROWS.get(reason) or ROWS[Reason.INTERNAL_ERROR]
    assert found is not None  # the internal-error row is a row
    return found


def details(reason: Reason, request_id: str | None) -> str:
    return reason.value if request_id is None else f"{reason.value}; request_id={request_id}"


def proxy_status(reason: Reason, request_id: str | None, error: str | None = None) -> str:
    """The ``Proxy-Status`` field value (RFC 9209 §2) for a refusal: ``error`` overrides the
    table's type (an upstream failure's kind). Raises ``ValueError`` for a request id that is not
    printable ASCII (surrogate's ids always are)."""
    params: dict[str, http_sf.types.BareItemType] = {
        "error": http_sf.Token(error or row(reason).proxy_error),
        "details": details(reason, request_id),
    }
    return http_sf.ser([(http_sf.Token(PROXY_NAME), params)])


def _names_us(member: object) -> bool:
    item = member[0] if isinstance(member, tuple) else member  # (item, parameters)
    return isinstance(item, (str, http_sf.Token)) and str(item).lower() == PROXY_NAME


def without_ours(value: str) -> str | None:
    """An upstream's ``Proxy-Status`` field without the members that name surrogate (a Token or
    String, in any case: RFC 9209 §2), which only surrogate may write; ``None``: drop the field
    (nothing else in it, or not a valid RFC 8941 List, which a lenient reader could still take
    for surrogate's). Review r-refusals: an upstream could dress its answer up as surrogate's
    refusal, with a request id ``surrogate audit why`` does not know."""
    try:
        members = http_sf.parse(value.encode("latin-1"), tltype="list")
    except (http_sf.StructuredFieldError, UnicodeEncodeError):
        return None
    assert isinstance(members, list)
    kept = [m for m in members if not _names_us(m)]
    if len(kept) == len(members):
        return value
    return http_sf.ser(kept) if kept else None


def reason_phrase(status: int, reason: Reason) -> str:
    """An HTTP/1 reason phrase (RFC 9112 §4) with the reason code: ``Forbidden (no_rule)``."""
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Refused"
    return f"{phrase} ({reason.value})"


def is_grpc(content_type: str | None) -> bool:
    """Whether a request's Content-Type is gRPC's (``application/grpc`` with an optional
    ``+proto``-like suffix and parameters; gRPC-Web's is not)."""
    if content_type is None:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/grpc" or media.startswith("application/grpc+")


def grpc_request(method: str, http_version: str, content_type: str | None) -> bool:
    """Whether a request is gRPC and gets a gRPC answer: gRPC's PROTOCOL-HTTP2 says ``:method``
    is ``POST`` over HTTP/2, with gRPC's Content-Type (:func:`is_grpc`). A refusal of anything
    else stays a 4xx/5xx: a 2xx to a ``CONNECT`` opens the tunnel (RFC 9110 §9.3.6)."""
    return method == "POST" and http_version in ("HTTP/2.0", "HTTP/3") and is_grpc(content_type)


# gRPC PROTOCOL-HTTP2: bytes %x20-%x7E except "%" may stay; the rest is %XX of the UTF-8 bytes.
_GRPC_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


def grpc_message(decision: Decision, request_id: str | None) -> str:
    """The ``grpc-message`` value: reason code, surrogate's sentence and request id, percent-encoded."""
    text = f"surrogate refused this request ({decision.reason.value}): {decision.message}"
    if request_id is not None:
        text += f" (request_id {request_id})"
    return quote(text, safe=_GRPC_SAFE)


def json_body(decision: Decision, request_id: str | None) -> bytes:
    """The JSON refusal: ``{"error", "decision", "message", "request_id"}``."""
    return json.dumps(
        {
            "error": decision.reason.value,
            "decision": decision.action.value,
            "message": decision.message,
            "request_id": request_id,
        }
    ).encode()
