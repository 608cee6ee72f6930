"""AWS Signature Version 4: parse a signed request, verify it was signed with the placeholder
secret key, and re-sign the same canonical request with the real key.

Sources: AWS "Signature Version 4 signing process" (canonical request, string to sign, signing
key), "Authenticating Requests: Using Query Parameters (AWS Signature Version 4)" (presigned
URLs) and the S3 "Signature calculations for the Authorization header". Pure: no I/O, no clock.
botocore (``botocore.auth.SigV4Auth``) cannot be imported here: it pulls in ``os``, ``logging``
and ``urllib3`` at import time, which the core may not (tests/unit/test_layers.py). The
algorithm is therefore written here from the AWS documents, and the tests hold it to the AWS
test suite's vectors and to botocore's own signer (botocore signs, this module verifies).

Shapes:
- :func:`parse` → :class:`Signed` | None (None: the request carries no SigV4 at all);
  raises :class:`SigV4Error` (reason ``sigv4_malformed``) for a claimed but unreadable signature.
- :func:`resign` → :class:`Resigned` (new header fields and request target); raises
  :class:`SigV4Error` with reason ``sigv4_bad_signature``, ``sigv4_scope_refused``,
  ``sigv4_wrong_key`` or ``sigv4_malformed``.

The canonical request is built from the request as it will reach the upstream (the fields and
target after every other rewrite), so what the real signature covers is what is sent.
Canonical URI: S3 (service ``s3``) signs the path as sent; every other service signs the
normalised (dot segments and empty segments removed) path URI-encoded once more, as the AWS
document and botocore do. Canonical query: the pairs as sent, sorted, ``X-Amz-Signature``
left out in the presigned form.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import quote
from urllib.parse import unquote as _unquote

ALGORITHM = "AWS4-HMAC-SHA256"
UNSIGNED = "UNSIGNED-PAYLOAD"
STREAMING = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
STREAMING_UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()

Fields = Sequence[tuple[bytes, bytes]]


class SigV4Error(Exception):
    """A request that cannot be re-signed: ``reason`` is the audit reason code, ``message`` a
    sentence without any key or signature value."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True, slots=True)
class Keys:
    """One AWS key pair (and session token). Only the access key id shows in a repr."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class Signed:
    """What a request claims: ``form`` is ``"header"`` (Authorization) or ``"query"`` (presigned)."""

    form: str
    access_key_id: str
    date: str  # YYYYMMDD of the credential scope
    region: str
    service: str
    signed_headers: tuple[str, ...]
    signature: str
    amz_date: str  # X-Amz-Date, ISO 8601 basic
    payload_hash: str | None  # X-Amz-Content-Sha256 / UNSIGNED-PAYLOAD; None: hash the body

    @property
    def scope(self) -> str:
        return f"{self.date}/{self.region}/{self.service}/aws4_request"


@dataclass(frozen=True, slots=True)
class Resigned:
    fields: list[tuple[bytes, bytes]]
    target: str
    seed: str = field(repr=False)  # the real signature: the seed of a chunk chain
    placeholder_seed: str = field(repr=False)  # the sandbox's one, which its chunks chain on
    signed: Signed = field(repr=False)


@dataclass(frozen=True, slots=True)
class SigV4Spec:
    """An ``aws_sigv4`` credential's placeholders (its access key id placeholder is the
    credential's ``placeholder``) and what it may sign for."""

    placeholder_secret: str = field(repr=False)
    placeholder_token: str | None = field(repr=False)
    allowed: Allowed

    def placeholder_keys(self, access_key_id: str) -> Keys:
        return Keys(access_key_id, self.placeholder_secret, self.placeholder_token)


