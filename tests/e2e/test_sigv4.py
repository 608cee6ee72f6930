"""aws_sigv4 end to end: boto3 and the AWS CLI in the sandbox role (placeholders only) through a
real proxy to a loopback upstream that verifies SigV4 with the REAL key (tests/sigv4_upstream.py,
botocore's signer). Each call is accepted through the proxy and refused by the upstream without
it; a wrong key, and a region or service outside the credential's, are refused by surrogate."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
import canary
import httpx
import pytest
from botocore.config import Config
from sigv4_upstream import SigV4Upstream
from world import Stage, claim, credential, egress, rules

pytestmark = pytest.mark.e2e

AKID = "surr_AwsKeyIdPlaceholder0001"
SECRET_PH = "surr_AwsSecretPlaceholder0001"
TOKEN_PH = "surr_AwsTokenPlaceholder00001"
NAMES = ["s3.test", "sts.test"]
METERED_AKID = "surr_AwsMeteredKeyIdPlacehold1"  # claim c2's aws_sigv4 credential, max_requests 3
METERED_SECRET_PH = "surr_AwsMeteredSecretPlacehol1"
BUDGET = 3


class World:
    def __init__(self, stage: Stage, up: SigV4Upstream, proxy: Any, token: str, real: dict[str, str]) -> None:
        self.stage, self.up, self.proxy, self.token, self.real = stage, up, proxy, token, real

    @property
    def proxy_url(self) -> str:
        return str(self.proxy.url("c1", self.token))

    def client(self, service: str, via_proxy: bool = True, secret: str = SECRET_PH, region: str = "us-east-1",
               akid: str = AKID, token: str | None = TOKEN_PH, claim: str = "c1",
               **cfg: Any) -> Any:  # fmt: skip
        host = "sts.test" if service == "sts" else "s3.test"
        return boto3.session.Session().client(
            service,
            endpoint_url=f"https://{host if via_proxy else '127.0.0.1'}:{self.up.port}",
            region_name=region,
            aws_access_key_id=akid,
            aws_secret_access_key=secret,
            aws_session_token=token,
            verify=str(self.proxy.ca_pem if via_proxy else self.stage.ca.ca_pem),
            config=Config(
                proxies={"https": str(self.proxy.url(claim, self.token))} if via_proxy else {},
                s3={"addressing_style": "path"},
                retries={"max_attempts": 1},
                **cfg,
            ),
        )


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("sigv4")
    with Stage(tmp) as st:
        token = st.token()
        real = {
            "access_key_id": "AKIA" + canary.make("akid")[6:22].upper(),
            "secret_access_key": canary.make("awssecret"),
            "session_token": canary.make("awstoken"),
        }
        st.watch(*real.values())
        canary.source(tmp / "secret-aws", json.dumps(real))
        up = SigV4Upstream(
            st.ca, NAMES, real["access_key_id"], real["secret_access_key"], real["session_token"]
        )
        st.serve(up)
        aws = credential(
            "aws", AKID, NAMES, kind="aws_sigv4",
            aws_sigv4={"secret_placeholder": SECRET_PH, "session_token_placeholder": TOKEN_PH,
                       "regions": ["us-east-1"], "services": ["s3", "sts"]},
        )  # fmt: skip
        metered = credential(
            "metered", METERED_AKID, NAMES, value="file:secret-aws", kind="aws_sigv4", max_requests=BUDGET,
            aws_sigv4={"secret_placeholder": METERED_SECRET_PH, "regions": ["us-east-1"], "services": ["s3"]},
        )  # fmt: skip
        st.token(token, file="token2")
        text = rules(
            egress=[egress(n, up.port) for n in NAMES],
            claims=[claim("c1", [aws]), claim("c2", [metered], token="file:token2")],
        )
        proxy = st.proxy(text, resolve=NAMES)
        w = World(st, up, proxy, token, real)
        yield w


def _keep(w: World, data: bytes) -> bytes:
    w.stage.received.append(data)
    return data


def test_put_and_get_object_small(world: World) -> None:
    s3 = world.client("s3")
    s3.put_object(Bucket="b", Key="small.txt", Body=b"hello sigv4")
    got = s3.get_object(Bucket="b", Key="small.txt")
    assert _keep(world, got["Body"].read()) == b"hello sigv4"
    owner = got["ResponseMetadata"]["HTTPHeaders"]["x-amz-request-owner"]
    assert owner == AKID  # the real key id the upstream named is scrubbed to its placeholder


def test_put_object_multi_megabyte_streaming(world: World, tmp_path: Path) -> None:
    """boto3's default upload of a 6 MB body: aws-chunked, STREAMING-UNSIGNED-PAYLOAD-TRAILER."""
    data = os.urandom(6 * 1024 * 1024)
    s3 = world.client("s3")
    s3.put_object(Bucket="b", Key="big.bin", Body=data)
    assert world.up.objects["/b/big.bin"] == data


