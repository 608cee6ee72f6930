"""An ASGI app served by hypercorn over TLS on a loopback port, in a thread of its own: the base
of the test upstreams that speak HTTP/2 (tests/h2server.py, tests/asgi_upstream.py)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from pathlib import Path
from typing import Any, Self

from hypercorn.asyncio import serve
from hypercorn.config import Config


class HypercornServer:
    """Serve ``self._app`` (an ASGI callable a subclass defines) on ``127.0.0.1:port``."""

    __test__ = False

    def __init__(self, cert_pem: Path, key_pem: Path, alpn: list[str], name: str) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.port: int = self.sock.getsockname()[1]
        self.config = Config()
        self.config.bind = [f"fd://{self.sock.fileno()}"]
        self.config.certfile, self.config.keyfile = str(cert_pem), str(key_pem)
        self.config.alpn_protocols = alpn
        self.config.accesslog = self.config.errorlog = None
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    async def _app(self, scope: Any, receive: Any, send: Any) -> None:
        raise NotImplementedError

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._run, name=f"{self._name}-{self.port}", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"{self._name} did not start")
        return self

    def _run(self) -> None:
        async def main() -> None:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            self._ready.set()
            await serve(self._app, self.config, shutdown_trigger=self._stop.wait)  # type: ignore[arg-type]

        asyncio.run(main())

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)
        with contextlib.suppress(OSError):  # hypercorn may have closed it already
            self.sock.close()