def real_keys(value: str) -> Keys:
    """The real keys from a credential's sealed value: JSON ``{"access_key_id",
    "secret_access_key", "session_token"?}``. Raises SigV4Error (``sigv4_malformed``) naming
    the field, never a value."""
    try:
        doc = json.loads(value)
    except ValueError:
        raise SigV4Error("sigv4_malformed", "the aws_sigv4 value is not JSON") from None
    names = {"access_key_id", "secret_access_key", "session_token"}
    if not isinstance(doc, dict) or not {"access_key_id", "secret_access_key"} <= set(doc) <= names:
        raise SigV4Error("sigv4_malformed", "the aws_sigv4 value needs access_key_id and secret_access_key")
    token = doc.get("session_token")
    if not all(isinstance(doc[k], str) and doc[k] for k in ("access_key_id", "secret_access_key")) or not (
        token is None or isinstance(token, str)
    ):
        raise SigV4Error("sigv4_malformed", "the aws_sigv4 value's fields must be non-empty strings")
    return Keys(doc["access_key_id"], doc["secret_access_key"], token)


def sigv4_pairs(value: str, placeholder: str, spec: SigV4Spec) -> list[tuple[bytes, bytes]]:
    """(real, placeholder) pairs the scrubber replaces in responses: the access key id, the
    secret key and the session token (its placeholder, or the key id's when it has none), each
    also URI-encoded where that differs (the presigned query's spelling), and each of these in hex
    (lower and upper case, bare and with a space between bytes: S3's ``CanonicalRequestBytes``)."""
    try:
        real = real_keys(value)
    except SigV4Error:
        return []
    out = [(real.access_key_id.encode(), placeholder.encode())]
    out.append((real.secret_access_key.encode(), spec.placeholder_secret.encode()))
    if real.session_token:
        out.append((real.session_token.encode(), (spec.placeholder_token or placeholder).encode()))
    # A presigned URL carries the token URI-encoded (resign: + / = as %2B %2F %3D; lower-case
    # escapes from a client that spells them so), and S3 hexes that form: both forms, hexed below
    encoded = [(quote(r.decode(), safe="-_.~"), p) for r, p in out]
    encoded += [(_lower_escapes(e), p) for e, p in encoded]
    raw = {r for r, _ in out}
    out += list(dict.fromkeys((e.encode(), p) for e, p in encoded if e.encode() not in raw))
    # S3's SignatureDoesNotMatch answer repeats the canonical request it computed as
    # <CanonicalRequestBytes>, space-separated lower-case hex: with the real key id (in the
    # presigned X-Amz-Credential) and the real session token (a signed header, or the query).
    # Hex is no form the scrubber knows in general (proxy.core.scrub), so this kind adds it.
    out += [
        (_hex(r, sep, upper), _hex(p, sep, upper))
        for r, p in list(out)
        for sep in ("", " ")
        for upper in (False, True)
    ]
    return out


def _lower_escapes(encoded: str) -> str:
    return re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), encoded)


def _hex(value: bytes, sep: str, upper: bool) -> bytes:
    text = sep.join(f"{b:02X}" if upper else f"{b:02x}" for b in value)
    return text.encode("ascii")


def _header(fields: Fields, name: bytes) -> str | None:
    for k, v in fields:
        if k.lower() == name:
            return v.decode("latin-1")
    return None


def _split_target(target: str) -> tuple[str, str]:
    path, _, query = target.partition("?")
    return path, query


def _pairs(query: str) -> list[tuple[str, str]]:
    out = []
    for pair in query.split("&") if query else []:
        k, _, v = pair.partition("=")
        out.append((k, v))
    return out


def _credential(value: str) -> tuple[str, str, str, str]:
    parts = value.split("/")
    if len(parts) != 5 or parts[4] != "aws4_request" or not all(parts):
        raise SigV4Error(
            "sigv4_malformed", "the SigV4 credential scope is not key/date/region/service/aws4_request"
        )
    return parts[0], parts[1], parts[2], parts[3]


