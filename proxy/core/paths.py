"""Request paths: one canonical identity for every matcher, and redaction for the audit.

Every matcher that decides on a request's path — egress path prefixes, report mode (it is the
egress decision), hook routes, OAuth token endpoints — decides on one :class:`RequestPath`,
computed once per request by :func:`canonical_path` from the request target as the sandbox sent
it (``addons/policy.py`` stores it in ``flow.metadata["surrogate.path"]``).

**Canonical form** (RFC 3986 §6.2.2 syntax-based normalisation):

- the query (from the first ``?``) is not part of the path (a ``#`` is ambiguous, below);
- a percent-escape of an unreserved character (``A–Z a–z 0–9 - . _ ~``, §2.3) is decoded, in
  either hex case (§6.2.2.2): ``/%74oken`` is ``/token``; every other escape is kept with its
  hex in upper case (§6.2.2.1): ``%3a`` is ``%3A``; a raw character outside the path characters
  of §3.3 (non-ASCII, ``"``, ``{``, ``|``…) is percent-encoded as its UTF-8 bytes;
- one trailing slash is not significant: ``/token/`` is ``/token`` (most servers route both to
  one resource). A configured prefix ending in ``/`` covers only paths strictly below it:
  ``/repos/`` covers ``/repos/x`` but neither ``/repos`` nor ``/repos/``, which a server may
  read as ``/repos``.

**Readings.** Servers disagree on two spellings that still have one shape each way: repeated
slashes (merged by nginx and most frameworks, kept by S3 and others) and ``;params`` (stripped
from a segment by servlet containers and Spring, part of the segment elsewhere).
:attr:`RequestPath.readings` holds each way of reading them (at most four; the first, merged and
stripped, is :attr:`RequestPath.canonical`). The two kinds of matcher fail closed in opposite
directions:

- an *allow-list* (egress path prefixes: :meth:`RequestPath.within`) matches only when every
  reading is inside the prefix, and never for an ambiguous path (below) unless the prefix is
  ``/``;
- a *catch* matcher (hook routes, token endpoints: :meth:`RequestPath.reaches`,
  :meth:`RequestPath.names`), which must see every request the upstream could route to its path,
  matches when any reading does, also compared with every escape decoded, ASCII case folded and
  trailing dots and spaces of a segment dropped (servers that decode reserved characters before
  routing, IIS and Windows servers that fold case and trim segments).

Path matching is case-sensitive for allow-lists (RFC 3986 §6.2.2.1: only the scheme and host
are case-insensitive): ``/REPOS`` is not inside ``/repos``.

**Ambiguous spellings** are paths some server reads as a *different* path, which no reading
stands for. :attr:`RequestPath.ambiguity` names the first one found (None: none):

- an encoded slash or backslash (``%2F``, ``%5C``) or a raw backslash: some servers split
  segments on them, others do not;
- a dot segment (``.``, ``..``), raw or percent-encoded (``%2e%2e``), with parameters
  (``..;x``), or a segment of only dots and spaces (``...``, ``.%20``): clients remove dot
  segments before sending (§5.2.4) and servers resolve them before or after decoding, or not;
- an encoded ``%`` (``%25``: a double encoding a second decoding pass reads again), an encoded
  ``;`` (``%3B``: a parameter to a server that decodes before stripping), or an encoded ``?``
  or ``#`` (``%3F``, ``%23``: the end of the path to a server that decodes before it splits
  the query off, as Apache's modules did, CVE-2024-38474: ``/token%3Fx`` is its ``/token``);
- a control character, raw or encoded (``%00``–``%1F``, ``%7F``);
- a ``%`` that does not start two hex digits (``%u002e``, ``%g0``, a trailing ``%2``);
- escapes that do not decode to UTF-8 (overlong ``%C0%AE``, ``%FF``);
- a target that is not an absolute path (``*``, an authority);
- a raw ``#`` anywhere in the target: no request target holds a fragment (RFC 9112 §3.2), and
  servers disagree on it: most end the path there, others (Go's ``ParseRequestURI``, hypercorn
  and uvicorn) keep ``#`` as a path character and go on to read what follows, so
  ``/v1#/../admin`` is ``/v1`` to one and ``/admin`` to a server that then resolves dot
  segments (Go's FileServer, Starlette's StaticFiles).

Policy refuses such a request (400 ``ambiguous_path``, :func:`proxy.core.decide.check_path`) when
anything on its host matches on paths; elsewhere its path decides nothing and it passes.

:func:`redact` makes a request target safe for the audit: see there. Pure; no I/O.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from urllib.parse import unquote_to_bytes

from proxy.core import placeholders

_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
# pchar (RFC 3986 §3.3) spelled raw: unreserved, sub-delims, ":" and "@"
_PCHAR = _UNRESERVED | frozenset(b"!$&'()*+,;=:@")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_ENCODED = {0x2F: "an encoded slash (%2F)", 0x5C: "an encoded backslash (%5C)",
            0x25: "an encoded percent sign (%25)", 0x3B: "an encoded semicolon (%3B)",
            0x3F: "an encoded question mark (%3F)", 0x23: "an encoded number sign (%23)"}  # fmt: skip
_DOTS = frozenset(b". ")
REDACTED = "REDACTED"


@dataclass(frozen=True, slots=True)
class _Segment:
    full: str  # canonical spelling, ;params included
    name: str  # canonical spelling without ;params
    loose_full: str  # every escape decoded, ASCII lower case, trailing dots and spaces dropped
    loose_name: str


@dataclass(frozen=True, slots=True)
class RequestPath:
    """The canonical identity of a request's path (see the module docstring).

    ``target`` is the request target as sent (path and query), ``readings`` the canonical
    readings (first: :attr:`canonical`), ``loose`` the same for catch matchers, ``ambiguity``
    why the path is ambiguous (None: it is not), ``absolute`` whether it starts with ``/``.
    """

    target: str = field(repr=False)  # its query may hold placeholders: never in a repr
    readings: tuple[str, ...] = ("/",)
    loose: tuple[str, ...] = ("/",)
    ambiguity: str | None = None
    absolute: bool = True

    @property
    def canonical(self) -> str:
        return self.readings[0]

    def within(self, prefix: str) -> bool:
        """Allow-list match: every reading is ``prefix`` or below it, segment-aware (``/repos``
        covers ``/repos`` and ``/repos/x``, never ``/reposx``). ``/`` covers every absolute
        path, ambiguous ones too; any other prefix no ambiguous path."""
        if prefix == "/":
            return self.absolute
        if self.ambiguity is not None:
            return False
        p = canonical_prefix(prefix)
        if p is None:  # not a valid prefix (rules check refuses it): it allows nothing
            return False
        if prefix.endswith("/"):  # strictly below: at least one more segment
            return all(r.startswith(p + "/") and len(r) > len(p) + 1 for r in self.readings)
        return all(_under(p, r) for r in self.readings)

    def reaches(self, prefix: str) -> bool:
        """Catch match: some reading is ``prefix`` or below it, loosely compared. An ambiguous
        path reaches every prefix (fail closed)."""
        if self.ambiguity is not None or prefix == "/":
            return True
        p = loose_prefix(prefix)
        return any(_under(p, r) for r in self.loose)

    def names(self, path: str) -> bool:
        """Catch match of one exact path (a token endpoint): some reading is ``path``, loosely
        compared (trailing slash, case, escapes). An ambiguous path names every path."""
        if self.ambiguity is not None:
            return True
        return loose_prefix(path) in self.loose


def _under(prefix: str, path: str) -> bool:
    return prefix == "/" or path == prefix or path.startswith(prefix + "/")


_PLAIN = re.compile(rb"[A-Za-z0-9\-._~!$&'()*+,;=:@]*")  # pchar spelled raw, no escape: as it is


def _segment(raw: bytes) -> _Segment | str:
    """One segment normalised, or why it is ambiguous."""
    if _PLAIN.fullmatch(raw):
        return _tail(raw.decode("ascii"), raw)
    out: list[str] = []
    decoded = bytearray()
    i, n = 0, len(raw)
    while i < n:
        b = raw[i]
        if b == 0x25:  # "%"
            hx = raw[i + 1 : i + 3]
            if len(hx) < 2 or not (hx[0] in _HEX and hx[1] in _HEX):
                return "a '%' that does not start a two-hex-digit escape"
            v = int(hx, 16)
            if v in _ENCODED:
                return _ENCODED[v]
            if v < 0x20 or v == 0x7F:
                return "an encoded control character"
            out.append(chr(v) if v in _UNRESERVED else f"%{v:02X}")
            decoded.append(v)
            i += 3
            continue
        if b == 0x5C:
            return "a backslash"
        if b < 0x20 or b == 0x7F:
            return "a control character"
        out.append(chr(b) if b in _PCHAR else f"%{b:02X}")
        decoded.append(b)
        i += 1
    return _tail("".join(out), bytes(decoded))


def _tail(full: str, decoded: bytes) -> _Segment | str:
    """The segment from its canonical spelling and its decoded bytes, or why it is ambiguous."""
    try:
        text = decoded.decode("utf-8")
    except UnicodeDecodeError:
        return "escapes that do not decode to UTF-8"
    name = full.split(";", 1)[0]
    raw_name = decoded.split(b";", 1)[0]
    if raw_name and set(raw_name) <= _DOTS and b"." in raw_name:
        return "a dot segment (raw, encoded, or with parameters)"
    loose = text.lower() if text.isascii() else "".join(c.lower() if c.isascii() else c for c in text)
    loose_name = loose.split(";", 1)[0]
    return _Segment(full, name, loose_full=loose.rstrip(". "), loose_name=loose_name.rstrip(". "))


def _join(parts: list[str], merge: bool) -> str:
    if parts and parts[-1] == "":
        parts = parts[:-1]  # one trailing slash is not significant
    if merge:
        parts = [p for p in parts if p]
    return "/" + "/".join(parts)


def _readings(segments: list[_Segment], loose: bool) -> tuple[str, ...]:
    out: list[str] = []
    for strip in (True, False):
        for merge in (True, False):
            if loose:
                parts = [s.loose_name if strip else s.loose_full for s in segments]
            else:
                parts = [s.name if strip else s.full for s in segments]
            r = _join(parts, merge)
            if r not in out:
                out.append(r)
    # merged and stripped first: the canonical reading
    return tuple(out)


def _canonical(path: bytes) -> tuple[tuple[str, ...], tuple[str, ...], str | None, bool]:
    """(readings, loose readings, ambiguity, absolute) of a path without query or fragment."""
    if not path.startswith(b"/"):
        return ("/",), ("/",), "a request target that is not an absolute path", False
    segments: list[_Segment] = []
    for raw in path[1:].split(b"/"):
        seg = _segment(raw)
        if isinstance(seg, str):
            return ("/",), ("/",), seg, True
        segments.append(seg)
    return _readings(segments, False), _readings(segments, True), None, True


# Agents call the same few paths again and again; only short ones are cached (never a query,
# which may hold placeholders), so that unique long paths cannot grow the cache's memory.
_CACHED_LENGTH = 512
_cached = functools.lru_cache(maxsize=4096)(_canonical)
_FRAGMENT = "a '#' (no request target holds a fragment: some servers end the path there, others read on)"


def canonical_path(target: str | bytes) -> RequestPath:
    """The canonical identity of request target ``target`` (path and query as sent: ``str``
    as mitmproxy's ``Request.path`` gives it, or the raw bytes). Raises nothing: a path that
    cannot be read one way has :attr:`RequestPath.ambiguity` set."""
    if isinstance(target, str):
        text, raw = target, target.encode("utf-8", "surrogateescape")
    else:
        text, raw = target.decode("utf-8", "surrogateescape"), target
    if b"#" in raw:  # no request target holds a fragment (RFC 9112 §3.2); servers disagree
        return RequestPath(text, ambiguity=_FRAGMENT, absolute=raw.startswith(b"/"))
    # an empty path is "/" (RFC 9112 §3.2.1: the origin form of an empty path)
    path = raw.split(b"?", 1)[0] or b"/"
    readings, loose, ambiguity, absolute = (_cached if len(path) <= _CACHED_LENGTH else _canonical)(path)
    return RequestPath(text, readings, loose, ambiguity, absolute)


@functools.lru_cache(maxsize=1024)
def canonical_prefix(prefix: str) -> str | None:
    """The canonical reading of a configured path prefix or endpoint (``/repos/`` → ``/repos``),
    or None when it has none (:func:`prefix_problem`)."""
    return None if prefix_problem(prefix) is not None else canonical_path(prefix).canonical


@functools.lru_cache(maxsize=1024)
def loose_prefix(prefix: str) -> str:
    """The loose reading of a configured path prefix or endpoint, for catch matchers."""
    return canonical_path(prefix).loose[0]


def prefix_problem(prefix: str) -> str | None:
    """Why ``prefix`` cannot be a configured path prefix or endpoint (None: it can): it must
    start with ``/``, hold no query or fragment, not be ambiguous, and have one reading (no
    ``//``, no ``;``)."""
    if not prefix.startswith("/") or "?" in prefix or "#" in prefix:
        return "must start with '/' and hold no query or fragment"
    p = canonical_path(prefix)
    if p.ambiguity is not None:
        return f"is ambiguous: it holds {p.ambiguity}"
    if len(p.readings) > 1:
        return "holds '//' or ';', which servers read in different ways"
    return None


# --- redaction for the audit ----------------------------------------------------------------

_SPLIT = re.compile(r"([/;?&=#])")


def _holds_placeholder(part: str) -> bool:
    """True when ``part`` holds a placeholder-shaped string as spelled or once it is
    percent-decoded, once or more (any hex case, double encodings)."""
    data = part.encode("utf-8", "surrogateescape")
    for _ in range(4):
        if placeholders.find(data):
            return True
        if b"%" not in data:
            return False
        data = unquote_to_bytes(data)
    return bool(placeholders.find(data))


def redact(target: str) -> str:
    """``target`` (a request target as sent) with nothing an audit line may not hold.

    ``/a;k=PH/b?x=1&PH&y=PH#PH`` → ``/a;k=REDACTED/b?x=REDACTED&REDACTED&y=REDACTED#REDACTED``:
    every query value and the fragment are replaced by ``REDACTED``; a query key, path segment
    name or ``;param`` name or value is replaced when it holds a placeholder-shaped string in any
    spelling (raw, percent-encoded in either hex case, double-encoded). Keys and segments without
    one are kept. The audit logs the target as the sandbox sent it, before any substitution, so
    a swapped secret is never in it.
    """
    if not _holds_placeholder(target):  # the usual case: only query values and a fragment go
        return _redact_values(target)
    base, qsep, rest = target.partition("?")
    query, fsep, _fragment = rest.partition("#")
    if not qsep:
        base, fsep, _fragment = target.partition("#")
    out = [p if p in "/;=" or not _holds_placeholder(p) else REDACTED for p in _SPLIT.split(base)]
    if qsep:
        items = []
        for item in query.split("&"):
            key, eq, _ = item.partition("=")
            key = REDACTED if _holds_placeholder(key) else key
            items.append(f"{key}={REDACTED}" if eq else key)
        out += ["?", "&".join(items)]
    if fsep:
        out.append("#" + REDACTED)
    return "".join(out)


def _redact_values(target: str) -> str:
    base, qsep, rest = target.partition("?")
    if not qsep:
        base, fsep, _ = target.partition("#")
        return base + (f"#{REDACTED}" if fsep else "")
    query, fsep, _ = rest.partition("#")
    items = [f"{k}={REDACTED}" if eq else k for k, eq, _ in (i.partition("=") for i in query.split("&"))]
    return f"{base}?{'&'.join(items)}" + (f"#{REDACTED}" if fsep else "")
