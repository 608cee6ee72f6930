"""proxy.audit's sink: every line it writes carries ``prev``, the hash of the line before it,
through rotation, relayed worker lines, restarts on the same file and a writer that died
mid-line; and a line the encoder cannot write as UTF-8 is still written (and chained)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import ROOT

from proxy import audit
from proxy.cli.main import main
from proxy.cli.verify import chain_order, read_lines
from proxy.core import chain


@pytest.fixture(autouse=True)
def _reset_audit() -> Iterator[None]:
    yield
    audit.configure(None)


def event(i: int) -> dict[str, Any]:
    return {audit.REQUEST_ID: f"r{i}", audit.HOST: "api.test", audit.PATH: f"/p/{i}", audit.DECISION: "allow"}


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")[:-1]


def verify(*files: Path) -> chain.Report:
    return chain.verify([x for f in chain_order(list(files)) for x in read_lines(f)], audit.PREV)


def test_each_line_names_the_hash_of_the_line_before_it(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit.configure(path)
    for i in range(3):
        audit.emit("request", event(i))
    audit.logger().info("reload", **{audit.OUTCOME: "applied"})  # the structlog path is chained too
    raw = lines(path)
    prevs = [json.loads(r)[audit.PREV] for r in raw]
    assert prevs == [None] + [chain.line_hash(r) for r in raw[:-1]]


def test_the_chain_runs_through_rotated_files_and_verifies(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit.configure(path, max_bytes=1500, backups=20)
    for i in range(40):
        audit.emit("request", event(i))
    files = sorted(tmp_path.glob("audit.jsonl*"))
    assert len(files) > 3
    ordered = chain_order(files)
    for older, newer in zip(ordered, ordered[1:], strict=False):
        assert json.loads(lines(newer)[0])[audit.PREV] == chain.line_hash(lines(older)[-1])
    report = verify(*files)
    assert report.broken is None and report.lines == 40
    assert main(["audit", "verify", *map(str, files)]) == 0


def test_relayed_worker_lines_are_chained_by_the_writer_in_one_chain(tmp_path: Path) -> None:
    """--workers N: workers render without prev; the supervisor splices it in, one chain."""
    path = tmp_path / "audit.jsonl"
    audit.configure(path, max_bytes=1200, backups=20)
    for i in range(30):
        worker = 100 + i % 3
        audit.write_line(json.dumps({"event": "request", "worker": worker, "seq": i // 3 + 1, "host": "a"}))
    audit.write_line("a line a worker printed that is not an event")  # dropped, not chained
    files = list(tmp_path.glob("audit.jsonl*"))
    report = verify(*files)
    assert report.broken is None and report.lines == 30
    assert {json.loads(r)["worker"] for f in files for r in lines(f)} == {100, 101, 102}


def test_a_worker_writes_no_prev(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    audit.configure(None, chain=False)
    audit.emit("request", event(1))
    assert audit.PREV not in json.loads(capsys.readouterr().out)


def test_a_restart_continues_the_chain_from_the_files_last_line(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit.configure(path)
    audit.emit("request", event(1))
    audit.configure(path)  # a new process on the same file
    audit.emit("request", event(2))
    first, second = lines(path)
    assert json.loads(second)[audit.PREV] == chain.line_hash(first)
    assert verify(path).broken is None


def test_a_line_removed_before_a_restart_is_found(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit.configure(path)
    for i in range(4):
        audit.emit("request", event(i))
    audit.configure(path)
    audit.emit("request", event(9))
    raw = lines(path)
    path.write_bytes(b"\n".join(raw[:1] + raw[2:]) + b"\n")
    b = verify(path).broken
    assert b is not None and (b.number, b.kind) == (2, "removed")


def test_a_line_left_unfinished_by_a_dead_writer_is_ended_and_reported(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit.configure(path)
    audit.emit("request", event(1))
    with path.open("ab") as f:
        f.write(b'{"event": "request", "host": "cut')  # killed mid-write
    audit.configure(path)
    audit.emit("request", event(2))
    raw = lines(path)
    assert len(raw) == 3 and json.loads(raw[2])[audit.PREV] == chain.line_hash(raw[1])
    b = verify(path).broken
    assert b is not None and (b.number, b.kind) == (2, "unreadable")


def test_a_path_byte_that_is_not_utf8_is_still_audited_and_chained(tmp_path: Path) -> None:
    """mitmproxy decodes a request target with surrogateescape: the lone surrogate made the
    line unencodable and the event was lost (UnicodeEncodeError). It is written escaped."""
    path = tmp_path / "audit.jsonl"
    audit.configure(path)
    audit.emit("request", {**event(1), audit.PATH: audit.redact_path("/a\udcff/b?x=1")})
    audit.emit("request", event(2))
    raw = lines(path)
    assert json.loads(raw[0])[audit.PATH] == "/a\udcff/b?x=REDACTED"
    assert verify(path).broken is None


def test_ocsf_goes_to_its_own_file_beside_the_native_lines(tmp_path: Path) -> None:
    path, ocsf = tmp_path / "audit.jsonl", tmp_path / "audit.ocsf.jsonl"
    audit.configure(path, ocsf=ocsf)
    audit.emit("request", {**event(1), audit.METHOD: "GET", audit.REASON: "allowed"})
    audit.logger().info("reload", **{audit.OUTCOME: "applied"})  # not HTTP activity: native only
    audit.write_line(json.dumps({"event": "tunnel", "method": "CONNECT", "decision": "deny", "host": "x"}))
    audit.write_line('{"event": "request", broken}')  # still relayed (and chained); no OCSF event
    got = [json.loads(r) for r in lines(ocsf)]
    assert [(e["class_uid"], e["activity_id"]) for e in got] == [(4002, 3), (4002, 1)]
    assert len(lines(path)) == 4


def test_a_second_process_on_the_same_file_is_refused(tmp_path: Path) -> None:
    """Two writers would interleave two chains (and both would rotate): the second one stops."""
    path = tmp_path / "audit.jsonl"
    audit.configure(path, max_bytes=300, backups=3)
    for i in range(5):  # rotated: the lock follows the new file
        audit.emit("request", event(i))
    code = f"from pathlib import Path; from proxy import audit; audit.configure(Path({str(path)!r}))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode != 0 and "is being written by another process" in done.stderr
    audit.configure(None)  # closed: free again
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=False).returncode == 0


# -- one event, one line, whatever the sandbox put in it (review r-audit) ---------------------

SPLITTERS = {
    "LF": "\n",
    "CR": "\r",
    "CRLF": "\r\n",
    "LINE SEPARATOR": "\u2028",
    "PARAGRAPH SEPARATOR": "\u2029",
    "NEL": "\x85",
    "VT FF FS GS RS": "\x0b\x0c\x1c\x1d\x1e",
    "NUL": "\x00",
    "a lone surrogate (a path byte)": "\udcff",
    "a lone high surrogate": "\ud800",
    "a forged line": '"}\n{"event": "request", "host": "forged.test", "prev": null}\n{"x": "',
    "1 MiB": "A" * (1 << 20),
}


@pytest.mark.parametrize("value", list(SPLITTERS.values()), ids=list(SPLITTERS))
def test_a_value_that_splits_lines_elsewhere_stays_inside_its_line(
    tmp_path: Path, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Written by the process itself and relayed from a worker (rendered there, chained by the
    writer): each event is one line that parses back, and the chain verifies. (A reader that
    splits on U+2028, NEL or CR would see more lines: verify splits on LF only.)"""
    fields = {
        audit.HOST: f"a{value}b.test",
        audit.PATH: f"/p{value}",
        audit.MESSAGE: value,
        audit.RULE: value,
    }
    audit.configure(None, chain=False)  # a worker: its lines go to its stdout, the relay's pipe
    audit.emit("request", dict(fields))
    relayed = capsys.readouterr().out.encode("utf-8", "surrogateescape").split(b"\n")
    assert relayed[-1] == b"" and len(relayed) == 2
    path = tmp_path / "audit.jsonl"
    audit.configure(path)
    audit.emit("request", dict(fields))
    audit.write_line(relayed[0].decode("utf-8", "replace"))  # as workers._relay hands it on
    audit.emit("request", event(3))
    raw = lines(path)
    assert len(raw) == 3
    for r in raw[:2]:
        assert json.loads(r)[audit.PATH].startswith("/p")
    assert verify(path).broken is None
    assert main(["audit", "verify", str(path)]) == 0


