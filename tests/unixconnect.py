"""httpcore's sync backend, with a failed Unix-socket connect closing its socket.

httpcore 1.0's ``SyncBackend.connect_unix_socket`` (httpcore/_backends/sync.py) makes the socket,
calls ``connect()`` and, when that raises, drops the socket without closing it. The socket then
sits in a reference cycle (the exception's traceback holds the frame) until the garbage collector
runs, which may be during any later test; under ``filterwarnings = error`` its ResourceWarning is
reported there as an unraisable exception (CI: an ERROR at the setup of an unrelated test, after
a test that polled a control socket nobody listened on yet). Every ``httpx.HTTPTransport(uds=...)``
in the suite (tests/world.py, the fleet and control e2e helpers, ``surrogate claims`` run in
process) goes through this method. The anyio backend, used by the async transport, closes it
already (agronholm/anyio#309).

:func:`install` replaces the method with one that closes the socket when ``connect()`` raises and
otherwise does what httpcore's does. The proxy's own CLI is one short process: the descriptor it
would hold until exit is not a leak there, so the product keeps httpx as it is.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
from typing import Any

import httpcore
from httpcore._backends import sync


def _connect_unix_socket(
    self: sync.SyncBackend,
    path: str,
    timeout: float | None = None,
    socket_options: Iterable[Any] | None = None,
) -> httpcore.NetworkStream:
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError as e:
        raise httpcore.ConnectError(e) from e
    try:
        for option in socket_options or ():
            sock.setsockopt(*option)
        sock.settimeout(timeout)
        sock.connect(path)
    except BaseException as e:
        sock.close()
        if isinstance(e, socket.timeout):
            raise httpcore.ConnectTimeout(e) from e
        if isinstance(e, OSError):
            raise httpcore.ConnectError(e) from e
        raise
    return sync.SyncStream(sock)


def install() -> None:
    sync.SyncBackend.connect_unix_socket = _connect_unix_socket  # type: ignore[method-assign]