# Header fields the signature's reading depends on: one of each, or the proxy and the upstream
# could read different ones (DESIGN.md invariant 8).
_SINGLE = (b"authorization", b"x-amz-date", b"x-amz-content-sha256", b"x-amz-security-token")
# Query parameters of the presigned form: none of them beside an Authorization header.
_QUERY_AUTH = frozenset({
    "X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-Expires", "X-Amz-SignedHeaders",
    "X-Amz-Signature", "X-Amz-Security-Token",
})  # fmt: skip
# Payload hashes re-signed here; any other (the signed-trailer and SigV4a ECDSA streaming
# variants, whose chunk or trailer signatures chain on a seed this proxy would not re-sign) is
# refused before anything is sent, not left for the upstream to reject.
PAYLOADS = frozenset({UNSIGNED, STREAMING, STREAMING_UNSIGNED_TRAILER})
_HEX64 = frozenset("0123456789abcdef")


def _payload_ok(payload: str | None) -> bool:
    return payload is None or payload in PAYLOADS or (len(payload) == 64 and set(payload) <= _HEX64)


def parse(target: str, fields: Fields) -> Signed | None:
    """The SigV4 claim of a request (header form first, then the presigned query form).

    Ambiguous claims raise ``sigv4_malformed``: a repeated ``Authorization``, ``X-Amz-Date``,
    ``X-Amz-Content-Sha256`` or ``X-Amz-Security-Token``; an ``Authorization`` header beside a
    presigned query parameter (either form); an ``X-Amz-Security-Token`` header beside a
    presigned query; a payload hash that is not 64 lower-case hex digits, ``UNSIGNED-PAYLOAD``,
    ``STREAMING-AWS4-HMAC-SHA256-PAYLOAD`` or ``STREAMING-UNSIGNED-PAYLOAD-TRAILER``.
    """
    auth = _header(fields, b"authorization")
    _, query = _split_target(target)
    params = {_unquote(k): _unquote(v) for k, v in _pairs(query)}
    signs = (auth is not None and auth.strip().startswith(ALGORITHM + " ")) or any(
        k in params for k in ("X-Amz-Algorithm", "X-Amz-Signature")
    )
    if signs:
        for name in _SINGLE:
            if sum(1 for k, _ in fields if k.lower() == name) > 1:
                raise SigV4Error("sigv4_malformed", f"the request repeats {name.decode()}")
        if auth is not None and _QUERY_AUTH & set(params):
            why = "the request carries both an Authorization header and X-Amz- query parameters"
            raise SigV4Error("sigv4_malformed", why)
        payload = _header(fields, b"x-amz-content-sha256")
        if not _payload_ok(payload):
            why = "the X-Amz-Content-Sha256 variant is not one surrogate re-signs"
            raise SigV4Error("sigv4_malformed", why)
    if auth is not None and auth.strip().startswith(ALGORITHM + " "):
        items: dict[str, str] = {}
        for part in auth.strip()[len(ALGORITHM) + 1 :].split(","):
            k, sep, v = part.strip().partition("=")
            if not sep or k in items:
                raise SigV4Error(
                    "sigv4_malformed",
                    "the Authorization header is not Credential=, SignedHeaders=, Signature=",
                )
            items[k] = v
        if set(items) != {"Credential", "SignedHeaders", "Signature"}:
            raise SigV4Error(
                "sigv4_malformed", "the Authorization header is not Credential=, SignedHeaders=, Signature="
            )
        amz_date = _header(fields, b"x-amz-date")
        payload = _header(fields, b"x-amz-content-sha256")
        return _signed(
            "header", items["Credential"], items["SignedHeaders"], items["Signature"], amz_date, payload
        )
    if "X-Amz-Algorithm" in params or "X-Amz-Signature" in params:
        if params.get("X-Amz-Algorithm") != ALGORITHM:
            raise SigV4Error("sigv4_malformed", "the presigned URL's X-Amz-Algorithm is not AWS4-HMAC-SHA256")
        need = ("X-Amz-Credential", "X-Amz-SignedHeaders", "X-Amz-Signature", "X-Amz-Date")
        if any(n not in params for n in need) or len(_pairs(query)) != len(params):
            raise SigV4Error("sigv4_malformed", "the presigned URL lacks or repeats an X-Amz- parameter")
        if _header(fields, b"x-amz-security-token") is not None:
            raise SigV4Error("sigv4_malformed", "a presigned URL with an X-Amz-Security-Token header")
        payload = _header(fields, b"x-amz-content-sha256") or UNSIGNED
        return _signed(
            "query", params["X-Amz-Credential"], params["X-Amz-SignedHeaders"], params["X-Amz-Signature"],
            params["X-Amz-Date"], payload,
        )  # fmt: skip
    return None


