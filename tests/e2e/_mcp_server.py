"""A streamable-HTTP MCP server over TLS for test_mcp.py, run as its own process.

    python _mcp_server.py --port P --tls PEM --secret-file F --auth-log F --release F

Every request must carry ``Authorization: Bearer <contents of --secret-file>`` (401 otherwise); the
Authorization value of every request is appended to --auth-log, one line each, so the test can
check what reached the server. The tool ``stepwise`` sends a progress notification, waits until
the file --release exists (the test creates it only once its client has received that first
notification, so the result cannot have been sent yet), then sends two more 300 ms apart and
returns. The server only ever answers with content of its own, never a request header.
"""

from __future__ import annotations

import argparse
import hmac
import os
import time
from pathlib import Path

import anyio
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import ASGIApp, Receive, Scope, Send

HOST = "mcp.test"
RELEASE_TIMEOUT = 15.0


class BearerOnly:
    """Pure ASGI middleware: 401 unless the Authorization header is exactly the expected bearer."""

    def __init__(self, app: ASGIApp, secret: str, log: Path) -> None:
        self.app = app
        self.expected = f"Bearer {secret}".encode()
        self.log = log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"authorization", b"")
        with self.log.open("ab") as f:
            f.write(given + b"\n")
        if hmac.compare_digest(given, self.expected):
            return await self.app(scope, receive, send)
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"www-authenticate", b'Bearer realm="mcp"'),
                ],
            }
        )
        await send({"type": "http.response.body", "body": b'{"error": "unauthorized"}'})


def build_app(secret: str, auth_log: Path, release: Path) -> ASGIApp:
    server = MCPServer("surrogate-e2e")

    @server.tool()
    async def stepwise(ctx: Context) -> str:
        """Report progress three times, holding after the first until the test releases it."""
        await ctx.report_progress(1, 3, "first")
        deadline = time.monotonic() + RELEASE_TIMEOUT
        while not release.exists():
            if time.monotonic() > deadline:
                return "not released: the first notification never reached the client"
            await anyio.sleep(0.02)
        await anyio.sleep(0.3)
        await ctx.report_progress(2, 3, "second")
        await anyio.sleep(0.3)
        await ctx.report_progress(3, 3, "third")
        return "stepwise done"

    security = TransportSecuritySettings(allowed_hosts=[f"{HOST}:*"], allowed_origins=[f"https://{HOST}:*"])
    app = server.streamable_http_app(transport_security=security)
    return BearerOnly(app, secret, auth_log)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--tls", type=Path, required=True, help="PEM with the key and the certificate chain")
    parser.add_argument("--secret-file", type=Path, required=True)
    parser.add_argument("--auth-log", type=Path, required=True)
    parser.add_argument("--release", type=Path, required=True)
    args = parser.parse_args()
    app = build_app(args.secret_file.read_text().strip(), args.auth_log, args.release)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        ssl_certfile=os.fspath(args.tls),
        ssl_keyfile=os.fspath(args.tls),
        log_level="warning",
        timeout_graceful_shutdown=2,
    )


if __name__ == "__main__":
    main()
