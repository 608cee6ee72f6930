"""Where ``--control-tcp`` binds: a proxy node (``surrogate run``) on loopback only, whatever the
machine's resolver says ``localhost`` is (review r-audit)."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.cli.main import _parser
from proxy.cli.serve import control_config


@pytest.mark.parametrize("given", ["localhost", "LOCALHOST", "127.0.0.1", "[::1]"])
def test_a_proxy_nodes_control_listener_binds_a_loopback_address_not_a_name(
    tmp_path: Path, given: str
) -> None:
    """Hostile review: ``localhost`` was passed to the server as a name, so an /etc/hosts (or a
    container's host aliases) that maps it elsewhere put the API, in cleartext, beyond loopback."""
    token = tmp_path / "token"
    token.write_text("t" * 32)
    args = _parser().parse_args(
        ["run", "--rules", "r.yaml", "--state-dir", str(tmp_path), "--control-tcp", f"{given}:9090"]
        + ["--control-token-file", str(token)]
    )
    try:
        config = control_config(args)
    except ValueError:
        assert given == "LOCALHOST"  # refused is fine too: never bound by name
        return
    assert config.tcp is not None and config.tcp[0] in ("127.0.0.1", "::1")
