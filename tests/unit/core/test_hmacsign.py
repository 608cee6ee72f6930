"""proxy.core.hmacsign: the string-to-sign of each declared part, the signature encodings, and
the spec's problems."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from proxy.core import hmacsign
from proxy.core.secrets import Secret

KEY = Secret("k3y")
BODY = b'{"size":"0.01"}'
DIGEST = hashlib.sha256(BODY).hexdigest().encode()

PARTS = [
    ("default", hmacsign.DEFAULT_PARTS, "", b"1700000000POST/v1/orders?a=1&b=2" + BODY),
    ("no-query", ("method", "path", "query"), "", b"POST/v1/orders?a=1&b=2"),
    ("digest", ("timestamp", "body_sha256"), "\n", b"1700000000\n" + DIGEST),
    ("path-only", ("path",), "", b"/v1/orders"),
]  # fmt: skip


@pytest.mark.parametrize(("parts", "sep", "want"), [p[1:] for p in PARTS], ids=[p[0] for p in PARTS])
def test_the_string_to_sign_joins_the_declared_parts_in_order(
    parts: tuple[str, ...], sep: str, want: bytes
) -> None:
    spec = hmacsign.SignSpec(parts=parts, separator=sep)
    assert hmacsign.string_to_sign(spec, 1700000000, "post", "/v1/orders?a=1&b=2", BODY) == want


def test_an_empty_query_adds_nothing() -> None:
    spec = hmacsign.SignSpec(parts=("path", "query"))
    assert hmacsign.string_to_sign(spec, 0, "GET", "/x", b"") == b"/x"


@pytest.mark.parametrize(
    ("algorithm", "encoding"),
    [("hmac-sha256", "hex"), ("hmac-sha512", "hex"), ("hmac-sha256", "base64"), ("hmac-sha512", "base64")],
)
def test_the_signature_is_the_encoded_hmac_in_the_format(algorithm: str, encoding: str) -> None:
    spec = hmacsign.SignSpec(algorithm=algorithm, encoding=encoding, format="v1={signature}")
    digest = hashlib.sha256 if algorithm.endswith("256") else hashlib.sha512
    mac = hmac.new(b"k3y", b"msg", digest).digest()
    want = mac.hex() if encoding == "hex" else base64.b64encode(mac).decode()
    assert hmacsign.signature(spec, KEY, b"msg") == f"v1={want}"


BAD = [
    ("algorithm", hmacsign.SignSpec(algorithm="md5"), "algorithm"),
    ("encoding", hmacsign.SignSpec(encoding="base32"), "encoding"),
    ("part", hmacsign.SignSpec(parts=("headers",)), "parts"),
    ("no-parts", hmacsign.SignSpec(parts=()), "parts"),
    ("format", hmacsign.SignSpec(format="sig"), "format"),
    ("separator", hmacsign.SignSpec(separator="\r\n"), "separator"),
    ("max-body", hmacsign.SignSpec(max_body=-1), "max_body"),
    # past mitmproxy's stream_large_bodies (1 MiB) the body would stream and the head leave unsigned
    ("max-body-past-1mib", hmacsign.SignSpec(max_body=hmacsign.MAX_BODY + 1), "max_body"),
]


@pytest.mark.parametrize(("spec", "where"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_spec_names_its_field(spec: hmacsign.SignSpec, where: str) -> None:
    assert where in [f for f, _ in hmacsign.problems(spec)]


def test_the_default_spec_is_usable() -> None:
    assert hmacsign.problems(hmacsign.SignSpec()) == []
