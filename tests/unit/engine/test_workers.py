"""proxy.engine.workers' relay of a worker's audit lines: one whole line per record, and a line
longer than the relay's limit is dropped whole (none of its bytes become a line of their own)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest

from proxy import audit
from proxy.engine import workers

FORGED = '{"event": "request", "claim": "someone-else", "decision": "allow", "host": "forged.test"}'


async def relayed(data: bytes, limit: int, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    out: list[str] = []
    monkeypatch.setattr(audit, "write_line", out.append)
    reader = asyncio.StreamReader(limit=limit)
    proc: Any = SimpleNamespace(stdout=reader, pid=4242)
    task = asyncio.create_task(workers._relay(proc))
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


async def test_a_line_the_sink_cannot_write_does_not_end_the_relay(monkeypatch: pytest.MonkeyPatch) -> None:
    """A relay that ended left the worker writing into a pipe no one reads: its flows stall."""
    out: list[str] = []

    def write(line: str) -> None:
        if "bad" in line:
            raise TypeError("the sink could not write it")
        out.append(line)

    monkeypatch.setattr(audit, "write_line", write)
    reader = asyncio.StreamReader(limit=4096)
    proc: Any = SimpleNamespace(stdout=reader, pid=4242)
    reader.feed_data(b'{"bad": 1}\n{"seq": 2}\n')
    reader.feed_eof()
    await asyncio.wait_for(workers._relay(proc), 10)
    assert out == ['{"seq": 2}']