def _signed(
    form: str, cred: str, headers: str, sig: str, amz_date: str | None, payload: str | None
) -> Signed:
    key, date, region, service = _credential(cred)
    names = tuple(headers.split(";"))
    if not amz_date or not amz_date.startswith(date) or len(amz_date) != 16:
        raise SigV4Error("sigv4_malformed", "X-Amz-Date is missing or not the credential scope's date")
    if "host" not in names or list(names) != sorted(set(names)) or any(n != n.lower() for n in names):
        raise SigV4Error(
            "sigv4_malformed", "SignedHeaders must be sorted, lower-case, unique and include host"
        )
    if len(sig) != 64 or any(c not in "0123456789abcdef" for c in sig):
        raise SigV4Error("sigv4_malformed", "the signature is not 64 lower-case hex digits")
    return Signed(form, key, date, region, service, names, sig, amz_date, payload)


def canonical_uri(path: str, service: str) -> str:
    if service == "s3":
        return path or "/"
    segments = [s for s in path.split("/") if s and s != "."]
    out: list[str] = []
    for s in segments:
        if s == "..":
            if out:
                out.pop()
        else:
            out.append(s)
    normal = "/" + "/".join(out) + ("/" if path.endswith("/") and out else "")
    return quote(normal, safe="/~")


def canonical_query(query: str, presigned: bool) -> str:
    pairs = [(k, v) for k, v in _pairs(query) if not (presigned and k == "X-Amz-Signature")]
    return "&".join(f"{k}={v}" for k, v in sorted(pairs))


def canonical_headers(fields: Fields, names: Sequence[str], authority: str) -> str:
    lines = []
    for name in names:
        values = [v.decode("latin-1") for k, v in fields if k.decode("latin-1").lower() == name]
        if name == "host" and not values:
            values = [authority]  # HTTP/2: :authority stands for Host
        if not values:
            raise SigV4Error("sigv4_malformed", f"signed header {name!r} is not in the request")
        lines.append(f"{name}:" + ",".join(" ".join(v.split()) for v in values))
    return "\n".join(lines)


def canonical_request(
    method: str, target: str, fields: Fields, signed: Signed, authority: str, payload_hash: str
) -> str:
    path, query = _split_target(target)
    return "\n".join(
        [
            method.upper(),
            canonical_uri(path, signed.service),
            canonical_query(query, signed.form == "query"),
            canonical_headers(fields, signed.signed_headers, authority) + "\n",
            ";".join(signed.signed_headers),
            payload_hash,
        ]
    )


def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    k = hmac.digest(("AWS4" + secret).encode("utf-8"), date.encode("ascii"), "sha256")
    for part in (region, service, "aws4_request"):
        k = hmac.digest(k, part.encode("utf-8"), "sha256")
    return k


def string_to_sign(amz_date: str, scope: str, creq: str) -> str:
    return "\n".join([ALGORITHM, amz_date, scope, hashlib.sha256(creq.encode("utf-8")).hexdigest()])


def sign(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).hexdigest()


@dataclass(frozen=True, slots=True)
class Allowed:
    """What a credential may sign for: region and service names (``*`` for any)."""

    regions: frozenset[str]
    services: frozenset[str]

    def permits(self, region: str, service: str) -> bool:
        return ("*" in self.regions or region in self.regions) and (
            "*" in self.services or service in self.services
        )