@pytest.mark.parametrize(
    "fields",
    [
        {"duration_ms": [1]},
        {"bytes_in": {"a": 1}, "status": 200},
        {"bytes_out": "many"},
        {"time": 12},
        {"credentials": 5},
        {"client": ["x"]},
        {"port": [443], "host": ["h"]},
    ],
    ids=[
        "duration list",
        "bytes_in object",
        "bytes_out text",
        "time number",
        "credentials number",
        "client list",
        "port list",
    ],
)
def test_a_relayed_line_the_ocsf_mapping_cannot_read_is_still_written(
    tmp_path: Path, fields: dict[str, Any]
) -> None:
    """Hostile review: a worker's line whose fields are of another type made the OCSF mapping
    raise TypeError out of ``write_line``: the relay task died, the worker's pipe filled and
    its flows stalled. The native line is written (and chained) and the next lines too."""
    path, ocsf = tmp_path / "audit.jsonl", tmp_path / "audit.ocsf.jsonl"
    audit.configure(path, ocsf=ocsf)
    audit.write_line(json.dumps({"event": "request", "method": "GET", "decision": "allow", **fields}))
    audit.write_line(json.dumps({"event": "request", "method": "GET", "decision": "allow", "host": "next"}))
    assert len(lines(path)) == 2 and verify(path).broken is None
    assert json.loads(lines(ocsf)[-1])["http_request"]["url"]["hostname"] == "next"


