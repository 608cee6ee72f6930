"""proxy.control.client: ``surrogate claims|creds`` against a control socket that does not answer.

A newcomer who stopped a second ``make run`` on the same state dir found its socket file left
behind, and ``surrogate claims list`` printed an httpx traceback. Every command says in one line
what happened, exits 1, and (for a connection that was opened but never answered) that a write
may have been applied.
"""

from __future__ import annotations

import gc
import socket
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.cli.main import main

COMMANDS = {
    "claims-list": ["claims", "list"],
    "claims-create": ["claims", "create", "--pool", "p"],
    "claims-delete": ["claims", "delete", "c1"],
    "creds-put": ["creds", "put", "c1", "gh", "--host", "api.test", "--value-file", "{value}"],
    "creds-list": ["creds", "list", "c1"],
}


def _argv(name: str, state: Path, value: Path) -> list[str]:
    return [a.format(value=value) for a in COMMANDS[name]] + ["--state-dir", str(state)]


@pytest.fixture
def value(tmp_path: Path) -> Path:
    path = tmp_path / "value"
    path.write_text("not-a-secret-just-a-value\n")
    return path


@pytest.fixture
def stale(tmp_path: Path) -> Path:
    """A state dir whose control.sock is a socket file nobody listens on."""
    state = tmp_path / "state"
    state.mkdir()
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(state / "control.sock"))
    s.close()
    return state


@pytest.fixture
def mute(tmp_path: Path) -> Iterator[Path]:
    """A state dir whose control.sock accepts, reads the request and closes without an answer."""
    state = tmp_path / "mute"
    state.mkdir()
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(state / "control.sock"))
    srv.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield state
    srv.close()


@pytest.mark.parametrize("name", COMMANDS)
def test_a_socket_nobody_answers_on_is_one_line_not_a_traceback(
    name: str, stale: Path, value: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_argv(name, stale, value)) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    sock = stale / "control.sock"
    assert captured.err.startswith(f"surrogate: nothing answers on the control socket {sock}")
    assert "running with this --state-dir?" in captured.err
    assert "Traceback" not in captured.err and captured.err.count("\n") == 1


@pytest.mark.parametrize("name", COMMANDS)
def test_a_request_sent_but_not_answered_says_it_may_have_been_applied(
    name: str, mute: Path, value: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_argv(name, mute, value)) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"surrogate: the control API at {mute / 'control.sock'} did not answer (")
    assert "whether the request was applied is not known" in err
    assert "Traceback" not in err and "not-a-secret-just-a-value" not in err


@pytest.mark.parametrize("name", ["claims-list", "creds-put"])
def test_a_refused_connect_leaves_no_socket_for_the_garbage_collector(
    name: str, stale: Path, value: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """httpcore's sync backend dropped the socket of a refused connect unclosed; the collector
    found it during a later, unrelated test and failed that one (tests/unixconnect.py)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert main(_argv(name, stale, value)) == 1
        gc.collect()
    assert [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)] == []
    assert capsys.readouterr().err.startswith("surrogate: nothing answers on the control socket")
