"""A raw HTTPS/1.1 upstream that records the exact bytes each connection received.

For the framing tests: a proxy that sends a body whose length disagrees with its
``Content-Length`` (or a body after a head that announced none) desynchronises the upstream
connection: the leftover bytes become the start of the next request. This server keeps every
byte it was sent per connection (``RawUpstream.streams``) and parses them with h11 (the parser
of a real server, not ours), answering ``200 ok`` to each complete request; what h11 refuses is
kept in ``errors``. Only ``http/1.1`` is offered in ALPN.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from dataclasses import dataclass, field
from types import TracebackType

import h11
import trustme


@dataclass
class RawRequest:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes = b""
    complete: bool = False

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)


@dataclass
class RawConnection:
    data: bytearray = field(default_factory=bytearray)  # every byte received, in order
    requests: list[RawRequest] = field(default_factory=list)
    error: str | None = None  # what h11 refused on this connection


class RawUpstream:
    def __init__(self, ca: trustme.CA, hostnames: list[str]) -> None:
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ca.issue_cert(*hostnames).configure_cert(self.ctx)
        self.ctx.set_alpn_protocols(["http/1.1"])
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        self.streams: list[RawConnection] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._accept = threading.Thread(target=self._serve, daemon=True, name="raw-upstream")

    def __enter__(self) -> RawUpstream:
        self._accept.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self.sock.close()
        self._accept.join(5)
        for t in self._threads:
            t.join(5)

    def requests(self, path: str) -> list[RawRequest]:
        with self._lock:
            return [r for c in self.streams for r in c.requests if r.target.startswith(path)]

    def connections(self, path: str) -> list[RawConnection]:
        """The connections on which a request to ``path`` began."""
        with self._lock:
            return [c for c in self.streams if any(r.target.startswith(path) for r in c.requests)]

    def _serve(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                raw, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn = RawConnection()
            with self._lock:
                self.streams.append(conn)
            t = threading.Thread(target=self._connection, args=(raw, conn), daemon=True)
            self._threads.append(t)
            t.start()

    def _connection(self, raw: socket.socket, rec: RawConnection) -> None:
        raw.settimeout(10)
        with contextlib.suppress(OSError), self.ctx.wrap_socket(raw, server_side=True) as tls:
            parser = h11.Connection(h11.SERVER)
            current: RawRequest | None = None
            while not self._stop.is_set():
                data = tls.recv(65536)
                with self._lock:
                    rec.data += data
                parser.receive_data(data)
                while True:
                    try:
                        event = parser.next_event()
                    except h11.RemoteProtocolError as e:
                        with self._lock:
                            rec.error = str(e)
                        return
                    if event is h11.NEED_DATA or event is h11.PAUSED:
                        break
                    if isinstance(event, h11.Request):
                        current = RawRequest(
                            event.method.decode(),
                            event.target.decode("latin-1"),
                            [(k.decode(), v.decode("latin-1")) for k, v in event.headers.raw_items()],
                        )
                        with self._lock:
                            rec.requests.append(current)
                    elif isinstance(event, h11.Data) and current is not None:
                        current.body += event.data
                    elif isinstance(event, h11.EndOfMessage) and current is not None:
                        current.complete = True
                        body = b"ok"
                        tls.sendall(
                            parser.send(
                                h11.Response(status_code=200, headers=[("Content-Length", str(len(body)))])
                            )
                            + parser.send(h11.Data(data=body))
                            + parser.send(h11.EndOfMessage())
                        )
                        parser.start_next_cycle()
                        current = None
                    elif isinstance(event, h11.ConnectionClosed):
                        return
                if not data:
                    return