def test_a_relayed_line_nested_too_deep_to_parse_is_still_written(tmp_path: Path) -> None:
    """RecursionError (not a ValueError) out of json.loads ended the relay the same way."""
    path, ocsf = tmp_path / "audit.jsonl", tmp_path / "audit.ocsf.jsonl"
    audit.configure(path, ocsf=ocsf)
    audit.write_line('{"event": "request", "x": ' + '{"a": ' * 200_000 + "1" + "}" * 200_000 + "}")
    audit.write_line(json.dumps({"event": "request", "method": "GET", "decision": "allow", "host": "next"}))
    assert len(lines(path)) == 2
    assert json.loads(lines(ocsf)[-1])["http_request"]["url"]["hostname"] == "next"


PLACEHOLDER_LIKE = "surr_AuditPlaceholder000000001"


@pytest.mark.parametrize(
    "spelling",
    [
        PLACEHOLDER_LIKE,
        PLACEHOLDER_LIKE.upper(),
        PLACEHOLDER_LIKE.replace("_", "%5f"),
        PLACEHOLDER_LIKE + "A" * 60,  # a longer run: the bounded pattern matched none of it
        "x" + PLACEHOLDER_LIKE + "0" * 100 + ".evil.test",
    ],
    ids=["plain", "upper", "percent", "longer run", "inside a label"],
)
@pytest.mark.parametrize("field", [audit.HOST, audit.MESSAGE, audit.METHOD])
def test_no_placeholder_shaped_string_stays_in_a_named_field(field: str, spelling: str) -> None:
    """Hostile review: ``method`` (any token a sandbox sends) was not hidden at all, and a
    placeholder followed by more letters or digits than a placeholder holds escaped the
    pattern (its end had to be a non-alphanumeric within 64 characters)."""
    fields: dict[str, Any] = {field: f"{spelling} and {spelling}"}
    audit.hide_placeholders(fields)
    assert PLACEHOLDER_LIKE[5:].lower() not in str(fields[field]).lower()