def _replace_query(query: str, swaps: dict[str, str]) -> str:
    out = []
    for k, v in _pairs(query):
        if k in swaps:
            v = quote(swaps[k], safe="-_.~")
        out.append(f"{k}={v}" if v or k in swaps else k)
    return "&".join(out)


def resign(
    method: str,
    target: str,
    fields: Fields,
    authority: str,
    signed: Signed,
    placeholder: Keys,
    real: Keys,
    allowed: Allowed,
    body_hash: str | None = None,
) -> Resigned:
    """Verify ``signed`` as the placeholder's, then sign the same request with ``real``.

    ``body_hash`` is the SHA-256 (hex) of the body, needed when the request declares no
    payload hash (``signed.payload_hash`` None: services other than S3 hash the body).
    """
    if signed.access_key_id != placeholder.access_key_id:
        raise SigV4Error(
            "sigv4_wrong_key",
            "the request is signed with an access key id that is not this credential's placeholder",
        )
    if not allowed.permits(signed.region, signed.service):
        raise SigV4Error(
            "sigv4_scope_refused",
            f"region {signed.region!r} / service {signed.service!r} is not allowed for this credential",
        )
    payload = signed.payload_hash if signed.payload_hash is not None else body_hash
    if payload is None:
        raise SigV4Error("sigv4_malformed", "the payload hash is unknown")
    token_names = ("x-amz-security-token",)
    sent_token = _header(fields, b"x-amz-security-token")
    path, query = _split_target(target)
    if signed.form == "query":
        sent_token = {_unquote(k): _unquote(v) for k, v in _pairs(query)}.get("X-Amz-Security-Token")
    if sent_token is not None and sent_token != placeholder.session_token:
        raise SigV4Error("sigv4_wrong_key", "the session token is not this credential's placeholder")
    key = signing_key(placeholder.secret_access_key, signed.date, signed.region, signed.service)
    creq = canonical_request(method, target, fields, signed, authority, payload)
    expect = sign(key, string_to_sign(signed.amz_date, signed.scope, creq))
    if not hmac.compare_digest(expect, signed.signature):
        raise SigV4Error("sigv4_bad_signature", "the request's SigV4 signature is not the placeholder key's")
    real_cred = f"{real.access_key_id}/{signed.scope}"
    new_fields = list(fields)
    if signed.form == "query":
        swaps = {"X-Amz-Credential": real_cred}
        if real.session_token is not None:
            swaps["X-Amz-Security-Token"] = real.session_token
        if sent_token is None and real.session_token is not None:
            query = query + "&X-Amz-Security-Token=" + quote(real.session_token, safe="-_.~")
        query = _replace_query(query, swaps)
        drop = ("X-Amz-Signature=",) + (("X-Amz-Security-Token=",) if real.session_token is None else ())
        without = "&".join(p for p in query.split("&") if not p.startswith(drop))
        new_target = f"{path}?{without}"
    else:
        new_target = target
        new_fields = [(k, v) for k, v in new_fields if k.lower().decode("latin-1") not in token_names]
        if real.session_token is not None:
            new_fields.append((b"X-Amz-Security-Token", real.session_token.encode("latin-1")))
    key = signing_key(real.secret_access_key, signed.date, signed.region, signed.service)
    creq = canonical_request(method, new_target, new_fields, signed, authority, payload)
    seed = sign(key, string_to_sign(signed.amz_date, signed.scope, creq))
    if signed.form == "query":
        new_target = f"{new_target}&X-Amz-Signature={seed}"
    else:
        names = ";".join(signed.signed_headers)
        auth = f"{ALGORITHM} Credential={real_cred}, SignedHeaders={names}, Signature={seed}"
        new_fields = [
            (k, v) if k.lower() != b"authorization" else (k, auth.encode("ascii")) for k, v in new_fields
        ]
    return Resigned(new_fields, new_target, seed, signed.signature, signed)
