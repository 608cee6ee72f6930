"""proxy.control.apiedge: the authorities (Host) a TCP control listener answers."""

from __future__ import annotations

import pytest

from proxy.control.apiedge import allowed_authorities, foreign_authority


@pytest.mark.parametrize(
    ("listen", "host", "ok"),
    [
        (("::1", 9), "[::1]:9", True),
        (("::1", 9), "localhost:9", True),
        (("::1", 9), "127.0.0.1:9", False),
        (("localhost", 9), "127.0.0.1:9", True),
        (("localhost", 9), "[::1]:9", True),
        (("localhost", 9), "evil.test:9", False),
    ],
)
def test_the_authorities_a_listener_answers(listen: tuple[str, int], host: str, ok: bool) -> None:
    assert (foreign_authority(host, None, allowed_authorities(*listen)) is None) is ok
