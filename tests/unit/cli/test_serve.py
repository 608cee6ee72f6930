"""proxy.cli.serve: the start-up banner names the trust bundle `surrogate env` names (issue 18
item 3), shows tokens as the shell expression that reads them, and the README's example of it
has the banner's lines (issue 18 item 9: README examples had gone stale)."""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path

import canary
import pytest

from certs import ca
from proxy.cli import serve
from proxy.engine.master import ControlConfig
from proxy.rules.loader import load_rules

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def example(tmp_path: Path) -> Path:
    """rules/example.yaml in a copy of the checkout's layout, with its demo files beside it."""
    (tmp_path / "rules").mkdir()
    rules = tmp_path / "rules" / "example.yaml"
    shutil.copy(ROOT / "rules" / "example.yaml", rules)
    (tmp_path / ".state").mkdir()
    (tmp_path / ".state" / "demo-proxy-token").write_text("demo-proxy-token-value\n")
    canary.source(tmp_path / ".state" / "demo-github-token", canary.make("banner"))
    return rules


def _banner(rules: Path, state: Path, capsys: pytest.CaptureFixture[str]) -> str:
    args = argparse.Namespace(rules=rules, state_dir=state, worker_index=None, workers=1)
    control = ControlConfig(state / "control.sock", None, None)
    serve.banner(load_rules(rules), args, "127.0.0.1", 8080, control)
    return capsys.readouterr().err


def test_the_banner_names_the_bundle_not_the_ca_and_no_token(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / ".state"
    text = _banner(example, state, capsys)
    bundle = ca.sandbox_bundle_path(state).resolve()
    assert f"  trust this bundle in the sandbox (system roots + surrogate's CA): {bundle}\n" in text
    assert f"    export CURL_CA_BUNDLE={bundle} SSL_CERT_FILE={bundle}\n" in text
    assert "mitmproxy-ca-cert" not in text
    assert '"http://demo:$(cat ' in text and "demo-proxy-token)@127.0.0.1:8080" in text
    assert "demo-proxy-token-value" not in text


def _shape(line: str) -> str:
    """A banner line up to its first value (a path, an address, a shell expression, a placeholder)."""
    return re.split(r"/|\$|127\.0\.0\.1|surr_|\.state", line, maxsplit=1)[0]


def test_the_readme_example_of_the_banner_has_its_lines(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # as `make run` runs it: relative rules file and state dir
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(
        r"`make run` prints how to point a client at it, for example:\n\n```\n(.+?)\n```", readme, re.S
    )
    assert block, "the README's banner example"
    shown = [_shape(line) for line in block[1].splitlines()]
    real = [_shape(line) for line in _banner(Path("rules/example.yaml"), Path(".state"), capsys).splitlines()]
    assert shown == real
