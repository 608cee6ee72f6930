"""proxy.engine.master's control socket: mode 0600 from birth, and a bind that fails (its directory
gone, a path longer than sun_path's 108 bytes) raises without leaving a descriptor for the garbage
collector to find during some later test or request."""

from __future__ import annotations

import gc
import stat
import warnings
from pathlib import Path

import pytest

from proxy.engine.master import _unix_socket


def test_the_socket_is_0600_and_listening(tmp_path: Path) -> None:
    sock = _unix_socket(tmp_path / "control.sock")
    try:
        assert stat.S_IMODE((tmp_path / "control.sock").stat().st_mode) == 0o600
        assert sock.getsockname() == str(tmp_path / "control.sock")
    finally:
        sock.close()


@pytest.mark.parametrize("where", ["no-such-dir/control.sock", "x" * 200 + ".sock"])
def test_a_failed_bind_closes_its_socket(tmp_path: Path, where: str) -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(OSError):
            _unix_socket(tmp_path / where)
        gc.collect()
    assert [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)] == []
