"""proxy.engine.sockets: reading the kernel's TCP socket table to recognise the proxy's own connections."""

from __future__ import annotations

import os
import socket
import sys

import pytest

from proxy.engine import sockets

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="/proc/net/tcp is Linux's")


@pytest.mark.parametrize(
    ("field", "address"),
    [
        ("0100007F:1F90", ("127.0.0.1", 8080)),
        ("0000000000000000FFFF00000100007F:0050", ("127.0.0.1", 80)),
        ("00000000000000000000000001000000:0050", ("::1", 80)),
    ],
    ids=["ipv4", "ipv4-mapped", "ipv6"],
)
def test_table_addresses_are_read_as_the_kernel_wrote_them(field: str, address: tuple[str, int]) -> None:
    assert sockets._address(field) == address  # little-endian words, as on x86 and arm64


@pytest.mark.parametrize(("family", "host"), [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")])
def test_a_connecting_socket_is_found_by_its_local_end_and_owner(family: int, host: str) -> None:
    with socket.socket(family) as server, socket.socket(family) as client:
        server.bind((host, 0))
        server.listen()
        client.connect(server.getsockname()[:2])
        local = client.getsockname()[:2]
        assert sockets.held_by(local, os.getuid())
        assert not sockets.held_by(local, os.getuid() + 4242)  # another user's: not ours
        assert not sockets.held_by((host, 1), os.getuid())  # no socket has that end
