"""``surrogate run --workers N``: N proxy processes sharing the listening ports, one supervisor.

mitmproxy runs one event loop in one process; a Python proxy uses more cores only as more
processes. Measured in issue 7: two workers gave 1.66× one worker at c=64 on 2 cores.

How it is put together (decisions, and why):

- **Ports.** Every worker listens on the same ports with ``SO_REUSEPORT``; the kernel spreads new
  connections over them. mitmproxy's proxyserver binds nothing here: :class:`SharedListeners`
  lets ``asyncio.start_server(..., reuse_port=True)`` create each socket (a socket bound by hand
  and passed in lost TCP_NODELAY on accepted connections: 44 ms per request, measured) and hands
  every accepted stream to a mitmproxy server instance of the same mode (``regular`` or
  ``transparent``), exactly as proxyserver's own listener would. Before starting workers the
  supervisor binds each port once *without* ``SO_REUSEPORT``: a port in use is refused with a
  clear message instead of being silently shared with another program of the same user.
- **Store and control API.** Workers share the SQLite store (WAL). Only worker 0 serves the control
  API; every worker checks the store's ``data_version`` at the start of every request
  (proxy/store/registry.py), so a change acknowledged by the API is used by the very next request,
  whichever worker takes it. The supervisor creates the CA, the store and its key before any
  worker starts, so workers never race to create them.
- **Audit.** One coherent stream: each worker writes its JSON lines to a pipe (its stdout), the
  supervisor writes them, whole lines only, to stdout or ``--audit-file`` (in batches: what 5 ms
  of a worker's lines brought, one write each; see :func:`pipe_reader`), and is the only process
  that rotates that file (several processes rotating one file lose and duplicate lines). Each
  event names its worker's pid (``worker``); ``seq`` counts per worker.
- **Metrics.** Workers run prometheus-client in its multiprocess mode: each writes its values to
  files in ``<state dir>/metrics`` (emptied at start), and ``/metrics`` (worker 0's control API)
  sums every worker's counters and histograms; ``surrogate_open_connections`` is the sum over
  live workers.
- **Limits.** Connection counts, rate buckets and hook-process counts live in one table every
  worker maps (``<state dir>/limits.shm``, :mod:`proxy.store.counters`), which the supervisor creates
  empty before any worker starts; budgets live in the store. A worker that exits has its column
  of that table zeroed by the supervisor, so a ``kill -9`` leaks no slot.
  The supervisor is a child subreaper (``PR_SET_CHILD_SUBREAPER``): the hook commands of a worker
  killed with ``kill -9`` (in their own sessions, out of reach of any signal to the node) are
  re-parented to it, and it kills their process groups, so no command outlives its slot.
- **Signals.** SIGTERM or SIGINT to the supervisor stops every worker (SIGTERM, then SIGKILL
  after ``STOP_SECONDS``). SIGHUP is passed to every worker (each reloads the rules; each also
  watches the rules file itself, so a reload writes one ``reload`` event per worker). A worker
  dies with the supervisor (``PR_SET_PDEATHSIG``).
- **A worker that dies** is reported on stderr with its exit status, and the supervisor stops the
  others and exits 1: a crashing worker is a bug to see, and the service manager (systemd,
  Kubernetes) that restarts surrogate also applies its back-off, which a silent in-process
  restart loop would hide.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from proxy import audit
from proxy.metrics import MULTIPROC_ENV

STOP_SECONDS = 10.0
COALESCE_SECONDS = 0.005  # the relay's wait for more audit lines after the first (pipe_reader)
_LINE_LIMIT = 16 * 1024 * 1024  # the longest audit line the supervisor relays whole
log = logging.getLogger("surrogate")


def default_count() -> int:
    """One worker per core this process may run on."""
    count = os.process_cpu_count() if hasattr(os, "process_cpu_count") else os.cpu_count()
    return max(1, count or 1)


class SharedListeners:
    """Addon: accept on each ``mode`` spec's address with SO_REUSEPORT and hand every connection
    to a mitmproxy server instance of that mode (see the module doc). Added after the chain, so
    it listens once every other addon's ``running`` hook has run."""

    def __init__(self, modes: Sequence[str]) -> None:
        self.modes = list(modes)
        self.servers: list[asyncio.Server] = []

    async def running(self) -> None:
        from mitmproxy import ctx
        from mitmproxy.proxy import mode_specs
        from mitmproxy.proxy.mode_servers import ServerInstance

        manager = ctx.master.addons.get("proxyserver")
        for spec in self.modes:
            mode = mode_specs.ProxyMode.parse(spec)
            instance: Any = ServerInstance.make(mode, manager)
            host = mode.listen_host(ctx.options.listen_host)
            port = mode.listen_port(ctx.options.listen_port)
            try:
                server = await asyncio.start_server(instance.handle_stream, host, port, reuse_port=True)
            except OSError as e:
                # mitmproxy's errorcheck turns an error logged during startup into exit status 1.
                log.error("cannot listen on %s:%s: %s", host, port, e.strerror or e)
                return
            self.servers.append(server)

    def done(self) -> None:
        for server in self.servers:
            server.close()
        self.servers.clear()


