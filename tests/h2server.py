"""An HTTPS upstream that speaks HTTP/2 (and HTTP/1.1), for tests that need the proxy to talk
HTTP/2 with the client: mitmproxy offers the client the protocol the upstream chose.

hypercorn serves an ASGI app on a loopback port, with a certificate from the TestCA. The app is
``/echo`` of tests/servers.py (same lines, codings, SSE and bombs); requests are recorded.
"""

from __future__ import annotations

import asyncio
import pathlib
from typing import Any
from urllib.parse import parse_qsl

from hypercorn_server import HypercornServer
from servers import Recorded, TestCA, bomb, compress, echo_lines


class H2Echo(HypercornServer):
    """``/echo`` over HTTP/2 on ``127.0.0.1:port``; start() / stop()."""

    def __init__(self, ca: TestCA, hostnames: list[str], tmpdir: pathlib.Path) -> None:
        cert = ca.ca.issue_cert(*hostnames)
        cert_pem, key_pem = tmpdir / "h2-cert.pem", tmpdir / "h2-key.pem"
        cert.cert_chain_pems[0].write_to_path(str(cert_pem))
        cert.private_key_pem.write_to_path(str(key_pem))
        super().__init__(cert_pem, key_pem, ["h2", "http/1.1"], "h2echo")
        self.requests: list[Recorded] = []

    async def _app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        qs = scope["query_string"].decode()
        target = scope["raw_path"].decode() + (f"?{qs}" if qs else "")
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        self.requests.append(Recorded(scope["method"], target, headers, len(body)))
        query = dict(parse_qsl(qs))
        enc = query.get("enc", "identity")
        lines = [] if query.get("bomb") else echo_lines(headers, target, body)
        auth = dict(headers).get("authorization", "-")
        out = [(b"content-type", b"text/event-stream" if query.get("sse") else b"text/plain")]
        out += [(b"x-echo", auth.encode("latin-1"))]
        out += [(b"content-encoding", enc.encode())] if enc != "identity" else []
        await send({"type": "http.response.start", "status": 200, "headers": out})
        if not query.get("sse"):
            data = bomb(enc) if query.get("bomb") else compress(enc, b"\n".join(lines) + b"\n")
            await send({"type": "http.response.body", "body": data})
            return
        for line in lines:  # identity only: one event in two reads, 5 ms apart
            event = b"data: " + line + b"\n\n"
            for part in (event[: len(event) // 2], event[len(event) // 2 :]):
                await send({"type": "http.response.body", "body": part, "more_body": True})
                await asyncio.sleep(0.005)
        await send({"type": "http.response.body", "body": b""})
