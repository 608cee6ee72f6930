"""A TLS upstream on loopback that writes exact bytes: for responses a well-behaved server library
would never produce (trailers, 1xx before the final response, a secret in a reason phrase or a
header name). Stdlib sockets and ssl; the request head is read up to its blank line and the body
by its framing (Content-Length, or chunked to the last chunk and its trailer section), each
request recorded raw. Responses are looked up by request path: ``responses[path]`` is the bytes
to write, a list of pieces written one by one (10 ms apart: each its own read, as far as TCP
lets it; a callable piece is called for its bytes when its turn comes), or a callable that
gets the raw request and returns them. Connections are kept alive.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Callable

from servers import TestCA

Answer = bytes | list[bytes | Callable[[], bytes]] | Callable[[bytes], bytes]


class RawUpstream:
    __test__ = False

    def __init__(self, ca: TestCA, hostnames: list[str]) -> None:
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ca.ca.issue_cert(*hostnames).configure_cert(self.ctx)
        self.ctx.set_alpn_protocols(["http/1.1"])
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        self.responses: dict[str, Answer] = {}
        self.requests: list[bytes] = []
        self.connections = 0
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []
        self._stopped = threading.Event()

    def start(self) -> RawUpstream:
        t = threading.Thread(target=self._accept, daemon=True, name=f"raw-{self.port}")
        t.start()
        self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stopped.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        for c in list(self._conns):
            with contextlib.suppress(OSError):
                socket.socket.shutdown(c, socket.SHUT_RDWR)
        for t in self._threads:
            t.join(10)

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                raw, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            t = threading.Thread(target=self._serve, args=(raw,), daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, raw: socket.socket) -> None:
        raw.settimeout(15)
        try:
            conn = self.ctx.wrap_socket(raw, server_side=True)
        except OSError:
            raw.close()
            return
        self._conns.append(conn)
        buf = b""
        try:
            while True:
                request, buf = self._read_request(conn, buf)
                if request is None:
                    return
                self.requests.append(request)
                target = request.split(b"\r\n", 1)[0].split(b" ")[1].decode()
                answer = self.responses.get(
                    target.split("?", 1)[0], b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
                )
                if isinstance(answer, list):
                    for piece in answer:
                        conn.sendall(piece() if callable(piece) else piece)
                        time.sleep(0.01)
                    continue
                conn.sendall(answer(request) if callable(answer) else answer)
        except OSError:
            pass
        finally:
            conn.close()

    @staticmethod
    def _read_request(conn: socket.socket, buf: bytes) -> tuple[bytes | None, bytes]:
        def more() -> bool:
            nonlocal buf
            data = conn.recv(65536)
            buf += data
            return bool(data)

        while b"\r\n\r\n" not in buf:
            if not more():
                return None, b""
        end = buf.index(b"\r\n\r\n") + 4
        head = buf[:end].lower()
        if b"transfer-encoding: chunked" in head:
            pos = end
            while True:  # chunks, up to the last one; then the trailer section to its blank line
                while b"\r\n" not in buf[pos:]:
                    if not more():
                        return None, b""
                line_end = buf.index(b"\r\n", pos)
                size = int(buf[pos:line_end].split(b";")[0], 16)
                if size == 0:
                    pos = line_end + 2
                    while not (buf[pos:].startswith(b"\r\n") or b"\r\n\r\n" in buf[pos - 2 :]):
                        if not more():
                            return None, b""
                    end = pos + 2 if buf[pos:].startswith(b"\r\n") else buf.index(b"\r\n\r\n", pos - 2) + 4
                    break
                pos = line_end + 2 + size + 2
                while len(buf) < pos:
                    if not more():
                        return None, b""
        else:
            length = 0
            for line in head.split(b"\r\n"):
                if line.startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            end += length
            while len(buf) < end:
                if not more():
                    return None, b""
        return buf[:end], buf[end:]
