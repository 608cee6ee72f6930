"""proxy.core.sigv4: the AWS SigV4 test suite's vectors, botocore as the signing oracle, and
one row per refusal reason."""

from __future__ import annotations

import hashlib
import json

import pytest
from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from proxy.core import sigv4
from proxy.core.sigv4 import Allowed, Keys, SigV4Error

# The AWS Signature Version 4 test suite (aws-sig-v4-test-suite): key, date, scope and the
# expected Authorization of each case are data from the suite.
SUITE = Keys("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
SCOPE = "Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request"
DATE = (b"X-Amz-Date", b"20150830T123600Z")
HOST = (b"Host", b"example.amazonaws.com")
VECTORS = [
    ("get-vanilla", "GET", "/", [HOST, DATE], "host;x-amz-date",
     "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"),
    ("post-vanilla", "POST", "/", [HOST, DATE], "host;x-amz-date",
     "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b"),
    ("get-vanilla-query-order-key-case", "GET", "/?Param2=value2&Param1=value1", [HOST, DATE], "host;x-amz-date",  # noqa: E501 (test vector data)
     "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"),
    ("post-header-value-case", "POST", "/", [HOST, (b"My-Header1", b"VALUE1"), DATE], "host;my-header1;x-amz-date",  # noqa: E501 (test vector data)
     "cdbc9802e29d2942e5e10b5bccfdd67c5f22c7c4e8ae67b53629efa58b974b7d"),
    ("get-header-value-trim", "GET", "/", [HOST, (b"My-Header1", b" value1"), (b"My-Header2", b'"a   b   c"'), DATE],  # noqa: E501 (test vector data)
     "host;my-header1;my-header2;x-amz-date", "acc3ed3afb60bb290fc8d2dd0098b9911fcaa05412b367055dee359757a9c736"),  # noqa: E501 (test vector data)
    ("get-unreserved", "GET", "/-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz", [HOST, DATE],  # noqa: E501 (test vector data)
     "host;x-amz-date", "07ef7494c76fa4850883e2b006601f940f8a34d404d0cfa977f52a65bbf5f24f"),
]  # fmt: skip
ANY = Allowed(frozenset({"*"}), frozenset({"*"}))
REAL = Keys("AKIAREALREALREAL0001", "real/secret+KEY0000000000000000000000000", "real-session-token")


def _with_auth(fields: list[tuple[bytes, bytes]], headers: str, sig: str) -> list[tuple[bytes, bytes]]:
    auth = f"AWS4-HMAC-SHA256 {SCOPE}, SignedHeaders={headers}, Signature={sig}"
    return [*fields, (b"Authorization", auth.encode())]


@pytest.mark.parametrize(
    ("name", "method", "target", "fields", "headers", "sig"), VECTORS, ids=[v[0] for v in VECTORS]
)
def test_suite_vector_verifies(
    name: str, method: str, target: str, fields: list, headers: str, sig: str
) -> None:
    """Each suite request verifies under the suite key; re-signed with that same key it is unchanged."""
    req = _with_auth(fields, headers, sig)
    signed = sigv4.parse(target, req)
    assert signed is not None and signed.signature == sig
    out = sigv4.resign(
        method, target, req, "example.amazonaws.com", signed, SUITE, SUITE, ANY, sigv4.EMPTY_SHA256
    )
    assert out.fields == req and out.seed == sig


@pytest.mark.parametrize(
    ("name", "method", "target", "fields", "headers", "sig"), VECTORS, ids=[v[0] for v in VECTORS]
)
def test_suite_vector_wrong_key_refused(
    name: str, method: str, target: str, fields: list, headers: str, sig: str
) -> None:
    req = _with_auth(fields, headers, sig)
    signed = sigv4.parse(target, req)
    assert signed is not None
    other = Keys("AKIDEXAMPLE", "not-the-placeholder-secret")
    with pytest.raises(SigV4Error) as e:
        sigv4.resign(
            method, target, req, "example.amazonaws.com", signed, other, REAL, ANY, sigv4.EMPTY_SHA256
        )
    assert e.value.reason == "sigv4_bad_signature"


def test_s3_get_object_example() -> None:
    """The S3 documentation's GET Object example (header form, hashed empty payload)."""
    fields = [
        (b"Host", b"examplebucket.s3.amazonaws.com"),
        (b"Range", b"bytes=0-9"),
        (b"x-amz-content-sha256", sigv4.EMPTY_SHA256.encode()),
        (b"x-amz-date", b"20130524T000000Z"),
        (b"Authorization", b"AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "  # noqa: E501 (test vector data)
         b"SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
         b"Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"),
    ]  # fmt: skip
    key = Keys("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
    signed = sigv4.parse("/test.txt", fields)
    assert signed is not None and signed.service == "s3"
    out = sigv4.resign("GET", "/test.txt", fields, "examplebucket.s3.amazonaws.com", signed, key, key, ANY)
    assert out.fields == fields


PLACEHOLDER = Keys(
    "surr_AwsKeyIdPlaceholder0001", "surr_AwsSecretPlaceholder0001", "surr_AwsTokenPlaceholder0001"
)


def _botocore(keys: Keys, method: str, url: str, service: str, body: bytes = b"", presign: bool = False,
              headers: dict[str, str] | None = None) -> AWSRequest:  # fmt: skip
    creds = Credentials(keys.access_key_id, keys.secret_access_key, keys.session_token)
    req = AWSRequest(method=method, url=url, data=body, headers=headers or {})
    if presign:
        from botocore.auth import S3SigV4QueryAuth

        S3SigV4QueryAuth(creds, service, "eu-west-1", expires=300).add_auth(req)
    else:
        (S3SigV4Auth if service == "s3" else SigV4Auth)(creds, service, "eu-west-1").add_auth(req)
    return req


def _fields(req: AWSRequest, host: str) -> list[tuple[bytes, bytes]]:
    return [(b"Host", host.encode()), *((k.encode(), v.encode()) for k, v in req.headers.items())]


CASES = [
    ("s3-put", "PUT", "https://bucket.s3.local/key%20one.txt", "s3", b"hello", {}),
    ("s3-get-query", "GET", "https://bucket.s3.local/a/b?list-type=2&prefix=x%2Fy", "s3", b"", {}),
    ("sts-form", "POST", "https://sts.local/", "sts", b"Action=GetCallerIdentity&Version=2011-06-15",
     {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"}),
    ("service-double-encoded", "GET", "https://svc.local/a%20b/./c//d", "execute-api", b"", {}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "method", "url", "service", "body", "headers"), CASES, ids=[c[0] for c in CASES]
)
def test_resigned_is_what_botocore_signs_with_the_real_key(
    name: str, method: str, url: str, service: str, body: bytes, headers: dict[str, str]
) -> None:
    """botocore signs with the placeholder (the sandbox), surrogate re-signs: the result is what
    botocore itself signs with the real key (same date)."""
    sandbox = _botocore(PLACEHOLDER, method, url, service, body, headers=headers)
    host = url.split("/")[2]
    target = url.split(host, 1)[1]
    fields = _fields(sandbox, host)
    signed = sigv4.parse(target, fields)
    assert signed is not None
    out = sigv4.resign(
        method, target, fields, host, signed, PLACEHOLDER, REAL, ANY, hashlib.sha256(body).hexdigest()
    )
    real = _botocore(
        REAL, method, url, service, body, headers={**headers, "X-Amz-Date": sandbox.headers["X-Amz-Date"]}
    )
    got = {k.decode().lower(): v.decode() for k, v in out.fields}
    assert got["authorization"] == real.headers["Authorization"]
    assert got["x-amz-security-token"] == REAL.session_token
    assert PLACEHOLDER.access_key_id not in repr(out.fields)


def test_presigned_resigned_is_what_botocore_presigns() -> None:
    sandbox = _botocore(PLACEHOLDER, "GET", "https://bucket.s3.local/obj.bin", "s3", presign=True)
    target = sandbox.url.split("bucket.s3.local", 1)[1]
    fields = [(b"Host", b"bucket.s3.local")]
    signed = sigv4.parse(target, fields)
    assert signed is not None and signed.form == "query"
    out = sigv4.resign("GET", target, fields, "bucket.s3.local", signed, PLACEHOLDER, REAL, ANY)
    assert PLACEHOLDER.access_key_id not in out.target and "surr_" not in out.target
    assert REAL.access_key_id in out.target
    # verify the result with the real key: it must parse and verify as REAL's
    again = sigv4.parse(out.target, fields)
    assert again is not None
    sigv4.resign("GET", out.target, fields, "bucket.s3.local", again, REAL, REAL, ANY)


def test_signed_with_placeholder_secret_but_other_key_id() -> None:
    sandbox = _botocore(
        Keys("AKIAOTHERKEYID000000", PLACEHOLDER.secret_access_key), "GET", "https://s.local/", "s3"
    )
    fields = _fields(sandbox, "s.local")
    signed = sigv4.parse("/", fields)
    assert signed is not None
    with pytest.raises(SigV4Error) as e:
        sigv4.resign("GET", "/", fields, "s.local", signed, PLACEHOLDER, REAL, ANY)
    assert e.value.reason == "sigv4_wrong_key"


def test_wrong_session_token_refused() -> None:
    keys = Keys(PLACEHOLDER.access_key_id, PLACEHOLDER.secret_access_key, "another-token")
    fields = _fields(_botocore(keys, "GET", "https://s.local/", "s3"), "s.local")
    signed = sigv4.parse("/", fields)
    assert signed is not None
    with pytest.raises(SigV4Error) as e:
        sigv4.resign("GET", "/", fields, "s.local", signed, PLACEHOLDER, REAL, ANY)
    assert e.value.reason == "sigv4_wrong_key"


@pytest.mark.parametrize(
    ("regions", "services"),
    [({"us-east-1"}, {"s3"}), ({"eu-west-1"}, {"sts"}), ({"*"}, {"sqs"}), ({"us-*"}, {"*"})],
    ids=["region", "service", "service-any-region", "region-no-glob"],
)
def test_scope_refused(regions: set[str], services: set[str]) -> None:
    fields = _fields(_botocore(PLACEHOLDER, "GET", "https://s.local/", "s3"), "s.local")
    signed = sigv4.parse("/", fields)
    assert signed is not None
    with pytest.raises(SigV4Error) as e:
        sigv4.resign(
            "GET",
            "/",
            fields,
            "s.local",
            signed,
            PLACEHOLDER,
            REAL,
            Allowed(frozenset(regions), frozenset(services)),
        )
    assert e.value.reason == "sigv4_scope_refused"


def test_changed_after_signing_refused() -> None:
    """A signed header, the path or the query changed after signing: not the placeholder's signature."""
    fields = _fields(_botocore(PLACEHOLDER, "GET", "https://s.local/a?x=1", "s3"), "s.local")
    for target, fs in [
        ("/b?x=1", fields),
        ("/a?x=2", fields),
        ("/a?x=1", [(b"Host", b"t.local"), *fields[1:]]),
    ]:
        signed = sigv4.parse(target, fs)
        assert signed is not None
        with pytest.raises(SigV4Error) as e:
            sigv4.resign("GET", target, fs, "s.local", signed, PLACEHOLDER, REAL, ANY)
        assert e.value.reason == "sigv4_bad_signature"


def test_unsigned_is_none() -> None:
    assert sigv4.parse("/?a=b", [(b"Host", b"h"), (b"Authorization", b"Bearer x")]) is None


MALFORMED = [
    ("two-credentials", [(b"Authorization", b"AWS4-HMAC-SHA256 Credential=a/b/c/d/aws4_request, Credential=x, SignedHeaders=host, Signature=" + b"0" * 64)]),  # noqa: E501 (test vector data)
    ("bad-scope", [(b"Authorization", b"AWS4-HMAC-SHA256 Credential=a/b/c, SignedHeaders=host, Signature=" + b"0" * 64), DATE]),  # noqa: E501 (test vector data)
    ("no-host", [(b"Authorization", b"AWS4-HMAC-SHA256 Credential=a/20150830/r/s/aws4_request, SignedHeaders=x-amz-date, Signature=" + b"0" * 64), DATE]),  # noqa: E501 (test vector data)
    ("no-date", [(b"Authorization", b"AWS4-HMAC-SHA256 Credential=a/20150830/r/s/aws4_request, SignedHeaders=host, Signature=" + b"0" * 64)]),  # noqa: E501 (test vector data)
    ("short-sig", [(b"Authorization", b"AWS4-HMAC-SHA256 Credential=a/20150830/r/s/aws4_request, SignedHeaders=host, Signature=00"), DATE]),  # noqa: E501 (test vector data)
    ("unsorted", [(b"Authorization", b"AWS4-HMAC-SHA256 Credential=a/20150830/r/s/aws4_request, SignedHeaders=x-amz-date;host, Signature=" + b"0" * 64), DATE]),  # noqa: E501 (test vector data)
]  # fmt: skip


@pytest.mark.parametrize(("name", "fields"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed(name: str, fields: list) -> None:
    with pytest.raises(SigV4Error) as e:
        sigv4.parse("/", fields)
    assert e.value.reason == "sigv4_malformed"


@pytest.mark.parametrize(
    "query",
    ["X-Amz-Algorithm=AWS4-HMAC-SHA1&X-Amz-Signature=" + "0" * 64, "X-Amz-Signature=" + "0" * 64,
     "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=a%2F20150830%2Fr%2Fs%2Faws4_request"
     "&X-Amz-Date=20150830T123600Z&X-Amz-SignedHeaders=host&X-Amz-Signature=" + "0" * 64],
    ids=["algorithm", "signature-only", "repeated"],
)  # fmt: skip
def test_presigned_malformed(query: str) -> None:
    with pytest.raises(SigV4Error) as e:
        sigv4.parse("/?" + query, [(b"Host", b"h")])
    assert e.value.reason == "sigv4_malformed"


def test_keys_repr_hides_secrets() -> None:
    assert REAL.secret_access_key not in repr(REAL) and "real-session-token" not in repr(REAL)


# Review r-sign2: where the proxy and the upstream could read a claim differently, it is refused.
_AUTH = (b"Authorization", b"AWS4-HMAC-SHA256 Credential=a/20150830/r/s/aws4_request, SignedHeaders=host;x-amz-date, Signature=" + b"0" * 64)  # noqa: E501 (test vector data)
_PRESIGNED = ("X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=a%2F20150830%2Fr%2Fs%2Faws4_request"
              "&X-Amz-Date=20150830T123600Z&X-Amz-SignedHeaders=host&X-Amz-Signature=" + "0" * 64)
_SHA = b"x-amz-content-sha256"
AMBIGUOUS = [
    ("two-authorization", "/", [HOST, DATE, _AUTH, _AUTH]),
    ("two-authorization-cases", "/", [HOST, DATE, _AUTH, (b"authorization", _AUTH[1])]),
    ("two-amz-date", "/", [HOST, DATE, (b"x-amz-date", b"20150830T000000Z"), _AUTH]),
    ("two-content-sha256", "/", [HOST, DATE, _AUTH, (_SHA, b"UNSIGNED-PAYLOAD"), (_SHA, sigv4.STREAMING.encode())]),  # noqa: E501
    ("two-security-token", "/", [HOST, DATE, _AUTH, (b"X-Amz-Security-Token", b"a"), (b"x-amz-security-token", b"b")]),  # noqa: E501
    ("header-and-query-token", "/?X-Amz-Security-Token=t", [HOST, DATE, _AUTH]),
    ("header-and-query-signature", "/?X-Amz-Signature=" + "0" * 64, [HOST, DATE, _AUTH]),
    ("header-and-query-credential", "/?X-Amz-Credential=a", [HOST, DATE, _AUTH]),
    ("presigned-and-authorization", "/?" + _PRESIGNED, [HOST, _AUTH]),
    ("presigned-and-other-authorization", "/?" + _PRESIGNED, [HOST, (b"Authorization", b"Bearer x")]),
    ("presigned-and-token-header", "/?" + _PRESIGNED, [HOST, (b"X-Amz-Security-Token", b"t")]),
    ("presigned-two-dates", "/?" + _PRESIGNED, [HOST, DATE, DATE]),
    ("signed-trailer", "/", [HOST, DATE, _AUTH, (_SHA, b"STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER")]),
    ("sigv4a-streaming", "/", [HOST, DATE, _AUTH, (_SHA, b"STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD")]),
    ("sigv4a-trailer", "/", [HOST, DATE, _AUTH, (_SHA, b"STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD-TRAILER")]),
    ("upper-hex-hash", "/", [HOST, DATE, _AUTH, (_SHA, sigv4.EMPTY_SHA256.upper().encode())]),
    ("short-hash", "/", [HOST, DATE, _AUTH, (_SHA, b"abc")]),
    ("unknown-word", "/", [HOST, DATE, _AUTH, (_SHA, b"UNSIGNED-PAYLOAD-TRAILER")]),
    ("presigned-signed-trailer", "/?" + _PRESIGNED, [HOST, (_SHA, b"STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER")]),  # noqa: E501
]  # fmt: skip


@pytest.mark.parametrize(("target", "fields"), [a[1:] for a in AMBIGUOUS], ids=[a[0] for a in AMBIGUOUS])
def test_an_ambiguous_claim_is_refused(target: str, fields: list[tuple[bytes, bytes]]) -> None:
    with pytest.raises(SigV4Error) as e:
        sigv4.parse(target, fields)
    assert e.value.reason == "sigv4_malformed"


@pytest.mark.parametrize(
    "payload",
    [sigv4.UNSIGNED, sigv4.STREAMING, sigv4.STREAMING_UNSIGNED_TRAILER, sigv4.EMPTY_SHA256],
)
def test_the_payload_variants_surrogate_resigns_are_read(payload: str) -> None:
    signed = sigv4.parse("/", [HOST, DATE, _AUTH, (_SHA, payload.encode())])
    assert signed is not None and signed.payload_hash == payload


def test_the_scrub_pairs_cover_the_hex_spellings_s3_repeats() -> None:
    """S3's SignatureDoesNotMatch repeats the canonical request as space-separated hex."""
    spec = sigv4.SigV4Spec("surr_SecretPlaceholder000000001", "surr_TokenPlaceholder0000000001", ANY)
    keys = {"access_key_id": REAL.access_key_id, "secret_access_key": REAL.secret_access_key}
    value = json.dumps({**keys, "session_token": REAL.session_token})
    pairs = dict(sigv4.sigv4_pairs(value, "surr_KeyIdPlaceholder00000001", spec))
    token = REAL.session_token
    assert token is not None
    for real in (REAL.access_key_id, REAL.secret_access_key, token):
        raw = real.encode()
        for form in (raw.hex(), raw.hex().upper(), " ".join(f"{b:02x}" for b in raw)):
            assert form.encode() in pairs
    assert pairs[" ".join(f"{b:02x}" for b in token.encode()).encode()] == b" ".join(
        b"%02x" % b for b in b"surr_TokenPlaceholder0000000001"
    )
