"""S3-style path spellings toward the SigV4 re-signer (review r-h2auth): is what is signed what
is sent, and what policy allowed?

A real proxy process, the loopback SigV4 upstream of tests/sigv4_upstream.py (it verifies with the
REAL key, rebuilding the canonical request from the target and Host it received, as S3 does, and
stores a PUT under the raw target), botocore's S3 signer (which, like S3, does not normalise the
path) and a raw HTTP/1.1 client inside a CONNECT tunnel, so the target reaches the proxy exactly
as spelled. The pool allows ``/b/allowed`` on the S3 host only.

- a spelling every reading of which is inside the prefix (``//`` inside it) is signed and sent
  as spelled: the upstream accepts the real signature over the very target policy decided on;
- a spelling some server reads as another path (dot segments raw or encoded, ``%2F``, an encoded
  ``?``, ``%25``) is refused (400 ``ambiguous_path``), a spelling outside the prefix (a leading
  ``//``, ``*``) 403: in each case before any upstream connection, no real signature made;
- an absolute-form target inside the tunnel without a Host header (the fix in addons/policy.py):
  signed over, and sent with, the decided authority as Host; before, the proxy verified over a
  host without its port and refused, while the upstream would have got no Host at all.
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
from collections.abc import Iterator
from typing import Any

import canary
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from harness import status_line
from sigv4_upstream import SigV4Upstream
from world import Stage, credential, egress, rules

pytestmark = pytest.mark.e2e

AKID = "surr_AwsPathsKeyIdPlaceholder001"
SECRET_PH = "surr_AwsPathsSecretPlaceholder01"
TOKEN_PH = "surr_AwsPathsTokenPlaceholder001"
HOST = "s3.test"


class World:
    def __init__(self, stage: Stage, up: SigV4Upstream, proxy: Any, token: str, real: dict[str, str]) -> None:
        self.stage, self.up, self.proxy, self.token, self.real = stage, up, proxy, token, real

    def signed(self, method: str, target: str, host: str | None = None) -> list[tuple[str, str]]:
        """The headers botocore's S3 signer sets for ``target`` (raw) with the PLACEHOLDER keys."""
        host = host or f"{HOST}:{self.up.port}"
        req = AWSRequest(method=method, url=f"https://{host}{target}", data=b"")
        S3SigV4Auth(Credentials(AKID, SECRET_PH, TOKEN_PH), "s3", "us-east-1").add_auth(req)
        return [("Host", host), *req.headers.items()]  # botocore signs the URL's host

    def raw(self, head: str) -> bytes:
        """``head`` sent as is inside c1's tunnel to the S3 host (TLS under the proxy's CA)."""
        auth = base64.b64encode(f"c1:{self.token}".encode()).decode()
        port = self.up.port
        ctx = ssl.create_default_context(cafile=str(self.proxy.ca_pem))
        ctx.set_alpn_protocols(["http/1.1"])
        with socket.create_connection(("127.0.0.1", self.proxy.port), timeout=15) as s:
            s.sendall(
                f"CONNECT {HOST}:{port} HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
                f"Proxy-Authorization: Basic {auth}\r\n\r\n".encode()
            )
            answer = b""
            while b"\r\n\r\n" not in answer:
                answer += s.recv(4096)
            assert status_line(answer) == b"200", answer
            with ctx.wrap_socket(s, server_hostname=HOST) as tls:
                tls.sendall(head.encode())
                data = b""
                try:
                    while chunk := tls.recv(65536):
                        data += chunk
                except (ConnectionError, ssl.SSLError, TimeoutError):
                    pass
        self.stage.received.append(data)
        return data

    def reached(self) -> int:
        return len(self.up.accepted) + len(self.up.refused)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("sigv4paths")
    with Stage(tmp) as st:
        token = st.token()
        real = {
            "access_key_id": "AKIA" + canary.make("akid")[6:22].upper(),
            "secret_access_key": canary.make("awssecret"),
            "session_token": canary.make("awstoken"),
        }
        st.watch(*real.values())
        canary.source(tmp / "secret-aws", json.dumps(real))
        up = st.serve(
            SigV4Upstream(
                st.ca, [HOST], real["access_key_id"], real["secret_access_key"], real["session_token"]
            )
        )
        aws = credential(
            "aws", AKID, [HOST], kind="aws_sigv4",
            aws_sigv4={"secret_placeholder": SECRET_PH, "session_token_placeholder": TOKEN_PH,
                       "regions": ["us-east-1"], "services": ["s3"]},
        )  # fmt: skip
        text = rules(egress=[egress(HOST, up.port, paths=["/b/allowed"])], credentials=[aws])
        yield World(st, up, st.proxy(text, resolve=[HOST]), token, real)


