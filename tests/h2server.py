"""An HTTPS upstream that speaks HTTP/2 (and HTTP/1.1), for tests that need the proxy to talk
HTTP/2 with the client: mitmproxy offers the client the protocol the upstream chose.

hypercorn serves an ASGI app on a loopback port, with a certificate from the TestCA. The app is
``/echo`` of tests/servers.py (same lines, codings, SSE and bombs); requests are recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import socket
import threading
from typing import Any
from urllib.parse import parse_qsl

from hypercorn.asyncio import serve
from hypercorn.config import Config
from servers import Recorded, TestCA, bomb, compress, echo_lines


class H2Echo:
    """``/echo`` over HTTP/2 on ``127.0.0.1:port``; start() / stop()."""

    __test__ = False

    def __init__(self, ca: TestCA, hostnames: list[str], tmpdir: pathlib.Path) -> None:
        cert = ca.ca.issue_cert(*hostnames)
        self._cert, self._key = tmpdir / "h2-cert.pem", tmpdir / "h2-key.pem"
        cert.cert_chain_pems[0].write_to_path(str(self._cert))
        cert.private_key_pem.write_to_path(str(self._key))
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        self.requests: list[Recorded] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

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

    def start(self) -> H2Echo:
        config = Config()
        config.certfile, config.keyfile = str(self._cert), str(self._key)
        config.bind = [f"fd://{self._sock.fileno()}"]
        config.alpn_protocols = ["h2", "http/1.1"]
        config.accesslog = config.errorlog = None
        started = threading.Event()

        def run() -> None:
            async def main() -> None:
                self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
                started.set()
                await serve(self._app, config, shutdown_trigger=self._stop.wait)  # type: ignore[arg-type]

            asyncio.run(main())

        self._thread = threading.Thread(target=run, name=f"h2echo-{self.port}", daemon=True)
        self._thread.start()
        started.wait(5)
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)
        with contextlib.suppress(OSError):  # hypercorn closes the socket it served on
            self._sock.close()
