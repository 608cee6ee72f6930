"""Hook routes: requests an operator command answers, without contacting the upstream.

A pool lists ``hooks`` in the rules file (see rules/README.md); each is a route — host pattern,
methods (empty: any), segment-aware path prefixes — and a command (an argv list, run without a
shell) with a timeout. A request that the egress rules allow and that matches a route is handed
to the command, and the command's answer is the response. For flows like a host-side CLI that
refreshes its own tokens, or a canned answer for an endpoint the sandbox must not reach.

The exchange, decided here:

- **stdin**: one JSON object (UTF-8), then EOF: ``method``, ``scheme``, ``host``, ``port``,
  ``path`` (with the query), ``http_version``, ``headers`` (a list of ``[name, value]``, in
  order), and ``body`` (text when the body is UTF-8, else null with ``body_base64``). It is the
  request as the sandbox sent it: placeholders, never secrets (hooks run before substitution),
  without the ``Proxy-*`` headers.
- **stdout**: an HTTP/1.1 response (``HTTP/1.1 200 OK``, headers, blank line, body), parsed by
  h11; the body is framed by ``Content-Length``, chunked, or runs to the end of the output. At
  most :data:`MAX_OUTPUT` bytes. Hop-by-hop and framing headers are dropped (the proxy frames
  the response for the client itself).
- exit status 0; stderr is discarded (never logged: it may echo the request).

Failures answer the sandbox with a clear error and are audited: ``hook_timeout`` (504) when the
command runs past its timeout (it is killed), ``hook_failed`` (502) when it cannot be started,
exits non-zero, or prints something that is not an HTTP response.

A hook request must declare its body size (``Content-Length`` up to :data:`MAX_BODY`); a larger
or undeclared (chunked HTTP/1) body is refused, so no body is streamed anywhere.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

import h11

from proxy.core.hosts import HostPattern
from proxy.core.paths import RequestPath, canonical_path

MAX_BODY = 64 * 1024  # request body bytes a hook is given
MAX_OUTPUT = 1 << 20  # response bytes a hook may print
DEFAULT_TIMEOUT = 10.0  # seconds
_DROPPED = frozenset(
    {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"te", b"trailer", b"upgrade",
     b"proxy-connection"}
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class HookRoute:
    id: str  # "pool.hooks[i]", for audit events
    host: HostPattern
    methods: frozenset[str]
    paths: tuple[str, ...]
    command: tuple[str, ...] = ()
    timeout: float = DEFAULT_TIMEOUT

    def matches(
        self, host: str, method: str, path: str | RequestPath, also: frozenset[str] = frozenset()
    ) -> bool:
        """``host`` canonical; ``path`` the request target as sent (its query ignored) or its
        canonical identity. A route catches a request when *any* reading of its path is under
        one of the route's prefixes (:meth:`proxy.core.paths.RequestPath.reaches`: case, escapes,
        ``//`` and ``;params`` as some server may read them): ``/%6Fauth/token`` is
        ``/oauth/token``, so a spelling cannot take a hooked request past its command to the
        upstream. ``also``: the other methods a server may read it as (:mod:`proxy.core.methods`):
        any the route lists catches it too."""
        ident = canonical_path(path) if isinstance(path, str) else path
        return (
            self.host.matches(host)
            and (not self.methods or method in self.methods or bool(also & self.methods))
            and any(ident.reaches(p) for p in self.paths)
        )


def find(
    routes: tuple[HookRoute, ...],
    host: str,
    method: str,
    path: str | RequestPath,
    also: frozenset[str] = frozenset(),
) -> HookRoute | None:
    """The first route that matches (:meth:`HookRoute.matches`), or None."""
    return next((r for r in routes if r.matches(host, method, path, also)), None)


def request_json(
    method: str,
    scheme: str,
    host: str,
    port: int,
    path: str,
    http_version: str,
    headers: list[tuple[str, str]],
    body: bytes,
) -> bytes:
    """The command's stdin (see the module docstring)."""
    try:
        text: str | None = body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    doc = {
        "method": method,
        "scheme": scheme,
        "host": host,
        "port": port,
        "path": path,
        "http_version": http_version,
        "headers": [[k, v] for k, v in headers],
        "body": text,
    }
    if text is None:
        doc["body_base64"] = base64.b64encode(body).decode()
    return json.dumps(doc).encode()


class HookOutputError(ValueError):
    """The command's output is not an HTTP/1.1 response; the message says what is wrong (it
    quotes none of the output)."""


@dataclass(frozen=True, slots=True)
class HookResponse:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


def parse_response(output: bytes) -> HookResponse:
    """Parse the command's stdout; raises :class:`HookOutputError`."""
    if not output:
        raise HookOutputError("the command printed nothing (expected an HTTP/1.1 response)")
    if len(output) > MAX_OUTPUT:
        raise HookOutputError(f"the command printed more than {MAX_OUTPUT} bytes")
    conn = h11.Connection(our_role=h11.CLIENT, max_incomplete_event_size=MAX_OUTPUT)
    conn.send(h11.Request(method="GET", target="/", headers=[("Host", "hook")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(output)
    conn.receive_data(b"")  # the output ends here
    status, headers, body = 0, [], bytearray()
    try:
        while True:
            event = conn.next_event()
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
                headers = [(k, v) for k, v in event.headers if k.lower() not in _DROPPED]
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return HookResponse(status, headers, bytes(body))
            else:  # NEED_DATA after EOF, ConnectionClosed: the response was cut short
                raise HookOutputError("the command's response ended before its body did")
    except h11.RemoteProtocolError as e:
        raise HookOutputError(f"the command's output is not an HTTP/1.1 response ({e})") from None