def test_put_object_signed_payload_hash(world: World) -> None:
    """payload_signing_enabled: a hashed X-Amz-Content-Sha256."""
    client = boto3.session.Session().client(
        "s3", endpoint_url=f"https://s3.test:{world.up.port}", region_name="us-east-1",
        aws_access_key_id=AKID, aws_secret_access_key=SECRET_PH, aws_session_token=TOKEN_PH,
        verify=str(world.proxy.ca_pem),
        config=Config(proxies={"https": world.proxy_url}, retries={"max_attempts": 1},
                      s3={"addressing_style": "path", "payload_signing_enabled": True},
                      request_checksum_calculation="when_required"),
    )  # fmt: skip
    client.put_object(Bucket="b", Key="hashed.txt", Body=b"hashed body")
    assert world.up.objects["/b/hashed.txt"] == b"hashed body"


def test_sts_get_caller_identity(world: World) -> None:
    """A form POST to the sts host: no declared payload hash, the body hashed by surrogate."""
    ident = world.client("sts").get_caller_identity()
    assert _keep(world, json.dumps(ident).encode())
    assert AKID in ident["Arn"] and world.real["access_key_id"] not in json.dumps(ident)


def test_presigned_url_by_curl(world: World) -> None:
    world.client("s3").put_object(Bucket="b", Key="pre.txt", Body=b"presigned body")
    s3 = world.client("s3", signature_version="s3v4")
    url = s3.generate_presigned_url("get_object", Params={"Bucket": "b", "Key": "pre.txt"}, ExpiresIn=300)
    out = subprocess.run(
        ["curl", "-sS", "--fail", "--proxy", world.proxy_url, "--cacert", str(world.proxy.ca_pem), url],
        capture_output=True, timeout=60, check=True,
    )  # fmt: skip
    assert _keep(world, out.stdout) == b"presigned body"


def test_aws_cli_s3_cp_large_file(world: World, tmp_path: Path) -> None:
    src = tmp_path / "large.bin"
    src.write_bytes(os.urandom(9 * 1024 * 1024))  # past the CLI's 8 MB threshold: multipart
    env = {
        "PATH": os.environ["PATH"], "HOME": str(tmp_path),
        "AWS_ACCESS_KEY_ID": AKID, "AWS_SECRET_ACCESS_KEY": SECRET_PH, "AWS_SESSION_TOKEN": TOKEN_PH,
        "AWS_DEFAULT_REGION": "us-east-1", "AWS_CA_BUNDLE": str(world.proxy.ca_pem),
        "HTTPS_PROXY": world.proxy_url, "AWS_S3_ADDRESSING_STYLE": "path",
    }  # fmt: skip
    cmd = [
        "aws",
        "--endpoint-url",
        f"https://s3.test:{world.up.port}",
        "s3",
        "cp",
        str(src),
        "s3://b/large.bin",
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, timeout=300)
    _keep(world, out.stdout + out.stderr)
    assert out.returncode == 0, out.stderr.decode()[-2000:]


def test_without_the_proxy_the_upstream_refuses(world: World) -> None:
    world.client("s3").put_object(Bucket="b", Key="small.txt", Body=b"hello sigv4")
    s3 = world.client("s3", via_proxy=False)
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.get_object(Bucket="b", Key="small.txt")
    assert e.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    assert world.up.refused[-1] == "GET /b/small.txt"
    with pytest.raises(botocore.exceptions.ClientError):
        world.client("sts", via_proxy=False).get_caller_identity()


def _refusal(world: World, **kw: Any) -> str:
    s3 = world.client("s3", **kw)
    before = len(world.up.accepted) + len(world.up.refused)
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.get_object(Bucket="b", Key="small.txt")
    assert len(world.up.accepted) + len(world.up.refused) == before  # never reached the upstream
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    return str(world.proxy.audit_path.read_text().strip().splitlines()[-1])


def test_wrong_secret_refused_by_surrogate(world: World) -> None:
    last = json.loads(_refusal(world, secret="surr_NotTheSecretPlaceholder1"))
    assert last["reason"] == "sigv4_bad_signature"


def test_region_outside_allowed_refused(world: World) -> None:
    assert json.loads(_refusal(world, region="eu-west-1"))["reason"] == "sigv4_scope_refused"


def test_audit_names_kind_and_signature(world: World) -> None:
    world.client("s3").put_object(Bucket="b", Key="small.txt", Body=b"hello sigv4")
    world.client("s3").get_object(Bucket="b", Key="small.txt")["Body"].read()
    last = json.loads(world.proxy.audit_path.read_text().strip().splitlines()[-1])
    assert last["path"] == "/b/small.txt" and last["status"] == 200
    assert last["credentials"][0]["kind"] == "aws_sigv4" and last["credentials"][0]["signature"] == "sigv4"
    assert last["credentials"][0]["applied"] == "sigv4_signed"