def check_free(addresses: Sequence[tuple[str, int]]) -> None:
    """Raise OSError naming the first ``(host, port)`` another socket already listens on.

    Bound without SO_REUSEPORT, as a program that does not share ports would: then neither can
    a second surrogate join these workers' ports by mistake, nor they another's."""
    for host, port in addresses:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's listener does
            try:
                s.bind((host, port))
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise OSError(f"{host}:{port} is already in use by another program") from None
                raise OSError(f"cannot listen on {host}:{port}: {e.strerror}") from None


def check_socket_free(path: Path | None) -> None:
    """Raise OSError when a process answers on the control socket ``path``: another surrogate
    (``run`` or ``control``) serves this state dir. Starting anyway would replace its socket file
    (its control API unreachable once this one stops) and empty the node's shared limits table.
    A socket file that nobody answers on is a stopped proxy's, replaced when the socket is bound."""
    if path is None or not path.is_socket():
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        try:
            s.connect(str(path))
        except OSError:
            return
    raise OSError(
        f"the control socket {path} answers: another surrogate serves this state dir; stop it, or "
        "give this one a --state-dir of its own (one proxy per state dir: its store, limits and socket)"
    )


def share_metrics(folder: Path) -> None:
    """Have the workers started from now on count into ``folder`` (prometheus-client's
    multiprocess mode, through the environment they inherit), emptied of a previous run's files."""
    folder.mkdir(mode=0o700, exist_ok=True)
    for stale in folder.glob("*.db"):
        stale.unlink()
    os.environ[MULTIPROC_ENV] = str(folder)