def _head(method: str, target: str, headers: list[tuple[str, str]]) -> str:
    lines = "".join(f"{k}: {v}\r\n" for k, v in headers)
    return f"{method} {target} HTTP/1.1\r\n{lines}Content-Length: 0\r\nConnection: close\r\n\r\n"


SIGNED_AS_SENT = [
    "/b/allowed/x",
    "/b/allowed//x",
    "/b/allowed/a//b/",
    "/b/allowed/x?list-type=2&prefix=a%2Fb",
]


@pytest.mark.parametrize("target", SIGNED_AS_SENT)
def test_a_path_inside_the_prefix_is_signed_as_sent(world: World, target: str) -> None:
    before = len(world.up.accepted)
    data = world.raw(_head("PUT", target, world.signed("PUT", target)))
    assert status_line(data) == b"200", data[:400]
    assert world.up.accepted[before:] == [f"PUT {target}"]


REFUSED = [
    ("/b/allowed/../secret", b"400", "dot-dot"),
    ("/b/allowed/./x", b"400", "dot"),
    ("/b/allowed/%2e%2e/secret", b"400", "encoded-dot-dot"),
    ("/b/allowed/%2E/x", b"400", "encoded-dot"),
    ("/b/allowed%2F..%2Fsecret", b"400", "encoded-slash"),
    ("/b/allowed/x%3F/../../secret", b"400", "encoded-question-mark"),
    ("/b/allowed/%252e%252e/secret", b"400", "double-encoded"),
    ("//b/allowed/x", b"403", "leading-double-slash"),
    ("/b/allowedx", b"403", "prefix-not-at-a-segment"),
    ("/b/other", b"403", "another-path"),
    ("*", b"400", "asterisk"),  # not a path: hygiene refuses it
]


@pytest.mark.parametrize(("target", "status"), [r[:2] for r in REFUSED], ids=[r[2] for r in REFUSED])
def test_a_path_some_server_reads_otherwise_is_refused_before_anything_is_signed(
    world: World, target: str, status: bytes
) -> None:
    before = world.reached()
    headers = world.signed("GET", target if target.startswith("/") else "/")
    data = world.raw(_head("GET", target, headers))
    assert status_line(data) == status, data[:400]
    assert world.reached() == before
    for value in world.real.values():
        assert value.encode() not in data


def test_an_absolute_form_target_without_host_is_signed_over_the_decided_authority(world: World) -> None:
    port = world.up.port
    target = "/b/allowed/abs-nohost"
    headers = [(k, v) for k, v in world.signed("PUT", target) if k.lower() != "host"]
    before = len(world.up.accepted)
    data = world.raw(_head("PUT", f"https://{HOST}:{port}{target}", headers))
    assert status_line(data) == b"200", data[:400]
    assert world.up.accepted[before:] == [f"PUT {target}"]


def test_an_absolute_form_target_naming_another_host_is_refused(world: World) -> None:
    target = "/b/allowed/abs-other"
    headers = world.signed("PUT", target, host=f"evil.test:{world.up.port}")
    before = world.reached()
    data = world.raw(_head("PUT", f"https://evil.test:{world.up.port}{target}", headers))
    assert status_line(data) == b"421", data[:400]
    assert world.reached() == before
