"""proxy.engine.workers' relay of a worker's audit lines: one whole line per record, and a line
longer than the relay's limit is dropped whole (none of its bytes become a line of their own)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from proxy import audit
from proxy.cli.verify import read_lines
from proxy.core import chain
from proxy.engine import workers

FORGED = '{"event": "request", "claim": "someone-else", "decision": "allow", "host": "forged.test"}'


async def relayed(data: bytes, limit: int, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    out: list[str] = []
    monkeypatch.setattr(audit, "write_lines", out.extend)
    reader = asyncio.StreamReader()
    task = asyncio.create_task(workers._relay(lambda: reader.read(1000), 4242, limit))
    for k in range(0, len(data), 1000):  # as a pipe delivers it, a read at a time
        reader.feed_data(data[k : k + 1000])
        await asyncio.sleep(0)
    reader.feed_eof()
    await asyncio.wait_for(task, 10)
    return out


@pytest.mark.parametrize("filler", [5_000, 20_000, 64_000])
async def test_the_rest_of_an_over_long_line_is_not_relayed_as_a_line(
    filler: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hostile review: asyncio's readline drops only what it buffered of an over-long line, so
    the rest arrived as the next "line": a value that ends a long line with a JSON object
    became an audit line of its own, chained like any other."""
    long_line = '{"event": "request", "path": "/' + "A" * filler + FORGED + "\n"
    data = (long_line + '{"event": "request", "seq": 2}\n').encode()
    out = await relayed(data, 4096, monkeypatch)
    assert out == ['{"event": "request", "seq": 2}']
    assert all("forged.test" not in line for line in out)


async def test_lines_under_the_limit_are_relayed_whole_and_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = [json.dumps({"seq": i, "path": "/x" * (i * 50)}) for i in range(1, 40)]
    out = await relayed(("\n".join(lines) + "\n").encode(), 4096, monkeypatch)
    assert out == lines


class _FailingSink:
    """A sink that cannot write a line naming "bad" (as a disk that is full for one write)."""

    def __init__(self) -> None:
        self.out: list[str] = []
        self.flushes = 0

    def line(self, line: str, flush: bool = True) -> None:
        if "bad" in line:
            raise TypeError("the sink could not write it")
        self.out.append(line)

    def flush(self) -> None:
        self.flushes += 1


async def test_a_line_the_sink_cannot_write_does_not_end_the_relay(monkeypatch: pytest.MonkeyPatch) -> None:
    """A relay that ended left the worker writing into a pipe no one reads: its flows stall. Nor
    may one bad line cost the others of its batch."""
    sink = _FailingSink()
    monkeypatch.setattr(audit, "_sink", sink)
    reader = asyncio.StreamReader()
    reader.feed_data(b'{"seq": 1}\n{"bad": 1}\n{"seq": 2}\n')
    reader.feed_eof()
    await asyncio.wait_for(workers._relay(lambda: reader.read(1000), 4242), 10)
    assert sink.out == ['{"seq": 1}', '{"seq": 2}']


@pytest.mark.parametrize("pieces", [1, 7, 333])
def test_the_splitter_gives_whole_lines_whatever_the_reads(pieces: int) -> None:
    lines = [json.dumps({"seq": i, "path": "/é" * i}).encode() for i in range(1, 60)]
    data = b"\n".join(lines) + b"\n" + b'{"seq": "last, unended"}'
    split = workers.LineSplitter(limit=4096)
    got: list[bytes] = []
    for k in range(0, len(data), pieces):
        got += split.feed(data[k : k + pieces])
    got += split.end()
    assert got == [*lines, b'{"seq": "last, unended"}']


def test_an_unended_line_over_the_limit_is_not_relayed_at_the_end() -> None:
    split = workers.LineSplitter(limit=100)
    assert split.feed(b'{"a": "' + b"x" * 200) == []
    assert split.end() == [] and split.dropped == 1


async def pipe_relay(tmp_path: Path, write: Callable[[int], Awaitable[None]], coalesce: float) -> list[int]:
    """Relay a real pipe into a real audit file; ``write(fd)`` writes the worker's side. Returns
    how many lines each batch held (each batch is one write_lines call)."""
    path = tmp_path / "audit.jsonl"
    audit.configure(path)
    batches: list[int] = []
    real = audit.write_lines

    def counting(lines: list[str]) -> None:
        batches.append(len(lines))
        real(lines)

    out, into = os.pipe()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(audit, "write_lines", counting)
        task = asyncio.create_task(workers._relay(workers.pipe_reader(out, coalesce), 4242))
        try:
            await write(into)
        finally:
            os.close(into)
        await asyncio.wait_for(task, 10)
    audit.configure(None)
    return batches


async def test_lines_that_come_while_the_relay_waits_go_out_in_one_batch_chained(tmp_path: Path) -> None:
    """Issue 19: woken once per line, the supervisor took ~90 µs of CPU per request. Lines that
    come within the relay's wait go out in one batch; every one is still chained and verifies."""

    async def write(fd: int) -> None:
        for i in range(1, 41):
            os.write(fd, json.dumps({"event": "request", "seq": i}).encode() + b"\n")
            await asyncio.sleep(0.002)  # a line at a time, as flows end: a reader without the wait
            if i % 10 == 0:  # would be woken for each (40 batches)
                await asyncio.sleep(0.6)  # far past the wait: the next ten are a batch of their own

    batches = await pipe_relay(tmp_path, write, 0.25)
    events = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [e["seq"] for e in events] == list(range(1, 41))
    assert chain.verify(read_lines(tmp_path / "audit.jsonl"), audit.PREV).broken is None
    assert sum(batches) == 40 and len(batches) <= 5  # about one per ten lines, not one per line


async def test_the_last_line_a_worker_wrote_before_exiting_is_relayed(tmp_path: Path) -> None:
    async def write(fd: int) -> None:
        os.write(fd, b'{"seq": 1}\n{"seq": 2}')  # the worker died before its newline

    await pipe_relay(tmp_path, write, 0.0)
    assert [json.loads(line)["seq"] for line in (tmp_path / "audit.jsonl").read_text().splitlines()] == [1, 2]


@pytest.mark.parametrize("cut", [1, 9, 17, 30])
def test_a_line_torn_by_a_worker_dying_mid_write_is_not_relayed_at_the_end(cut: int) -> None:
    """Review r-perf: a worker killed inside the write of a line (one over PIPE_BUF is not written
    atomically) left its start in the pipe; the relay wrote it to the audit file as a line of its
    own, which no reader parses. A last line without its newline is relayed only when it is
    a whole JSON object; a torn one is dropped and counted (the worker's seq shows the gap)."""
    whole = b'{"seq": 1}\n'
    torn = b'{"seq": 2, "path": "/a/long/path"}'[:cut]
    split = workers.LineSplitter(limit=4096)
    assert split.feed(whole + torn) == [b'{"seq": 1}']
    assert split.end() == [] and split.torn == 1