def become_worker() -> None:
    """Set up this process as a worker: the kernel sends it SIGTERM when its supervisor dies
    (Linux; elsewhere a no-op), so a killed supervisor leaves no worker serving on its own; and a
    SIGHUP before the engine installs its reload handler is ignored instead of killing it."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() == 1:  # the supervisor died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _become_subreaper() -> None:
    """Have orphaned descendants (a dead worker's hook commands) re-parented to this process
    rather than to init, so that :func:`kill_orphans` can find them (Linux; elsewhere a no-op)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_child_subreaper = 36
        libc.prctl(pr_set_child_subreaper, 1)


def kill_orphans(workers: Sequence[int]) -> int:
    """Kill the process group of every child of this process that is not one of ``workers`` and
    reap it: as a child subreaper, those are hook commands (with their children) of a worker
    that died, which nothing else would stop or count any more. Returns how many were found."""
    children: set[int] = set()
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{os.getpid()}/task").iterdir():
            with contextlib.suppress(OSError):
                children |= {int(p) for p in (task / "children").read_text().split()}
    orphans = children - set(workers)
    for pid in orphans:
        with contextlib.suppress(OSError):
            group = os.getpgid(pid)
            if group != os.getpgrp():  # hooks run in their own sessions; never signal our own group
                os.killpg(group, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)  # SIGKILL ends it at once; reaped, it is no zombie of ours
    return len(orphans)


async def supervise(command: Sequence[str], count: int, on_exit: Callable[[int], None] | None = None) -> int:
    """Run ``command + ["--worker-index", i]`` for i in 0..count-1 until SIGTERM/SIGINT or until a
    worker exits; relay each worker's stdout (audit lines) to the audit sink configured in this
    process. ``on_exit(i)`` is called for each worker found dead (its node-wide counts are given
    back: proxy/store/counters.py). Returns the exit status for the supervisor: 0 after a requested
    stop, 1 when a worker died."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    procs: list[asyncio.subprocess.Process] = []
    _become_subreaper()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, _signal_all, procs, signal.SIGHUP)
    relays = []
    for i in range(count):
        out, into = os.pipe()  # the worker's stdout, read by pipe_reader (not asyncio's per-read wake-ups)
        try:
            proc = await asyncio.create_subprocess_exec(*command, "--worker-index", str(i), stdout=into)
        except BaseException:
            os.close(out)
            raise
        finally:
            os.close(into)
        procs.append(proc)
        relays.append(asyncio.create_task(_relay(pipe_reader(out), proc.pid)))
    exits = {asyncio.create_task(p.wait()): i for i, p in enumerate(procs)}
    stopping = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([stopping, *exits], return_when=asyncio.FIRST_COMPLETED)
    status = 0
    await asyncio.sleep(0.1)  # Ctrl-C reaches the workers too: their exit may beat our own SIGINT
    if not stop.is_set():
        kill_orphans([p.pid for p in procs])  # the dead worker's hook commands
        for task in done:
            i = exits[task]
            if on_exit is not None:
                on_exit(i)
            print(
                f"surrogate: worker {i} (pid {procs[i].pid}) exited with status {procs[i].returncode}; "
                "stopping the other workers",
                file=sys.stderr,
                flush=True,
            )
        status = 1
    stopping.cancel()
    await _stop_all(procs)
    kill_orphans([p.pid for p in procs])  # of a worker that had to be killed (STOP_SECONDS)
    await asyncio.gather(*relays, return_exceptions=True)
    return status


def _signal_all(procs: Sequence[asyncio.subprocess.Process], sig: int) -> None:
    for p in procs:
        if p.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(sig)


async def _stop_all(procs: Sequence[asyncio.subprocess.Process]) -> None:
    _signal_all(procs, signal.SIGTERM)
    try:
        await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), STOP_SECONDS)
    except TimeoutError:
        _signal_all(procs, signal.SIGKILL)
        await asyncio.gather(*(p.wait() for p in procs))


class LineSplitter:
    """Cut a byte stream into whole lines (without their ``\\n``), dropping whole every line
    longer than ``limit``: none of its bytes become a line of their own (a value that ended a
    long line with a JSON object would have become an audit line)."""

    def __init__(self, limit: int = _LINE_LIMIT) -> None:
        self.limit = limit
        self._buf = bytearray()  # the start of a line not ended yet
        self._dropping = False  # inside a line over the limit: discard through its newline
        self.dropped = 0
        self.torn = 0  # a last line without its newline that is no whole JSON object (end)

    def feed(self, chunk: bytes) -> list[bytes]:
        """The lines ``chunk`` ends, in order."""
        if self._dropping:
            nl = chunk.find(b"\n")
            if nl < 0:
                return []
            chunk, self._dropping = chunk[nl + 1 :], False
        self._buf += chunk
        end = self._buf.rfind(b"\n")
        lines: list[bytes] = []
        if end >= 0:
            lines = bytes(self._buf[:end]).split(b"\n")
            del self._buf[: end + 1]
        kept = [line for line in lines if len(line) <= self.limit]
        self.dropped += len(lines) - len(kept)
        if len(self._buf) > self.limit:  # no newline yet within the limit: discard, go on
            self._buf.clear()
            self._dropping = True
            self.dropped += 1
        return kept

    def end(self) -> list[bytes]:
        """At the end of the stream: a last line without its newline, if whole: a JSON object
        (review r-perf: a worker killed inside the write of a line over PIPE_BUF leaves its
        start; relayed, it became an audit line no reader parses). A torn one counts in ``torn``."""
        rest, self._buf = bytes(self._buf), bytearray()
        if not rest or self._dropping:
            return []
        try:
            whole = isinstance(json.loads(rest), dict)
        except ValueError:
            whole = False
        if not whole:
            self.torn += 1
            return []
        return [rest]


async def _relay(read: Callable[[], Awaitable[bytes]], pid: int, limit: int = _LINE_LIMIT) -> None:
    """Copy a worker's audit lines to the sink, one whole line per record (never interleaved):
    every line one ``read()`` brought is written with one flush (:func:`proxy.audit.write_lines`).
    ``read`` returns b"" at the end of the stream."""
    lines = LineSplitter(limit)
    while True:
        chunk = await read()
        got = lines.feed(chunk) if chunk else lines.end()
        if lines.dropped:
            log.error("worker %s wrote an audit line over %d bytes; dropped", pid, limit)
            lines.dropped = 0
        if lines.torn:
            log.error("worker %s ended inside an audit line; dropped", pid)
            lines.torn = 0
        if got:
            try:
                audit.write_lines([line.decode("utf-8", "replace") for line in got])
            except Exception as e:  # the relay must go on: a worker whose pipe fills stalls its flows
                log.error("worker %s: audit lines could not be written: %s", pid, type(e).__name__)
        if not chunk:
            return


def pipe_reader(fd: int, coalesce: float | None = None) -> Callable[[], Awaitable[bytes]]:
    """A ``read()`` for :func:`_relay` of the non-blocking pipe ``fd`` (closed at its end): waits
    until the pipe is readable, then ``coalesce`` seconds more, then returns everything in it.

    Decided (issue 19): the supervisor shares the cores with the workers, and woken once per
    audit line (an epoll wake-up, a read, a write and a flush per request) it took 70-90 µs of
    CPU per request at c=64 (bench/workers.py, a busy shared machine), and 39-42 µs per line
    with two writers of 1,500 lines/s of 1 KB each and nothing else. Waiting ``coalesce`` (5 ms)
    after the pipe becomes readable, with the pipe out of the event loop meanwhile, turns that
    into one wake-up, one read and one write per batch (measured so: 24-31 µs per line; reading
    at once without the wait cost more than before, 49-56 µs, for the reader added and removed
    per read). An audit line reaches the file at most that much later. The pipe (64 KiB) does
    not fill in 5 ms: a worker writes well under 1 MB/s of lines."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    wait = COALESCE_SECONDS if coalesce is None else coalesce

    async def read() -> bytes:
        ready = loop.create_future()
        loop.add_reader(fd, ready.set_result, None)
        try:
            await ready
        finally:
            loop.remove_reader(fd)
        if wait > 0:
            await asyncio.sleep(wait)
        parts: list[bytes] = []
        while True:
            try:
                part = os.read(fd, 1 << 16)
            except BlockingIOError:
                break
            if not part:  # the worker closed its end
                if parts:
                    break  # hand these on; the next read finds the end at once
                os.close(fd)
                return b""
            parts.append(part)
        return b"".join(parts)

    return read


def worker_command(argv: Sequence[str]) -> list[str]:
    """The command line of one worker: this same ``surrogate run`` (the supervisor appends
    ``--worker-index I``)."""
    return [sys.executable, "-m", "proxy", *argv]
