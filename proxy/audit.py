"""The audit event: one JSON line per request (or per refused or opaque CONNECT).

Field names are defined here and nowhere else; ``rules/README.md`` documents them. An event
never holds a secret value: credentials appear by name and version only, query values are
redacted (keys kept), and header values are not logged at all.

Fields:
    time            ISO 8601 UTC timestamp of the event
    seq             per-process sequence number, from 1 (every event kind): a gap means a lost line
    event           "request" (an HTTP request) or "tunnel" (a CONNECT refused or opaque)
    request_id      the id also returned to the sandbox in X-Surrogate-Request-Id
    claim, pool     who sent it (null when identification failed)
    client          client address "ip:port"
    method, scheme, host, port, path
                    what was asked; ``path`` with query values replaced by REDACTED
    status          HTTP status sent to the client (null when the flow errored before one)
    decision        allow | deny | violation | error
    reason          reason code (see proxy.decide.Reason)
    rule            the egress rule that decided, e.g. "demo.egress[0] api.github.com", or null
    message         the human sentence of a refusal or error, null when allowed
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
import logging
import logging.handlers
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import structlog

TIME = "time"
SEQ = "seq"
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


def redact_path(path: str) -> str:
    """``/a?x=1&y&z=2`` → ``/a?x=REDACTED&y&z=REDACTED``: keys kept, values hidden."""
    base, sep, query = path.partition("?")
    if not sep:
        return path
    parts = []
    for item in query.split("&"):
        key, eq, _ = item.partition("=")
        parts.append(f"{key}=REDACTED" if eq else key)
    return f"{base}?{'&'.join(parts)}"


def configure(path: Path | None = None, max_bytes: int = 0, backups: int = 5) -> None:
    """Send audit events as JSON lines to the file ``path`` (default stdout).

    ``max_bytes`` > 0 rotates the file when it would grow past that size, keeping ``backups``
    old files (``PATH.1`` newest), through the standard library's RotatingFileHandler. Every
    event carries ``seq``, a per-process sequence number from 1, so a consumer can see a gap.
    """
    handler: logging.Handler
    if path is None:
        handler = logging.StreamHandler(sys.stdout)
    else:
        handler = logging.handlers.RotatingFileHandler(
            path, maxBytes=max_bytes, backupCount=backups if max_bytes else 0, encoding="utf-8"
        )
    handler.setFormatter(logging.Formatter("%(message)s"))
    sink = logging.getLogger(LOGGER_NAME)
    sink.handlers[:] = [handler]
    sink.setLevel(logging.INFO)
    sink.propagate = False  # never mixed into the engine's stderr log
    counter = itertools.count(1)

    def sequence(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        event[SEQ] = next(counter)
        return event

    structlog.configure(
        processors=[
            sequence,
            structlog.processors.TimeStamper(fmt="iso", utc=True, key=TIME),
            structlog.processors.JSONRenderer(ensure_ascii=False, default=_safe),
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=False,
    )


def _safe(value: Any) -> str:
    return quote(str(value), safe=" /:.,-_")


def logger() -> Any:
    return structlog.get_logger(LOGGER_NAME)
