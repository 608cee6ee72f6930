"""Extra upstream services for the transparent-mode test, run inside its upstream namespace:
a WebSocket echo server (8443), a package index (9443) and an MCP server (10443), all on
10.232.0.2 with certificates from the test CA. Each records the Authorization it received.
Prints "ready"; stops when stdin closes and writes what it saw to --record (JSON)."""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import subprocess
import sys
import threading

sys.path[:0] = [str(pathlib.Path(__file__).parent), str(pathlib.Path(__file__).parent.parent)]

import trustme  # noqa: E402
from _pkgindex import PackageIndex, build_wheel  # noqa: E402
from servers import TestCA  # noqa: E402
from websockets.asyncio.server import ServerConnection, serve  # noqa: E402

ADDR = "10.232.0.2"


class _CA(TestCA):
    def __init__(self, cert: pathlib.Path, key: pathlib.Path) -> None:
        self.ca = trustme.CA.from_pem(cert.read_bytes(), key.read_bytes())
        self.ca_pem = cert


def main() -> None:
    ap = argparse.ArgumentParser()
    for name in ("--ca-cert", "--ca-key", "--secret-file", "--record", "--tmp"):
        ap.add_argument(name, type=pathlib.Path, required=True)
    args = ap.parse_args()
    ca = _CA(args.ca_cert, args.ca_key)
    secret = args.secret_file.read_text().strip()
    ws_auth: list[str] = []

    import ssl

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.ca.issue_cert("api.test").configure_cert(ctx)
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    ready = threading.Event()

    async def echo(ws: ServerConnection) -> None:
        ws_auth.append(ws.request.headers.get("Authorization", "") if ws.request else "")
        async for message in ws:
            await ws.send(f"echo:{message}")

    async def ws_main() -> None:
        async with serve(echo, ADDR, 8443, ssl=ctx):
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(ws_main(),), daemon=True)
    thread.start()
    ready.wait(10)
    wheel = build_wheel("surrogate-netns-demo", "0.1", "surrogate_netns_demo", 'WHERE = "netns"\n')
    index = PackageIndex(ca, "pkgs.test", password=secret, wheels=[wheel], bind=(ADDR, 9443)).start()
    tls = args.tmp / "mcp-netns.pem"
    ca.ca.issue_cert("mcp.test").private_key_and_cert_chain_pem.write_to_path(str(tls))
    (args.tmp / "mcp-release").touch()  # the tool does not wait in this test
    mcp = subprocess.Popen(
        [
            sys.executable,
            str(pathlib.Path(__file__).with_name("_mcp_server.py")),
            "--host",
            ADDR,
            "--port",
            "10443",
            "--tls",
            str(tls),
            "--secret-file",
            str(args.secret_file),
            "--auth-log",
            str(args.tmp / "mcp-auth.log"),
            "--release",
            str(args.tmp / "mcp-release"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(args.tmp / "mcp-netns.stderr", "wb"),  # noqa: SIM115
    )
    import socket
    import time

    for _ in range(200):
        try:
            socket.create_connection((ADDR, 10443), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    print("ready", flush=True)
    sys.stdin.read()
    mcp.terminate()
    mcp.wait(10)
    index.stop()
    loop.call_soon_threadsafe(stop.set)
    thread.join(10)
    auth_log = args.tmp / "mcp-auth.log"
    args.record.write_text(
        json.dumps(
            {
                "ws": ws_auth,
                "pip": [a for a, _ in index.seen],
                "mcp": auth_log.read_text().splitlines() if auth_log.exists() else [],
            }
        )
    )


if __name__ == "__main__":
    main()
