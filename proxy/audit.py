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
                    what was asked; ``path`` as the sandbox sent it (before any substitution),
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

import itertools
import json
import logging
import logging.handlers
import os
import re
import socket
import sys
import threading
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import structlog

from proxy.core import paths
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

LOGGER_NAME = "surrogate.audit"


# A placeholder-shaped string in a name the sandbox chose (a host, a Host header quoted by a
# refusal), in any letter case (hosts are lower-cased) or with its "_" percent-encoded.
_PLACEHOLDER_LIKE = re.compile(r"(?i:surr)(?:_|%5[Ff])[A-Za-z0-9]{16,64}(?![A-Za-z0-9])")
_NAMED_FIELDS = (HOST, MESSAGE)


def hide_placeholders(fields: dict[str, Any]) -> None:
    """Replace, in place, every placeholder-shaped string in the event's ``host``, ``message``
    and ``forged`` fields by ``REDACTED`` (``path`` has :func:`redact_path`). The sandbox names
    hosts and headers, and refusals quote them: the audit holds no placeholder either way."""
    for key in _NAMED_FIELDS:
        value = fields.get(key)
        if isinstance(value, str) and "surr" in value.lower():
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
    a formatter and a handler per line: about a quarter of an audit event's CPU."""

    def __init__(self, path: Path | None, max_bytes: int, backups: int) -> None:
        self._lock = threading.Lock()
        self._file: logging.handlers.RotatingFileHandler | None = None
        if path is not None:
            self._file = logging.handlers.RotatingFileHandler(
                path, maxBytes=max_bytes, backupCount=backups if max_bytes else 0, encoding="utf-8"
            )

    def write(self, line: str) -> None:
        with self._lock:
            f = self._file
            if f is None:
                sys.stdout.write(line + "\n")
                sys.stdout.flush()
                return
            if f.stream is None:  # closed after a failed rollover: reopen, as logging would
                f.stream = f._open()
            if f.maxBytes > 0 and f.stream.tell() + len(line) + 1 >= f.maxBytes and f.stream.tell():
                f.doRollover()
            f.stream.write(line + "\n")
            f.stream.flush()

    # structlog calls the method named after the level
    msg = info = warning = error = write


_sink = _Sink(None, 0, 0)


def write_line(line: str) -> None:
    """Append an already rendered event (one JSON line without its newline) to the audit stream;
    ``surrogate run --workers N`` relays its workers' lines through this."""
    _sink.write(line)


def configure(
    path: Path | None = None, max_bytes: int = 0, backups: int = 5, node: str | None = None
) -> None:
    """Send audit events as JSON lines to the file ``path`` (default stdout), each one saying
    ``node`` (None: the host name, as ``surrogate run`` defaults it).

    ``max_bytes`` > 0 rotates the file when it would grow past that size, keeping ``backups``
    old files (``PATH.1`` newest), through the standard library's RotatingFileHandler. Every
    event carries ``seq``, a per-process sequence number from 1, so a consumer can see a gap.
    """
    global _sink
    _sink = sink = _Sink(path, max_bytes, backups)
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
        structlog.processors.JSONRenderer(serializer=_render),
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
    :func:`configure` gave structlog (sequence number, worker, time, JSON), to the sink.

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
    _sink.write(event)


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
