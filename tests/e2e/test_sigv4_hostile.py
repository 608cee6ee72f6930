"""aws_sigv4 against a hostile sandbox and an upstream that talks back (issue 15; review r-sign2).
A real proxy process, the loopback SigV4 upstream of tests/sigv4_upstream.py (it verifies with
the REAL key, and answers a mismatch as S3 does: the key id and the canonical request it
computed, also as hex ``CanonicalRequestBytes``), botocore's signer and httpx as the sandbox.

- an S3 mismatch answer hands back the real key id and session token in hex, and the real-key
  signature (``SignatureProvided``): scrubbed to the placeholders' hex and the sandbox's own
  signature (header form and presigned form): the sandbox obtains no real-key signature;
- a placeholder of another credential in a signed header: swapped by substitute after the
  re-signing, it broke the real signature and came back (in hex) in the mismatch answer: refused
  before anything is sent;
- an ambiguous claim (a repeated X-Amz-Date, Authorization beside a presigned query, an
  X-Amz-Security-Token header beside a presigned query) and a streaming variant surrogate does
  not re-sign (signed trailer, SigV4a): refused ``sigv4_malformed`` before anything is sent.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import boto3
import canary
import httpx
import pytest
from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from sigv4_upstream import SigV4Upstream
from world import Stage, credential, egress, rules

pytestmark = pytest.mark.e2e

AKID = "surr_AwsHostileKeyIdPlaceholder1"
SECRET_PH = "surr_AwsHostileSecretPlaceholder1"
TOKEN_PH = "surr_AwsHostileTokenPlaceholder01"
APIKEY_PH = "surr_AwsHostileApiKeyPlaceholder1"
HOST = "s3.test"
EVIL = "evil.test"


class World:
    def __init__(self, stage: Stage, up: SigV4Upstream, proxy: Any, token: str, real: dict[str, str]) -> None:
        self.stage, self.up, self.proxy, self.token, self.real = stage, up, proxy, token, real
        self.evil = up

    @property
    def proxy_url(self) -> str:
        return str(self.proxy.url("c1", self.token))

    def url(self, path: str) -> str:
        return f"https://{HOST}:{self.up.port}{path}"

    def send(self, method: str, url: str, headers: dict[str, str] | list[tuple[str, str]]) -> httpx.Response:
        ctx = ssl.create_default_context(cafile=str(self.proxy.ca_pem))
        with httpx.Client(proxy=self.proxy_url, verify=ctx, timeout=30, trust_env=False) as client:
            r = client.request(method, url, headers=headers)
        self.stage.received.append(json.dumps(list(r.headers.multi_items())).encode() + r.content)
        return r

    def signed(
        self, method: str, path: str, headers: dict[str, str] | None = None, payload: str | None = None
    ) -> AWSRequest:
        """A request signed by botocore with the PLACEHOLDER keys (header form); ``payload``:
        the X-Amz-Content-Sha256 it declares and signs (botocore's own choice otherwise)."""
        req = AWSRequest(method=method, url=self.url(path), headers=headers or {})

        class Signer(S3SigV4Auth):
            def payload(self, request: AWSRequest) -> str:
                return payload or str(super().payload(request))

        Signer(Credentials(AKID, SECRET_PH, TOKEN_PH), "s3", "us-east-1").add_auth(req)
        return req

    def presigned(self, key: str) -> str:
        s3 = boto3.session.Session().client(
            "s3", endpoint_url=f"https://{HOST}:{self.up.port}", region_name="us-east-1",
            aws_access_key_id=AKID, aws_secret_access_key=SECRET_PH, aws_session_token=TOKEN_PH,
            config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
        )  # fmt: skip
        return str(s3.generate_presigned_url("get_object", Params={"Bucket": "b", "Key": key}, ExpiresIn=300))

    def reached(self) -> int:
        return len(self.up.accepted) + len(self.up.refused)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("sigv4hostile")
    with Stage(tmp) as st:
        token = st.token()
        real = {
            "access_key_id": "AKIA" + canary.make("akid")[6:22].upper(),
            "secret_access_key": canary.make("awssecret"),
            # as AWS's are, base64: its + / = are percent-encoded in a presigned query, and S3's
            # hex echo of that query hid the token from a scrubber seeking only the raw value's hex
            "session_token": "IQoJb3JpZ2luX2Vj+" + canary.make("awstoken") + "/x+yZ==",
        }
        st.watch(*real.values())
        canary.source(tmp / "secret-aws", json.dumps(real))
        st.secret("apikey")
        keys = (real["access_key_id"], real["secret_access_key"], real["session_token"])
        up = st.serve(SigV4Upstream(st.ca, [HOST], *keys))
        aws = credential(
            "aws", AKID, [HOST], kind="aws_sigv4",
            aws_sigv4={"secret_placeholder": SECRET_PH, "session_token_placeholder": TOKEN_PH,
                       "regions": ["us-east-1"], "services": ["s3", "sts"]},
        )  # fmt: skip
        apikey = credential("apikey", APIKEY_PH, [HOST])
        evil = st.serve(SigV4Upstream(st.ca, [EVIL], *keys))  # allowed egress, no credential bound
        text = rules(egress=[egress(HOST, up.port), egress(EVIL, evil.port)], credentials=[aws, apikey])
        w = World(st, up, st.proxy(text, resolve=[HOST, EVIL]), token, real)
        w.evil = evil
        yield w


def _hex_forms(value: str) -> list[bytes]:
    return [
        sep.join(f"{b:02X}" if upper else f"{b:02x}" for b in spelled.encode()).encode()
        for spelled in (value, quote(value, safe="-_.~"))
        for sep in ("", " ")
        for upper in (False, True)
    ]


def _assert_no_real_value(world: World, data: bytes) -> None:
    for name, value in world.real.items():
        for form in [value.encode(), quote(value, safe="-_.~").encode(), *_hex_forms(value)]:
            assert form not in data, name


def test_a_mismatch_answer_repeats_no_real_key_in_hex_header_form(world: World) -> None:
    world.up.mismatch = True
    try:
        req = world.signed("GET", "/b/echo.txt")
        r = world.send("GET", req.url, dict(req.headers.items()))
    finally:
        world.up.mismatch = False
    assert r.status_code == 403 and b"CanonicalRequestBytes" in r.content
    _assert_no_real_value(world, r.content)
    assert " ".join(f"{b:02x}" for b in TOKEN_PH.encode()).encode() in r.content  # the echo, scrubbed
    # the real-key signature (SignatureProvided) comes back as the sandbox's own: no signature oracle
    real_signature = world.up.signatures[-1]
    assert real_signature and real_signature.encode() not in r.content
    own = req.headers["Authorization"].rsplit("Signature=", 1)[1]
    assert f"<SignatureProvided>{own}</SignatureProvided>".encode() in r.content


def test_a_mismatch_answer_repeats_no_real_key_in_hex_presigned_form(world: World) -> None:
    world.up.mismatch = True
    try:
        url = world.presigned("echo.txt")
        r = world.send("GET", url, {})
    finally:
        world.up.mismatch = False
    assert r.status_code == 403 and b"CanonicalRequestBytes" in r.content
    _assert_no_real_value(world, r.content)
    assert " ".join(f"{b:02x}" for b in AKID.encode()).encode() in r.content
    real_signature = world.up.signatures[-1]
    assert real_signature and real_signature.encode() not in r.content
    own = parse_qs(urlsplit(url).query)["X-Amz-Signature"][0]
    assert f"<SignatureProvided>{own}</SignatureProvided>".encode() in r.content


def test_another_credentials_placeholder_in_a_signed_header_is_refused(world: World) -> None:
    """Substitute swapped it after the re-signing: the real signature no longer matched, and the
    mismatch answer repeated the other credential's real value in hex (no scrub pair for it)."""
    before = world.reached()
    req = world.signed("GET", "/b/apikey.txt", {"x-api-key": APIKEY_PH})
    assert "x-api-key" in req.headers["Authorization"]  # botocore signs it
    r = world.send("GET", req.url, dict(req.headers.items()))
    secret = (world.stage.tmp / "secret-apikey").read_text().strip()
    assert r.status_code == 403 and r.json()["error"] == "sigv4_malformed", r.text
    assert world.reached() == before
    secret = (world.stage.tmp / "secret-apikey").read_text().strip()
    for form in [secret.encode(), *_hex_forms(secret)]:
        assert form not in r.content


def test_a_placeholder_in_an_unsigned_header_is_still_swapped(world: World) -> None:
    """Only signed parts are refused: an unsigned header may carry a placeholder as before."""
    world.up.objects["/b/plain.txt"] = b"plain"
    req = world.signed("GET", "/b/plain.txt")
    r = world.send("GET", req.url, [*req.headers.items(), ("x-api-key", APIKEY_PH)])
    assert r.status_code == 200 and r.content == b"plain", r.text


def _ambiguous(world: World, case: str) -> tuple[str, list[tuple[str, str]]]:
    req = world.signed("GET", "/b/amb.txt")
    fields = list(req.headers.items())
    if case == "two-amz-date":
        return req.url, [*fields, ("X-Amz-Date", "20200101T000000Z")]
    if case == "two-authorization":
        return req.url, [*fields, ("authorization", req.headers["Authorization"])]
    if case == "signed-trailer":
        req = world.signed("PUT", "/b/amb.txt", payload="STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER")
        return req.url, list(req.headers.items())
    if case == "sigv4a-streaming":
        req = world.signed("PUT", "/b/amb.txt", payload="STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD")
        return req.url, list(req.headers.items())
    url = world.presigned("amb.txt")
    if case == "presigned-and-authorization":
        return url, [("Authorization", req.headers["Authorization"])]
    assert case == "presigned-and-token-header"
    return url, [("X-Amz-Security-Token", TOKEN_PH)]


CASES = ["two-amz-date", "two-authorization", "signed-trailer", "sigv4a-streaming",
         "presigned-and-authorization", "presigned-and-token-header"]  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_an_ambiguous_or_unsupported_claim_is_refused_before_anything_is_sent(
    world: World, case: str
) -> None:
    before = world.reached()
    url, fields = _ambiguous(world, case)
    r = world.send("PUT" if "trailer" in case or "streaming" in case else "GET", url, fields)
    assert r.status_code == 403 and r.json()["error"] == "sigv4_malformed", r.text
    assert world.reached() == before


# --- tried and held (review r-sign2): a real-key signature toward a host the credential is not bound to


def test_a_request_signed_for_the_bound_host_sent_into_a_tunnel_to_another_is_refused(world: World) -> None:
    """CONNECT evil.test, Host: s3.test (the signed host): the authorities disagree."""
    req = world.signed("GET", "/b/x.txt")
    before = world.reached() + len(world.evil.accepted) + len(world.evil.refused)
    url = f"https://{EVIL}:{world.evil.port}/b/x.txt"
    signed_host = f"{HOST}:{world.up.port}"
    rest = [(k, v) for k, v in req.headers.items() if k.lower() != "host"]
    r = world.send("GET", url, [("Host", signed_host), *rest])
    assert r.status_code == 421 and r.json()["error"] == "authority_mismatch", r.text
    assert world.reached() + len(world.evil.accepted) + len(world.evil.refused) == before


def test_a_presigned_url_toward_an_unbound_host_is_a_violation(world: World) -> None:
    url = world.presigned("x.txt").replace(f"{HOST}:{world.up.port}", f"{EVIL}:{world.evil.port}")
    before = len(world.evil.accepted) + len(world.evil.refused)
    r = world.send("GET", url, {})
    assert r.status_code == 403 and r.json()["error"] == "placeholder_violation", r.text
    assert len(world.evil.accepted) + len(world.evil.refused) == before


class _H2First(ssl.SSLContext):
    """ALPN ``h2`` first, as curl offers it (tests/e2e/test_surfaces.py)."""

    def set_alpn_protocols(self, alpn_protocols: Any) -> None:
        super().set_alpn_protocols(["h2", "http/1.1"])


def test_an_http2_body_after_a_head_signed_over_no_body_never_reaches_the_upstream(world: World) -> None:
    """No X-Amz-Content-Sha256, no Content-Length, over HTTP/2: signed (and re-signed) over the
    empty body; the DATA that follows is not passed on and the request is closed unfinished."""
    req = AWSRequest(method="POST", url=world.url("/sts-h2"), data=b"")
    SigV4Auth(Credentials(AKID, SECRET_PH, TOKEN_PH), "sts", "us-east-1").add_auth(req)
    headers = [(k, v) for k, v in req.headers.items() if k.lower() != "content-length"]
    before = world.reached()
    ctx = _H2First(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cafile=str(world.proxy.ca_pem))
    with httpx.Client(proxy=world.proxy_url, verify=ctx, timeout=30, http2=True, trust_env=False) as c:
        try:
            r = c.post(world.url("/sts-h2"), headers=headers, content=iter([b"Action=GetCallerIdentity"]))
        except httpx.HTTPError:
            pass
        else:
            world.stage.received.append(r.content)
            assert r.status_code >= 400 and r.http_version == "HTTP/2"
    assert world.reached() == before
