"""HMAC request signing (credential kind ``hmac``, issue 15): a small declared set, no template
language.

A credential of kind ``hmac`` holds a shared secret (its ``value``) and a :class:`SignSpec`.
Toward its hosts (over TLS), surrogate sets ``timestamp_header`` to the current Unix time in
seconds and ``header`` to ``format`` with ``{signature}`` replaced by the HMAC of the
string-to-sign, whatever the sandbox sent. The string-to-sign is the declared ``parts`` in
order, joined by ``separator`` (default: nothing):

==============  =================================================================
``timestamp``   the timestamp surrogate sets (decimal seconds)
``method``      the request method, upper case (``GET``)
``path``        the request path as sent, without the query (``/v1/orders``)
``query``       ``?`` and the query as sent, or nothing when there is none
``body``        the request body's bytes as sent (empty when there is none)
``body_sha256`` the lower-case hex SHA-256 of those bytes
==============  =================================================================

The default is the documented example (rules/README.md, a Coinbase-style ``X-Signature``):
``timestamp + method + path + query + body``, HMAC-SHA256, hex, in ``X-Signature``, with
``X-Timestamp``. ``algorithm`` is ``hmac-sha256`` or ``hmac-sha512``; ``encoding`` ``hex`` or
``base64``.

The signature goes in the request head, which leaves before the body: a signed body is read
whole first, so it is bounded (``max_body``, default and at most 1 MiB: past mitmproxy's
``stream_large_bodies`` it would start streaming and send the head unsigned) and must declare its length
(``Content-Length``); a longer body, or one without a length, is refused before anything is
sent (addons/sign.py). Pure; the time is passed in.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass

from proxy.core.secrets import Secret

PARTS = ("timestamp", "method", "path", "query", "body", "body_sha256")
ALGORITHMS = {"hmac-sha256": hashlib.sha256, "hmac-sha512": hashlib.sha512}
ENCODINGS = ("hex", "base64")
DEFAULT_PARTS = ("timestamp", "method", "path", "query", "body")
MAX_BODY = 1024 * 1024


@dataclass(frozen=True, slots=True)
class SignSpec:
    algorithm: str = "hmac-sha256"
    parts: tuple[str, ...] = DEFAULT_PARTS
    separator: str = ""
    encoding: str = "hex"
    header: str = "X-Signature"
    format: str = "{signature}"
    timestamp_header: str = "X-Timestamp"
    max_body: int = MAX_BODY

    @property
    def signs_body(self) -> bool:
        return "body" in self.parts or "body_sha256" in self.parts


def problems(spec: SignSpec) -> list[tuple[str, str]]:
    """What is wrong with ``spec``, as (field, sentence) pairs; empty when it is usable."""
    out = []
    if spec.algorithm not in ALGORITHMS:
        out.append(
            ("algorithm", f"unknown algorithm {spec.algorithm!r}; expected one of: {', '.join(ALGORITHMS)}")
        )
    if spec.encoding not in ENCODINGS:
        out.append(
            ("encoding", f"unknown encoding {spec.encoding!r}; expected one of: {', '.join(ENCODINGS)}")
        )
    if not spec.parts:
        out.append(("parts", "parts must name what is signed"))
    for p in spec.parts:
        if p not in PARTS:
            out.append(("parts", f"unknown part {p!r}; expected some of: {', '.join(PARTS)}"))
    if "{signature}" not in spec.format or any(ord(c) < 32 or ord(c) == 127 for c in spec.format):
        out.append(("format", "format must contain '{signature}' and no control characters"))
    if any(ord(c) < 32 or ord(c) == 127 for c in spec.separator):
        out.append(("separator", "separator must not contain control characters"))
    if not 0 <= spec.max_body <= MAX_BODY:  # mitmproxy's stream_large_bodies: addons/sign.py
        out.append(("max_body", f"max_body must be between 0 and {MAX_BODY} bytes"))
    return out


def string_to_sign(spec: SignSpec, timestamp: int, method: str, path: str, body: bytes) -> bytes:
    """The bytes signed for a request whose target is ``path`` (path and query, as sent)."""
    bare, sep, query = path.partition("?")
    values = {
        "timestamp": str(timestamp).encode(),
        "method": method.upper().encode(),
        "path": bare.encode(),
        "query": (sep + query).encode() if query else b"",
        "body": body,
        "body_sha256": hashlib.sha256(body).hexdigest().encode(),
    }
    return spec.separator.encode().join(values[p] for p in spec.parts)


def signature(spec: SignSpec, key: Secret, message: bytes) -> str:
    """The header value: ``format`` with the encoded HMAC of ``message`` under ``key``."""
    mac = hmac.new(key.reveal().encode(), message, ALGORITHMS[spec.algorithm]).digest()
    encoded = mac.hex() if spec.encoding == "hex" else base64.b64encode(mac).decode()
    return spec.format.replace("{signature}", encoded)
