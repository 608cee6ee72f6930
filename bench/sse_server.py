"""A tiny TLS server-sent-events upstream for the benchmark (run as its own process).

``GET /sse`` answers ``text/event-stream`` (chunked, keep-alive) and writes ``data: <n>\\n\\n``
at t0, t0 + period, t0 + 2·period, … (on an absolute schedule, so timer drift does not
accumulate), ``--events`` times, then ends the stream. Anything else gets 404.

    python bench/sse_server.py --port P --cert CHAIN.pem --key KEY.pem [--events 20] [--period 0.1]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import ssl

_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)
_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"


async def _events(writer: asyncio.StreamWriter, events: int, period: float) -> None:
    loop = asyncio.get_running_loop()
    writer.write(_HEAD)
    t0 = loop.time()
    for n in range(events):
        await asyncio.sleep(max(0.0, t0 + n * period - loop.time()))
        data = b"data: %d\n\n" % n
        writer.write(b"%x\r\n%s\r\n" % (len(data), data))
        await writer.drain()
    writer.write(b"0\r\n\r\n")
    await writer.drain()


async def _serve(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, events: int, period: float
) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:  # events are tiny: Nagle would hold them back
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            target = head.split(b" ", 2)[1] if head.count(b" ") >= 2 else b""
            if target == b"/sse":
                await _events(writer, events, period)
            else:
                writer.write(_NOT_FOUND)
                await writer.drain()
    writer.close()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--events", type=int, default=20)
    ap.add_argument("--period", type=float, default=0.1)
    args = ap.parse_args()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(args.cert, args.key)
    ctx.set_alpn_protocols(["http/1.1"])
    server = await asyncio.start_server(
        lambda r, w: _serve(r, w, args.events, args.period), "127.0.0.1", args.port, ssl=ctx
    )
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main())