def _chunked_put(
    world: World, key: str, data: bytes, chunk: int, tamper: int | None = None
) -> httpx.Response:
    """A client that signs S3's aws-chunked upload with the PLACEHOLDER keys (botocore sends only
    the unsigned-trailer form): the seed by botocore's S3SigV4Auth, each chunk on the chain by
    the AWS document's string to sign. ``tamper``: the chunk whose data changes after signing."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    from proxy.core import sigv4
    from proxy.core.sigv4chunks import chunk_string

    pieces = [data[i : i + chunk] for i in range(0, len(data), chunk)] + [b""]
    framed = sum(len(b"%x;chunk-signature=" % len(p)) + 64 + 4 + len(p) for p in pieces)
    url = f"https://s3.test:{world.up.port}/b/{key}"
    headers = {
        "Content-Encoding": "aws-chunked", "Content-Length": str(framed),
        "X-Amz-Content-SHA256": sigv4.STREAMING, "X-Amz-Decoded-Content-Length": str(len(data)),
    }  # fmt: skip
    req = AWSRequest(method="PUT", url=url, headers=headers)

    class Streaming(S3SigV4Auth):
        def payload(self, request: AWSRequest) -> str:
            return sigv4.STREAMING  # botocore would write UNSIGNED-PAYLOAD over https

    Streaming(Credentials(AKID, SECRET_PH, TOKEN_PH), "s3", "us-east-1").add_auth(req)
    assert req.headers["X-Amz-Content-SHA256"] == sigv4.STREAMING
    amz_date = req.context["timestamp"]
    scope = f"{amz_date[:8]}/us-east-1/s3/aws4_request"
    key_ = sigv4.signing_key(SECRET_PH, amz_date[:8], "us-east-1", "s3")
    prev = req.headers["Authorization"].rsplit("Signature=", 1)[1]

    def body() -> Iterator[bytes]:
        nonlocal prev
        for i, p in enumerate(pieces):
            prev = sigv4.sign(key_, chunk_string(amz_date, scope, prev, p))
            sent = p if tamper != i else b"X" + p[1:]
            yield b"%x;chunk-signature=%s\r\n%s\r\n" % (len(p), prev.encode(), sent)

    ctx = ssl.create_default_context(cafile=str(world.proxy.ca_pem))
    with httpx.Client(proxy=world.proxy_url, verify=ctx, timeout=60) as client:
        return client.put(url, headers=dict(req.headers.items()), content=body())


def test_signed_aws_chunked_upload_resigned_chunk_by_chunk(world: World) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)
    r = _chunked_put(world, "chunked.bin", data, 64 * 1024)
    assert r.status_code == 200, _keep(world, r.content)
    assert world.up.objects["/b/chunked.bin"] == data


def test_signed_aws_chunked_tampered_chunk_never_completes(world: World) -> None:
    """A chunk changed after signing: surrogate closes the connection before it leaves."""
    before = len(world.up.accepted)
    with pytest.raises(httpx.HTTPError):
        r = _chunked_put(world, "tampered.bin", os.urandom(300 * 1024), 64 * 1024, tamper=2)
        _keep(world, r.content)
        assert r.status_code >= 400
        raise httpx.HTTPError("refused")
    assert "/b/tampered.bin" not in world.up.objects and len(world.up.accepted) == before


def test_sigv2_presigned_url_with_the_placeholder_refused(world: World) -> None:
    """boto3's default presigned URL (SigV2) names the placeholder key id unsigned by SigV4."""
    url = world.client("s3").generate_presigned_url("get_object", Params={"Bucket": "b", "Key": "x"})
    out = subprocess.run(
        ["curl", "-sS", "--proxy", world.proxy_url, "--cacert", str(world.proxy.ca_pem), url],
        capture_output=True, timeout=60, check=True,
    )  # fmt: skip
    assert b"sigv4_unsigned" in _keep(world, out.stdout)


def test_max_requests_counts_resigned_requests_and_refuses_past_it(world: World) -> None:
    """An aws_sigv4 credential's max_requests is spent like any other credential's: BUDGET
    re-signed requests reach the upstream, the next is refused credential_budget_spent before it
    is sent (the upstream never sees it), and a request refused by surrogate is not counted."""
    s3 = world.client("s3", akid=METERED_AKID, secret=METERED_SECRET_PH, token=None, claim="c2")
    with pytest.raises(botocore.exceptions.ClientError):  # wrong placeholder secret: refused, not counted
        world.client("s3", akid=METERED_AKID, secret=SECRET_PH, token=None, claim="c2").get_object(
            Bucket="b", Key="metered.txt"
        )
    s3.put_object(Bucket="b", Key="metered.txt", Body=b"counted")
    for _ in range(BUDGET - 1):
        assert s3.get_object(Bucket="b", Key="metered.txt")["Body"].read() == b"counted"
    before = len(world.up.accepted) + len(world.up.refused)
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.get_object(Bucket="b", Key="metered.txt")
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert len(world.up.accepted) + len(world.up.refused) == before  # never reached the upstream
    last = json.loads(world.proxy.audit_path.read_text().strip().splitlines()[-1])
    assert (last["claim"], last["reason"], last["credentials"]) == ("c2", "credential_budget_spent", [])
