"""Request-head hygiene: refuse heads that parsers disagree on, drop hop-by-hop headers.

Pure over the header fields as received (``(name, value)`` byte pairs). Refused (400 unless
said otherwise): more than one Host header (RFC 9112 §3.2), a value holding a control character
other than HTAB (RFC 9110 §5.5; this includes a bare CR or LF that would fold or split a line),
a head over ``MAX_HEAD_BYTES`` or ``MAX_HEADERS`` fields (431, RFC 6585 §5), and TRACE toward a
host one of the claim's credentials is bound to (it would echo the swapped secret back).
A ``Transfer-Encoding`` other than ``chunked`` alone (``gzip, chunked``, ``deflate, chunked``,
``compress, chunked``, which mitmproxy accepts) gets 501 (RFC 9112 §6.1): the body the upstream
decodes is then not the one the placeholder checks read, and a swap that re-frames the body
would drop the coding. A header name that is a framing or ``Proxy-*`` header but for ``_`` in
place of ``-`` (``Content_Length``, ``Transfer_Encoding``, ``Keep_Alive``, ``Proxy_*``) gets
400: mitmproxy frames the request without it (and identify removes only ``Proxy-*``) and forwards
it, and a server that reads ``_`` as ``-`` (CGI-style header mapping) would frame the request
differently.

Dropped before forwarding (RFC 9110 §7.6.1): every header ``Connection`` names, ``Keep-Alive``
and ``Proxy-Connection``. Kept: ``Connection`` itself and its ``close``/``keep-alive``/``upgrade``
tokens (mitmproxy reads them from the same request to manage the client's connection), and
``TE`` (``te: trailers`` is required by gRPC over HTTP/2). ``Proxy-*`` headers are dropped by
identify. An ``Upgrade`` other than ``websocket`` (``h2c``, ``TLS/1.2``, anything) is dropped too,
with ``HTTP2-Settings``: an intermediary forwards an upgrade only to a protocol it implements
(RFC 9110 §7.8), and past a ``101`` to any other protocol mitmproxy would relay raw bytes, so
that response is refused (addons/tunnel.py) and a client that offered ``h2c`` (``curl --http2
http://…``) got a closed connection from an upstream that accepts it. Without the header the
upstream answers in HTTP/1.1, as RFC 9113 §3.1 has an upgrade that is not taken answered.

The request line (:func:`check_request_line`, 400): the method must be a token (RFC 9110 §9.1,
§5.6.2), the target a path (``/…``, or ``*`` for OPTIONS: the origin and asterisk forms of RFC
9112 §3.2; the authority travels apart) in visible ASCII only (no space, control, DEL or byte
over 0x7E: RFC 3986 characters), the scheme ``http`` or ``https``, and the authority RFC 3986
§3.2 characters without userinfo (RFC 9113 §8.3.1). The same rules hold in every HTTP version,
because an HTTP/2 request's pseudo-header fields become an HTTP/1 request line when its upstream
speaks HTTP/1: a space in ``:method`` or ``:path`` would otherwise write a second request line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 200
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 §5.6.2
_PATH = re.compile(rb"/[\x21-\x7e]*")  # visible ASCII (RFC 9112 §3.2: RFC 3986 characters)
_AUTHORITY = re.compile(rb"[A-Za-z0-9\-._~%!$&'()*+,;=:\[\]]*")  # RFC 3986 §3.2, no "@"
_HOP_BY_HOP = frozenset({b"keep-alive", b"proxy-connection"})
# the framing headers with a "-" in their name: only those have a "_" spelling
_FRAMING = frozenset({b"content-length", b"transfer-encoding", b"keep-alive"})
_KEEP = frozenset({b"close", b"keep-alive", b"upgrade", b"te", b"host", b"connection"})


@dataclass(frozen=True, slots=True)
class Verdict:
    status: int  # 0: fine
    message: str = ""
    drop: frozenset[bytes] = frozenset()  # lower-cased header names to remove


def check_head(fields: Sequence[tuple[bytes, bytes]], method: str, credentialed_host: bool) -> Verdict:
    """Judge a request head; ``credentialed_host``: a credential of the claim is bound to it."""
    if len(fields) > MAX_HEADERS:
        return Verdict(431, f"more than {MAX_HEADERS} header fields")
    if sum(len(n) + len(v) + 4 for n, v in fields) > MAX_HEAD_BYTES:
        return Verdict(431, f"request head larger than {MAX_HEAD_BYTES} bytes")
    names = [n.lower() for n, _ in fields]
    if names.count(b"host") > 1:
        return Verdict(400, "more than one Host header")
    if _CONTROL.search(b"".join(n + v for n, v in fields)):  # then find the header to name
        for name, value in fields:
            if _CONTROL.search(value) or _CONTROL.search(name):
                return Verdict(400, f"control character in header {name[:64].decode('latin-1')!r}")
    if any(b"_" in n for n in names):
        for name in names:
            dashed = name.replace(b"_", b"-")
            if dashed != name and dashed in _FRAMING:
                return Verdict(400, f"header {dashed.decode()!r} spelled with '_' for '-'")
            if dashed != name and dashed.startswith(b"proxy-"):
                return Verdict(400, "a Proxy-* header spelled with '_' for '-'")
    if b"transfer-encoding" in names:
        for name, value in fields:
            if name.lower() == b"transfer-encoding" and value.strip().lower() != b"chunked":
                return Verdict(501, "request Transfer-Encoding other than chunked (RFC 9112 §6.1)")
    if method == "TRACE" and credentialed_host:
        return Verdict(405, "TRACE toward a host with credentials is refused (it would echo them)")
    drop = set(_HOP_BY_HOP)
    for name, value in fields:
        lower = name.lower()
        if lower == b"connection":
            drop.update(t.strip().lower() for t in value.split(b",") if t.strip().lower() not in _KEEP)
        elif lower == b"upgrade" and value.strip().lower() != b"websocket":
            drop.update((b"upgrade", b"http2-settings"))
    return Verdict(0, drop=frozenset(d for d in drop if d in names))


def check_request_line(method: bytes, scheme: bytes, authority: bytes, path: bytes, http2: bool) -> Verdict:
    """Judge a request's line (HTTP/1) or pseudo-header fields (HTTP/2, ``http2``: named so in
    the message). Never quotes the offending bytes."""
    names = (
        (":method", ":scheme", ":authority", ":path")
        if http2
        else ("method", "scheme", "authority", "target")
    )
    if not _TOKEN.fullmatch(method):
        return Verdict(400, f"request {names[0]} is not a token (RFC 9110 §9.1)")
    if scheme not in (b"http", b"https"):
        return Verdict(400, f"request {names[1]} is neither http nor https")
    if not _AUTHORITY.fullmatch(authority):
        return Verdict(400, f"request {names[2]} holds a byte not allowed in an authority (RFC 3986 §3.2)")
    if not (_PATH.fullmatch(path) or (path == b"*" and method == b"OPTIONS")):
        return Verdict(400, f"request {names[3]} is not a path of visible ASCII characters (RFC 9112 §3.2)")
    return Verdict(0)


def transfer_coded(fields: Sequence[tuple[bytes, bytes]]) -> str:
    """A response's Transfer-Encoding when it names a coding other than ``chunked`` (RFC 9112
    §7: ``gzip, chunked``, ``deflate``), else "". mitmproxy undoes only the chunked framing of
    such a body and passes it still coded: nothing that reads it (the scrubber, token capture)
    sees what the client will decode."""
    values = [v for n, v in fields if n.lower() == b"transfer-encoding"]
    te = b", ".join(values).decode("latin-1").lower()
    return te if any(c.strip() not in ("", "chunked", "identity") for c in te.split(",")) else ""
