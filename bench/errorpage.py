"""What addons/errorpage.py's wrappers of mitmproxy's HttpStream cost (review r-refusals): one
request and response driven through ``HttpStream.handle_event`` in process (hooks answered at
once, no sockets), with mitmproxy's own methods and with the wrapped ones, interleaved, in CPU
time (the machine is shared); prints the medians and the ratio of the fastest rounds.
``.venv/bin/python bench/errorpage.py``."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mitmproxy import connection, options
from mitmproxy.addons.proxyserver import Proxyserver
from mitmproxy.proxy import context, events
from mitmproxy.proxy.layers import http as layers
from mitmproxy.proxy.layers.http import _events as ev
from mitmproxy.test import tutils

from addons import errorpage

WRAPPED = ("handle_event", "check_invalid", "check_body_size")
OPTS = options.Options()
Proxyserver().load(OPTS)
CLIENT = connection.Client(peername=("127.0.0.1", 1), sockname=("127.0.0.1", 2), timestamp_start=0)
SERVER = connection.Server(address=("api.test", 443))
SERVER.state = connection.ConnectionState.OPEN


def one_cycle() -> int:
    """A GET with a 100-byte response through one HttpStream; returns the commands it yielded."""
    ctx = context.Context(CLIENT, OPTS)
    ctx.server = SERVER
    parent = layers.HttpLayer(ctx, layers.HTTPMode.regular)
    stream = layers.HttpStream(ctx.fork(), 1)
    stream.context.layers.insert(0, parent)
    count = 0
    for event in (
        events.Start(),
        ev.RequestHeaders(1, tutils.treq(host="api.test", port=443, authority=b""), end_stream=True),
        ev.RequestEndOfMessage(1),
        ev.ResponseHeaders(1, tutils.tresp(content=b"x" * 100), end_stream=False),
        ev.ResponseData(1, b"x" * 100),
        ev.ResponseEndOfMessage(1),
    ):
        pending: list[Any] = [event]
        while pending:
            for command in stream.handle_event(pending.pop(0)):
                count += 1
                if isinstance(command, layers.GetHttpConnection):
                    pending.append(layers.GetHttpConnectionCompleted(command, (SERVER, None)))
                elif command.blocking:
                    pending.append(events.HookCompleted(command))
    return count


def _round(n: int) -> float:
    start = time.process_time()
    for _ in range(n):
        one_cycle()
    return (time.process_time() - start) / n * 1e6


def main(rounds: int = 20, n: int = 1500) -> None:
    original = {name: getattr(layers.HttpStream, name) for name in WRAPPED}
    errorpage.install()
    wrapped = {name: getattr(layers.HttpStream, name) for name in WRAPPED}
    assert all(wrapped[name] is not original[name] for name in WRAPPED)
    print(f"commands per cycle: {one_cycle()}")
    _round(n)  # warm up
    times: dict[str, list[float]] = {"mitmproxy": [], "wrapped": []}
    for _ in range(rounds):
        for label, methods in (("mitmproxy", original), ("wrapped", wrapped)):
            for name, method in methods.items():
                setattr(layers.HttpStream, name, method)
            times[label].append(_round(n))
    base, ours = times["mitmproxy"], times["wrapped"]
    print(
        f"µs per request+response: mitmproxy {statistics.median(base):.1f} (min {min(base):.1f}), "
        f"wrapped {statistics.median(ours):.1f} (min {min(ours):.1f}); "
        f"ratio of medians {statistics.median(ours) / statistics.median(base):.3f}, "
        f"of minima {min(ours) / min(base):.3f}"
    )


if __name__ == "__main__":
    main()
