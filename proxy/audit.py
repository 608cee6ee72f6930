"""The audit event: one JSON line per request (or per refused or opaque CONNECT).

Field names are defined here and nowhere else; ``rules/README.md`` documents them. An event
never holds a secret value: credentials appear by name and version only, query values are
redacted (keys kept), and header values are not logged at all.

Fields:
    time            ISO 8601 UTC timestamp of the event
    seq             per-process sequence number, from 1 (every event kind): a gap means a lost line
    worker          pid of the process that wrote it (``--workers N``: (worker, seq) shows a gap)
    node            the node that wrote it (``--node``, default the host name; proxy.core.node):
                    in a fleet, (node, worker, seq) names one line
    event           "request" (an HTTP request) or "tunnel" (a CONNECT refused or opaque)
    request_id      the id also returned to the sandbox in X-Surrogate-Request-Id
    claim, pool     who sent it (null when identification failed)
    client          client address "ip:port"
    method, scheme, host, port, path
                    what was asked (``method`` and ``host`` with every placeholder-shaped string
                    REDACTED); ``path`` as the sandbox sent it (before any substitution),
                    with query values, the fragment, and every query key, path segment or
                    ``;param`` holding a placeholder replaced by REDACTED
    status          HTTP status sent to the client (null when the flow errored before one)
    decision        allow | deny | violation | error
    reason          reason code (see proxy.core.decide.Reason)
    rule            the egress rule that decided, e.g. "demo.egress[0] api.github.com", or null
    message         the human sentence of a refusal or error, null when allowed (like ``host``
                    and ``forged``, with every placeholder-shaped string REDACTED)
    would_deny      report mode: the reason code the rules would have refused with, else null
    credentials     [{"name", "version"}] swapped or injected into this request
    carried         names of credentials whose placeholder passed unchanged
    forged          where a placeholder with surrogate's checksum that the claim does not hold
                    was found ("header NAME", "request target"); the string itself is not logged
    carried_on      [{"name", "surface"}] the same, with the surface each was found on
    violation_surface
                    the surface of the placeholder that refused the request, else null
    bytes_out       request body bytes sent upstream
    bytes_in        response body bytes received from upstream
    duration_ms     from the first request byte to the end of the response

Every event kind also carries:
    prev            hex SHA-256 of the previous line of the same writer (the exact bytes, without
                    the newline), or null for the first line of a fresh chain
                    (:mod:`proxy.core.chain`; ``surrogate audit verify`` checks it)

Control-plane events (``"event": "control"``), one per mutation through the control API:
    who             "socket" (the owner of the 0600 Unix socket) or "token:<name>" (TCP)
    action          claim.create | claim.delete | claim.rotate_token | credential.put |
                    credential.patch | credential.delete
    claim           the claim id
    credential      the credential name, or null for claim actions
    old_version, new_version
                    versions before and after (null where there is none); never a value

Rules reloads (``"event": "reload"``), one per attempt:
    outcome         applied | rejected (the previous rules stay in force)
    file            the rules file
    trigger         sighup | file_change
    problems        the same messages as ``surrogate rules check`` ([] when applied)
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import logging
import logging.handlers
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, MutableMapping
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import structlog

from proxy.core import chain as hashchain
from proxy.core import ocsf, paths, placeholders
from proxy.core.paths import redact

TIME = "time"
SEQ = "seq"
WORKER = "worker"
NODE = "node"
EVENT = "event"
REQUEST_ID = "request_id"
CLAIM = "claim"
POOL = "pool"
CLIENT = "client"
METHOD = "method"
SCHEME = "scheme"
HOST = "host"
PORT = "port"
PATH = "path"
STATUS = "status"
DECISION = "decision"
REASON = "reason"
RULE = "rule"
MESSAGE = "message"
CREDENTIALS = "credentials"
WOULD_DENY = "would_deny"
CARRIED = "carried"
FORGED = "forged"
CARRIED_ON = "carried_on"
VIOLATION_SURFACE = "violation_surface"
BYTES_OUT = "bytes_out"
BYTES_IN = "bytes_in"
DURATION_MS = "duration_ms"
WHO = "who"
ACTION = "action"
CREDENTIAL = "credential"
OLD_VERSION = "old_version"
NEW_VERSION = "new_version"
OUTCOME = "outcome"
FILE = "file"
TRIGGER = "trigger"
PROBLEMS = "problems"
PREV = "prev"

LOGGER_NAME = "surrogate.audit"


# A placeholder-shaped string in a name the sandbox chose (a host, a Host header quoted by a
# refusal, a method), in any letter case (hosts are lower-cased) or with its "_" percent-encoded.
# The whole run of letters and digits goes: a placeholder with more of them after it is still
# in the text (the scanner's bounded pattern would not see it, so neither did this one).
_PLACEHOLDER_LIKE = placeholders.LIKE  # surr_ and every template shape (the one scanner)
_NAMED_FIELDS = (HOST, MESSAGE, METHOD)  # the method too: any token, a sandbox's choice


def hide_placeholders(fields: dict[str, Any]) -> None:
    """Replace, in place, every placeholder-shaped string in the event's ``host``, ``message``,
    ``method`` and ``forged`` fields by ``REDACTED`` (``path`` has :func:`redact_path`). The sandbox names
    hosts and headers, and refusals quote them: the audit holds no placeholder either way."""
    for key in _NAMED_FIELDS:
        value = fields.get(key)
        if isinstance(value, str) and any(h in value.lower() for h in placeholders.LIKE_HINTS):
            fields[key] = _PLACEHOLDER_LIKE.sub(paths.REDACTED, value)
    forged = fields.get(FORGED)
    if forged:
        fields[FORGED] = [_PLACEHOLDER_LIKE.sub(paths.REDACTED, str(f)) for f in forged]


def redact_path(path: str) -> str:
    """``/a?x=1&y&z=2`` → ``/a?x=REDACTED&y&z=REDACTED``: values and the fragment hidden, and
    every key, path segment or ``;param`` that holds a placeholder in any spelling
    (:func:`proxy.core.paths.redact`)."""
    return redact(path)


class _Sink:
    """The audit stream: one ``write`` + ``flush`` per JSON line, under a lock, to stdout or to a
    file that the standard library's RotatingFileHandler rotates (its ``doRollover``, with the
    same size rule as its own ``shouldRollover``). Going through ``logging`` cost a LogRecord,
    a formatter and a handler per line: about a quarter of an audit event's CPU.

    With ``chain`` each line gets ``prev`` (:mod:`proxy.core.chain`): the line is rendered once,
    under the lock, and its bytes hashed for the next. A file that already has lines is
    continued from its last line (an unfinished last line is ended first, and stays in the
    chain for ``surrogate audit verify`` to report). ``ocsf`` is a second file that gets each
    request and tunnel event as OCSF HTTP Activity (:mod:`proxy.core.ocsf`)."""

    def __init__(
        self, path: Path | None, max_bytes: int, backups: int, chain: bool = True, ocsf: Path | None = None
    ) -> None:
        self._lock = threading.Lock()
        self._file: logging.handlers.RotatingFileHandler | None = None
        self._chain = chain
        self._prev: str | None = None
        self._ocsf: logging.handlers.RotatingFileHandler | None = None
        if path is not None:
            self._file = _rotating(path, max_bytes, backups)
            if chain:
                self._prev = _follow(path, self._file)
        if ocsf is not None:
            self._ocsf = _rotating(ocsf, max_bytes, backups)

    def event(self, event: dict[str, Any]) -> None:
        """Render ``event`` (chained) and write it."""
        with self._lock:
            if self._chain:
                event[PREV] = self._prev
            self._put(self._file, _render(event))
            if self._ocsf is not None:
                self._put_ocsf(event)

    def line(self, line: str, flush: bool = True) -> None:
        """Write an event another process rendered (a worker's), chained by splicing ``prev`` in;
        ``flush=False`` leaves it in the stream's buffer for :meth:`flush` (a batch of lines)."""
        with self._lock:
            if self._chain:
                spliced = hashchain.splice(line, PREV, self._prev)
                if spliced is None:
                    logging.getLogger("surrogate").error("an audit line that is not a JSON object: dropped")
                    return
                line = spliced
            self._put(self._file, line, flush)
            if self._ocsf is not None:
                try:
                    self._put_ocsf(json.loads(line), flush)
                except (ValueError, RecursionError):  # never stop the relay (a worker's pipe would fill)
                    logging.getLogger("surrogate").error("a relayed audit line is not JSON: no OCSF event")

    def _put(self, f: logging.handlers.RotatingFileHandler | None, line: str, flush: bool = True) -> None:
        try:
            data = line.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (mitmproxy's surrogateescape of a path byte)
            data = line.encode("utf-8", "backslashreplace")  # valid JSON: the \udcXX escape
            line = data.decode("utf-8")
        if self._chain and f is self._file:
            self._prev = hashchain.line_hash(data)
        if f is None:
            sys.stdout.write(line + "\n")
            if flush:
                sys.stdout.flush()
            return
        if f.stream is None:  # closed after a failed rollover: reopen, as logging would
            f.stream = f._open()
        if f.maxBytes > 0 and f.stream.tell() + len(line) + 1 >= f.maxBytes and f.stream.tell():
            f.doRollover()
            _claim(f)
        f.stream.write(line + "\n")
        if flush:
            f.stream.flush()

    def flush(self) -> None:
        """Hand every buffered line to the kernel (after a batch of ``line(..., flush=False)``)."""
        with self._lock:
            for f in (self._file, self._ocsf):
                if f is not None and f.stream is not None:
                    f.stream.flush()
            if self._file is None:
                sys.stdout.flush()

    def _put_ocsf(self, event: Any, flush: bool = True) -> None:
        try:
            mapped = (
                ocsf.http_activity(event, _epoch_ms(event.get(TIME))) if isinstance(event, dict) else None
            )
        except (TypeError, ValueError, AttributeError):  # a relayed line's fields of another type
            logging.getLogger("surrogate").error("an audit line's fields do not map to OCSF: no OCSF event")
            return  # (the native line is written; the relay must never stop: a worker's pipe would fill)
        if mapped is not None:
            self._put(self._ocsf, _render(mapped), flush)

    def close(self) -> None:
        with self._lock:
            for f in (self._file, self._ocsf):
                if f is not None:
                    f.close()

    def _log(self, **event: Any) -> None:
        self.event(event)

    # structlog calls the method named after the level, with the processed event as keywords
    msg = info = warning = error = _log


def _rotating(path: Path, max_bytes: int, backups: int) -> logging.handlers.RotatingFileHandler:
    f = logging.handlers.RotatingFileHandler(
        path, maxBytes=max_bytes, backupCount=backups if max_bytes else 0, encoding="utf-8"
    )
    if not _claim(f):
        f.close()
        raise OSError(
            f"audit file {path} is being written by another process: give each process its own file "
            "(one writer per file keeps its hash chain whole, and only the writer may rotate it)"
        )
    return f


def _claim(f: logging.handlers.RotatingFileHandler) -> bool:
    """Take the exclusive advisory lock (flock) on ``f``'s open file: False when another open
    file holds it. Released when the file is closed (a rollover, an exit, even ``kill -9``)."""
    if f.stream is None:
        return True
    try:
        fcntl.flock(f.stream.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _follow(path: Path, f: logging.handlers.RotatingFileHandler) -> str | None:
    """The hash of ``path``'s last line (None for an empty file), after ending an unfinished
    last line with a newline so that the next line starts on its own."""
    with open(path, "rb") as r:
        end = r.seek(0, os.SEEK_END)
        tail = b""
        while end > 0 and len(tail) <= _LONGEST_LINE:
            start = max(0, end - 65536)
            r.seek(start)
            tail = r.read(end - start) + tail
            end = start
            if b"\n" in tail.rstrip(b"\n"):
                break
    if not tail:
        return None
    complete = tail.endswith(b"\n")
    body = tail[:-1] if complete else tail
    if not complete and f.stream is not None:
        f.stream.write("\n")
        f.stream.flush()
    return hashchain.line_hash(body[body.rfind(b"\n") + 1 :])


_LONGEST_LINE = 16 * 1024 * 1024


def _epoch_ms(stamp: Any) -> int:
    """Milliseconds since the epoch of an event's ``time`` (ISO 8601, UTC); now when it has none."""
    if isinstance(stamp, str):
        with contextlib.suppress(ValueError):
            return int(datetime.fromisoformat(stamp).timestamp() * 1000)
    return int(time.time() * 1000)


_sink = _Sink(None, 0, 0)
_listeners: list[Callable[[dict[str, Any]], None]] = []


def write_line(line: str) -> None:
    """Append an already rendered event (one JSON line without its newline) to the audit stream,
    chained; ``surrogate run --workers N`` relays its workers' lines through this."""
    _sink.line(line)


def write_lines(lines: Iterable[str]) -> None:
    """:func:`write_line` for each of ``lines`` in order, then one flush: the supervisor's relay
    hands on every whole line one read of a worker's pipe brought (one write syscall, not one
    per line; each line is still chained and rotated on its own). A line the sink cannot write
    is logged and skipped, so the others are still written."""
    try:
        for line in lines:
            try:
                _sink.line(line, flush=False)
            except Exception as e:  # the relay must go on: a worker whose pipe fills stalls its flows
                why = type(e).__name__
                logging.getLogger("surrogate").error("an audit line could not be written: %s", why)
    finally:
        _sink.flush()


def subscribe(listener: Callable[[dict[str, Any]], None]) -> None:
    """Have ``listener`` called with every request and tunnel event :func:`emit` wrote (the
    dict as written: redacted, with ``seq``, ``time``); OpenTelemetry spans are made so
    (proxy/engine/traces.py). A listener that raises is logged, never fails the flow."""
    _listeners.append(listener)


def unsubscribe(listener: Callable[[dict[str, Any]], None]) -> None:
    """Stop calling ``listener`` (a no-op when it is not subscribed)."""
    with contextlib.suppress(ValueError):
        _listeners.remove(listener)


def configure(
    path: Path | None = None,
    max_bytes: int = 0,
    backups: int = 5,
    *,
    node: str | None = None,
    chain: bool = True,
    ocsf: Path | None = None,
) -> None:
    """Send audit events as JSON lines to the file ``path`` (default stdout), each one saying
    ``node`` (None: the host name, as ``surrogate run`` defaults it).

    ``max_bytes`` > 0 rotates the file when it would grow past that size, keeping ``backups``
    old files (``PATH.1`` newest), through the standard library's RotatingFileHandler. Every
    event carries ``seq``, a per-process sequence number from 1, so a consumer can see a gap,
    and (``chain``, the default) ``prev``, the hash of the line before it. A worker, whose
    lines its supervisor writes and chains, passes ``chain=False``. ``ocsf``: also write
    request and tunnel events as OCSF to that file, rotated the same way.
    """
    global _sink
    _sink.close()  # a sink configured before (tests; a CLI that configures twice)
    _sink = sink = _Sink(path, max_bytes, backups, chain, ocsf)
    counter = itertools.count(1)
    pid = os.getpid()
    name = node if node is not None else socket.gethostname()

    def sequence(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        event[SEQ] = next(counter)
        event[WORKER] = pid
        event[NODE] = name
        return event

    global _chain
    _chain = (
        sequence,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key=TIME),
    )
    structlog.configure(
        processors=list(_chain),
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=lambda *_: sink,
        cache_logger_on_first_use=False,
    )


_chain: tuple[Any, ...] = ()


def emit(kind: str, fields: dict[str, Any]) -> None:
    """Write one audit event now: ``fields`` plus ``event`` = ``kind``, through the processors
    :func:`configure` gave structlog (sequence number, worker, time), to the sink, which adds
    ``prev`` and renders the line once; then to each :func:`subscribe` listener.

    The line is the one ``logger().info(kind, **fields)`` writes; the per-request path calls
    the processors itself, which skips the bound logger's per-call context copy and dispatch
    (about a third of an event's CPU, measured in issue 7). ``fields`` is consumed.
    """
    if not _chain:
        configure()
    hide_placeholders(fields)
    fields[EVENT] = kind
    event: Any = fields
    for processor in _chain:
        event = processor(None, "info", event)
    _sink.event(event)
    for listener in _listeners:
        try:
            listener(event)
        except Exception as e:  # a trace exporter's failure is not the flow's
            logging.getLogger("surrogate").error("audit listener failed: %s", type(e).__name__)


def _safe(value: Any) -> str:
    return quote(str(value), safe=" /:.,-_")


# One encoder for every line: json.dumps with options builds a new one per call (~4 µs of ~11).
_ENCODER = json.JSONEncoder(ensure_ascii=False, default=_safe)


def _render(event: Any, default: Any = None) -> str:
    """structlog's JSONRenderer serializer: ``default`` (its own fallback) is unused, ours is
    built into the encoder."""
    return _ENCODER.encode(event)


def logger() -> Any:
    """The audit logger, as configured now (hot paths bind it once: ``logger().bind()``)."""
    return structlog.get_logger(LOGGER_NAME)
