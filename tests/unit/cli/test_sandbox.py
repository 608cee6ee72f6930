"""proxy.cli.sandbox (and ``keys rotate``): the commands that read the state ``surrogate run``
made refuse a state dir without it, naming the dir and ``--state-dir``, and create nothing
(issue 18 item 2: ``env`` and ``ca export`` printed a fresh CA the running proxy did not use).
In process, through ``proxy.cli.main.main``: the exit code, stderr and the files on disk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from certs import ca
from proxy.cli.admin import demo_init
from proxy.cli.main import main
from proxy.store.sqlite import STORE_FILE, open_state_store

RULES = """\
version: 1
pools:
  p:
    egress:
      - host: api.test
claims:
  - id: c
    pool: p
    proxy_token: file:tok
"""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty HOME and no $SURROGATE_STATE_DIR: the default state dir is HOME's, and absent."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SURROGATE_STATE_DIR", raising=False)
    return home


@pytest.fixture
def rules(tmp_path: Path) -> Path:
    (tmp_path / "tok").write_text("c-proxy-token\n")
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    return path


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# every command that reads the state dir and must not create it; {rules} is the rules file
READERS = {
    "env": (["env", "--rules", "{rules}", "--claim", "c"], "CA"),
    "ca-export": (["ca", "export"], "CA"),
    "ca-bundle": (["ca", "bundle"], "CA"),
    "keys-rotate": (["keys", "rotate"], "credential store"),
    "keys-rotate-resume": (["keys", "rotate", "--resume"], "credential store"),
}


@pytest.mark.parametrize("command", READERS, ids=list(READERS))
@pytest.mark.parametrize("given", ["default", "missing-dir", "empty-dir"])
def test_a_state_dir_without_the_proxys_state_is_refused_and_nothing_created(
    home: Path, rules: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, given: str
) -> None:
    argv, what = READERS[command]
    argv = [a.format(rules=rules) for a in argv]
    if given == "default":
        state = home / ".local" / "state" / "surrogate"
    else:
        state = tmp_path / "state"
        if given == "empty-dir":
            state.mkdir()
        argv += ["--state-dir", str(state)]
    before = _tree(tmp_path)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"surrogate: no {what} in {state} " in err
    assert "--state-dir" in err and "Nothing was created" in err
    assert ("the default state dir" in err) == (given == "default")
    # A fresh clone's `env --state-dir .state` before `make run` was told to pass --state-dir, which
    # it had: the refusal says which command makes that dir's state, so start the proxy first.
    assert f"'surrogate run --state-dir {state}' creates it at its first start" in err
    assert "start the proxy first" in err
    assert _tree(tmp_path) == before  # no CA, no key, no store, no bundle, not even the dir
    assert "Traceback" not in err


def test_env_with_a_ca_but_no_store_serves_a_rules_file_claim_and_creates_no_store(
    home: Path, rules: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    demo_init(state)  # the CA, as `make run` prepares it; no store yet
    assert main(["env", "--rules", str(rules), "--claim", "c", "--state-dir", str(state)]) == 0
    out = capsys.readouterr().out
    bundle = ca.sandbox_bundle_path(state).resolve()
    assert f"export SSL_CERT_FILE={bundle}\n" in out
    assert not (state / STORE_FILE).exists()
    assert main(["env", "--rules", str(rules), "--claim", "nope", "--state-dir", str(state)]) == 1
    assert f"no claim 'nope' in {rules} or in a store ({state} has none)" in capsys.readouterr().err


def test_ca_export_and_bundle_read_the_ca_that_is_there(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    ca.ensure_ca(state)
    pem = ca.export_pem(state)
    assert main(["ca", "export", "--state-dir", str(state)]) == 0
    assert capsys.readouterr().out == pem
    out = tmp_path / "bundle.pem"
    assert main(["ca", "bundle", "--state-dir", str(state), "--out", str(out)]) == 0
    text = out.read_text()
    assert text.endswith(pem) and text.count("-----BEGIN CERTIFICATE-----") > 1  # roots + the CA
    assert os.stat(out).st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".bundle")] == []  # no temp file left


def test_keys_rotate_works_on_the_store_that_is_there(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    open_state_store(state).close()
    assert main(["keys", "rotate", "--state-dir", str(state)]) == 0
    assert "0 stored values re-encrypted" in capsys.readouterr().out


def test_ca_bundle_to_stdout_prints_the_bundle_alone(
    home: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """`ca bundle --out /dev/stdout > file` (the Containerfile's recipe) gets the PEM and nothing
    else, and /dev/stdout is written through, never replaced."""
    state = tmp_path / "state"
    ca.ensure_ca(state)
    assert main(["ca", "bundle", "--state-dir", str(state), "--out", "/dev/stdout"]) == 0
    out = capfd.readouterr().out
    assert out.endswith(ca.export_pem(state)) and out.startswith("-----BEGIN CERTIFICATE-----")
    assert Path("/dev/stdout").is_symlink() or not Path("/dev/stdout").is_file()


def test_ca_init_and_keys_init_create_on_purpose_and_only_once(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a fleet's install made with `ca bundle` and `keys rotate` on an empty dir (which now
    refuse): `ca init` makes the CA, `keys init` the key file (0600), each once."""
    state = tmp_path / "fleet"
    assert main(["ca", "init", "--state-dir", str(state)]) == 0
    cert = ca.ca_cert_path(state)
    assert capsys.readouterr().out == f"surrogate: CA {cert} (created)\n"
    pem = cert.read_text()
    assert main(["ca", "init", "--state-dir", str(state)]) == 0
    assert capsys.readouterr().out == f"surrogate: CA {cert} (already there)\n"
    assert cert.read_text() == pem  # the same CA, not a new one
    assert main(["keys", "init", "--state-dir", str(state)]) == 0
    key = state / "store.key"
    assert capsys.readouterr().out == f"surrogate: key file {key} (created)\n"
    before = key.read_bytes()
    assert os.stat(key).st_mode & 0o777 == 0o600
    assert main(["keys", "init", "--state-dir", str(state)]) == 0
    assert "already there" in capsys.readouterr().out and key.read_bytes() == before
    assert not (state / STORE_FILE).exists()  # a key file, no store
    assert main(["ca", "bundle", "--state-dir", str(state)]) == 0  # now there is a CA to bundle


def test_the_refusal_says_how_to_make_a_ca_on_purpose(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["ca", "bundle", "--state-dir", str(tmp_path / "fleet")]) == 1
    assert "or make one on purpose with 'surrogate ca init --state-dir DIR'" in capsys.readouterr().err
