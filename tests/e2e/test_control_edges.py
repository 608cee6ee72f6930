"""The control API's edges against a real ``surrogate control`` process on loopback TCP (issue 13
class 10, issue 20 item 8): a Host or Origin naming another authority (DNS rebinding) is 403, a
chunked body over the limit is 413, a ``/`` in a claim id or credential name (plain or ``%2F``)
is a 422 naming the field. Requests are written by hand on a socket so that the Host, the framing
and the percent-encoding are exactly the ones named."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import canary
import httpx
import pytest
from harness import free_port, status_line
from test_control_process import start_control, stop, wait_for

from proxy.control.api import MAX_BODY

pytestmark = pytest.mark.e2e


class Api:
    def __init__(self, port: int, token: str) -> None:
        self.port, self.token = port, token

    def raw(self, head: str, body: bytes = b"", host: str | None = None) -> tuple[bytes, dict[str, object]]:
        """Send one request (``head``: request line and extra header lines), return the status
        and the JSON body."""
        host = host if host is not None else f"127.0.0.1:{self.port}"
        data = (
            f"{head}\r\nHost: {host}\r\nAuthorization: Bearer {self.token}\r\nConnection: close\r\n\r\n"
        ).encode() + body
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
            s.sendall(data)
            out = b""
            while chunk := s.recv(65536):
                out += chunk
        doc = json.loads(out.split(b"\r\n\r\n", 1)[1] or b"{}")
        return status_line(out), doc


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    tmp: Path = tmp_path_factory.mktemp("edges")
    port, token = free_port(), "operator-token-" + os.urandom(8).hex()
    (tmp / "token").write_text(token + "\n")
    proc = start_control(
        tmp, "--control-socket", "none", "--control-tcp", f"127.0.0.1:{port}", "--control-token-file",
        str(tmp / "token"),
    )  # fmt: skip
    try:
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200)
        a = Api(port, token)
        status, _ = a.raw(
            "POST /v1/claims HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 26",
            b'{"id": "c1", "pool": "p"} ',
        )
        assert status == b"201"
        yield a
    finally:
        stop(proc)


@pytest.mark.parametrize(
    "extra",
    [
        {"host": "evil.test:{port}"},
        {"host": "127.0.0.1.nip.test:{port}"},
        {"host": "127.0.0.1:{port}", "origin": "http://evil.test:{port}"},
        {"host": "127.0.0.1:{port}", "origin": "null"},
    ],
    ids=["rebound-host", "lookalike-host", "foreign-origin", "null-origin"],
)
def test_a_page_under_another_name_cannot_reach_the_tcp_listener(api: Api, extra: dict[str, str]) -> None:
    host = extra["host"].format(port=api.port)
    origin = f"\r\nOrigin: {extra['origin'].format(port=api.port)}" if "origin" in extra else ""
    for head in ("GET /v1/claims HTTP/1.1", "GET /healthz HTTP/1.1", "POST /v1/claims/c1/token HTTP/1.1"):
        status, doc = api.raw(head + origin + "\r\nContent-Length: 0", host=host)
        assert (status, doc["error"]) == (b"403", "foreign_host"), head
    status, doc = api.raw("GET /v1/claims/c1 HTTP/1.1")  # the token was not rotated, the claim is there
    assert status == b"200" and doc["version"] == 1


def test_its_own_address_and_localhost_are_served(api: Api) -> None:
    for host in (f"127.0.0.1:{api.port}", f"localhost:{api.port}"):
        status, _ = api.raw(f"GET /v1/claims HTTP/1.1\r\nOrigin: http://{host}", host=host)
        assert status == b"200"


def test_a_chunked_body_over_the_limit_is_413(api: Api) -> None:
    piece = b"x" * 8192
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for _ in range(MAX_BODY // len(piece) + 2))
    status, doc = api.raw(
        "POST /v1/claims HTTP/1.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked",
        chunks + b"0\r\n\r\n",
    )
    assert (status, doc["error"]) == (b"413", "body_too_large")


@pytest.mark.parametrize(
    ("head", "field"),
    [
        ("GET /v1/claims/a%2Fb HTTP/1.1", "claim"),
        ("GET /v1/claims/a/b HTTP/1.1", "claim"),
        ("POST /v1/claims/c1%2Ftoken HTTP/1.1", "claim"),
        ("PUT /v1/claims/c1/credentials/a%2Fb HTTP/1.1", "name"),
        ("PUT /v1/claims/c1/credentials/a/b HTTP/1.1", "name"),
        ("DELETE /v1/claims/c1/credentials/a%2fb HTTP/1.1", "name"),
    ],
)
def test_a_slash_in_an_id_is_a_422_naming_the_field(api: Api, head: str, field: str) -> None:
    body = json.dumps({"hosts": ["api.test"], "value": canary.make("edge")}).encode()
    status, doc = api.raw(f"{head}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}", body)
    assert (status, doc["field"]) == (b"422", field), doc
    status, doc = api.raw("GET /v1/claims/c1 HTTP/1.1")  # POST c1%2Ftoken did not rotate c1's token
    assert doc["version"] == 1
