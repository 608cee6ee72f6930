"""A fresh clone, as a newcomer meets it (issue 18, "what must be shown"): ``make run`` on an empty
checkout of HEAD serves, prints the banner the README shows, line for line, and the README's worked
example gets the answers the README gives.

Decided: the clone reuses the suite's Python environment instead of installing from PyPI. The test
makes the clone's ``.venv`` itself (``python -m venv --without-pip``), with a ``.pth`` that adds
this interpreter's site-packages, and marks it installed (``.venv/.installed`` newer than
``pyproject.toml``, the Makefile's own stamp), so ``make run`` runs its ``demo-setup`` and ``run``
steps unchanged against the clone's files (``python -m proxy`` from the clone imports the clone's
``proxy`` first). The shared venv is never written to. What this leaves out is ``pip install``
itself, which ``tests/test_packaging.py`` covers.

Only loopback: the two requests of the worked example that this test makes are refused before
any upstream connection (a violation, and a host no rule allows).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import site
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import canary
import pytest
from harness import ROOT, free_port

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not all(shutil.which(t) for t in ("make", "git", "curl")), reason="needs make, git and curl"
    ),
]

README = (ROOT / "README.md").read_text(encoding="utf-8")


def _readme_block(after: str) -> str:
    block = re.search(re.escape(after) + r"\n\n```\w*\n(.+?)\n```", README, re.S)
    assert block, f"the README's block after {after!r}"
    return block[1]


def _clone(dest: Path) -> None:
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    if head.returncode != 0:
        pytest.skip(f"{ROOT} is not a git checkout: {head.stderr.strip()}")
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(ROOT), str(dest)], check=True, timeout=120)
    subprocess.run(["git", "-C", str(dest), "checkout", "-q", head.stdout.strip()], check=True, timeout=120)
    # The clone's tracked files are the repository's source (test modules hold canary literals),
    # not something the run wrote: exempt them from the suite's canary scan, which still reads
    # every file `make run` creates in the clone (.state: audit, store, CA, tokens).
    listed = subprocess.run(
        ["git", "-C", str(dest), "ls-files", "-z"], capture_output=True, check=True, timeout=60
    )
    for name in listed.stdout.decode().split("\0"):
        if name:
            canary.exempt(dest / name)


def _reuse_this_venv(clone: Path) -> None:
    """The clone's .venv: an empty venv that sees this interpreter's packages, marked installed."""
    venv = clone / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    dirs = [*site.getsitepackages(), sysconfig.get_path("purelib")]
    (purelib / "_surrogate_suite.pth").write_text(
        "".join(f"import site; site.addsitedir({d!r})\n" for d in dict.fromkeys(dirs))
    )
    past = time.time() - 120  # the Makefile's stamp must be newer than pyproject.toml
    os.utime(clone / "pyproject.toml", (past, past))
    (venv / ".installed").touch()


def _wait_for(path: Path, text: str, proc: subprocess.Popen[bytes], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = path.read_text(errors="replace")
        if text in out:
            return out
        if proc.poll() is not None:
            pytest.fail(f"make run exited {proc.returncode} before printing {text!r}:\n{out}")
        time.sleep(0.5)
    pytest.fail(f"make run printed no {text!r} within {timeout} s:\n{path.read_text(errors='replace')}")


def _curl(clone: Path, port: int, *args: str) -> subprocess.CompletedProcess[str]:
    """curl with the two variables of the README's worked example, and nothing else of ours."""
    token = (clone / ".state" / "demo-proxy-token").read_text().strip()
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env["HTTPS_PROXY"] = f"http://demo:{token}@127.0.0.1:{port}"
    env["CURL_CA_BUNDLE"] = str(clone / ".state" / "ca" / "bundle.pem")
    return subprocess.run(
        ["curl", "-sS", "--max-time", "20", *args],
        capture_output=True, text=True, env=env, cwd=clone, timeout=40, check=False,
    )  # fmt: skip


def _normal(text: str) -> str:
    """Without the worker count, which is the machine's (one worker per core; none said for one)."""
    return re.sub(r", \d+ workers$", "", text, flags=re.M)


def test_make_run_on_a_fresh_clone_serves_as_the_readme_says(tmp_path: Path) -> None:
    clone = tmp_path / "surrogate"
    _clone(clone)
    _reuse_this_venv(clone)
    port = free_port()
    out_path = tmp_path / "make-run.out"
    with out_path.open("wb") as out:
        proc = subprocess.Popen(
            ["make", "run", f"LISTEN=127.0.0.1:{port}"],
            cwd=clone, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        banner_end = (
            "placeholder github: surr_DemoGithubPlaceholder0001  (bound to api.github.com, github.com)"
        )
        printed = _wait_for(out_path, banner_end, proc, timeout=180)
        # The banner the README shows, with this clone's path and port: every line, in order.
        shown = _readme_block("`make run` prints how to point a client at it, for example:")
        shown = shown.replace("/path/to/surrogate", str(clone)).replace("127.0.0.1:8080", f"127.0.0.1:{port}")
        start = printed.index("surrogate: explicit proxy on")
        got = printed[start : printed.index(banner_end) + len(banner_end)]
        assert _normal(got) == _normal(shown)
        assert "Traceback" not in printed
        assert "setuptools" not in printed  # issue 18 item 10

        # The worked example: a placeholder toward an allowed host it is not bound to.
        for _ in range(20):  # the banner comes with the listener; a loaded machine may lag
            done = _curl(
                clone, port, "-H", "Authorization: Bearer surr_DemoGithubPlaceholder0001",
                "https://httpbin.org/headers",
            )  # fmt: skip
            if "(7)" not in done.stderr:
                break
            time.sleep(0.5)
        answer = json.loads(done.stdout)
        assert (answer["error"], answer["decision"]) == ("placeholder_violation", "violation")
        said = re.sub(r"\s*\n#\s*", " ", README)  # the README's comment lines, joined
        assert f'"message": "{answer["message"]}"' in said

        denied = _curl(clone, port, "https://example.com/")
        assert "curl: (56) CONNECT tunnel failed, response 403" in denied.stderr

        # The proxy's terminal shows one audit line per request, with the README line's fields.
        readme_line = _readme_block("The proxy's terminal (stdout) shows one audit line per request:")
        readme_event = json.loads(readme_line)
        printed = _wait_for(out_path, answer["request_id"], proc, timeout=30)
        line = next(ln for ln in printed.splitlines() if answer["request_id"] in ln and ln.startswith("{"))
        assert list(json.loads(line)) == list(readme_event)
        assert line.endswith(', "prev": null}') or ', "prev": "' in line  # as the README's, any --workers
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # make and the proxy it started: the group we made
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
    # Stopped: nothing listens on the port any more.
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass
