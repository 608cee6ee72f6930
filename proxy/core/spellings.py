"""The violation scan's reader: placeholders hidden in other spellings of a value.

Pure (no I/O). :func:`hidden` finds the placeholders of ``registered`` inside ``value`` spelled

- raw, also when followed by more letters or digits (``surr_…xyz``: a receiver can cut the tail);
- percent-encoded, any byte, either hex case (RFC 3986 §2.1), up to :data:`MAX_LAYERS` layers
  (``%5F``, ``%255F``), also in IIS's ``%u005F`` form;
- base64 or base64url (RFC 4648 §4, §5), with or without padding, alone or at any alignment inside
  a longer run (``Basic base64(user:P)``, a JWT segment, ``xyz`` + base64(…)), also broken into
  lines or words by whitespace (space, tab, CR, LF: MIME's 76-character lines, RFC 2045 §6.8, and
  the decoders that skip whitespace, as Python's and Node's do), reached raw in a header value or
  through a decoded layer (``%0A``, ``%20``);
- UTF-16 or UTF-32 of an ASCII spelling (its NUL bytes dropped), as a decoded layer holds it
  (``s%00u%00r%00r%00…``, base64 of UTF-16LE); dropping NULs, like joining whitespace, is not
  one of the :data:`MAX_LAYERS` (it cannot repeat);
- any nesting of these up to :data:`MAX_LAYERS` decodings (base64 of a percent-encoded value, …).

It serves refusals and the audit, never substitution: a placeholder spelled any way but raw is
not swapped (the credential's ``on_misplaced`` decides toward a bound host), and toward a host its
credential is not bound to it is a violation. Placeholders are not secrets, so this is about
showing the attempt; the secret itself never leaves toward an unbound host in any spelling.

Not read: hex, base32, quoted-printable, HTML entities, JSON ``\\u`` escapes in headers,
compression, encryption: the list of encodings is open-ended, and an attacker who controls the
receiving host gains nothing from a placeholder (it is only worth something through this proxy).

Cost: one regex pass per value for runs of 28 base64 characters or more (the shortest encoding of
the shortest placeholder, 21 bytes), a ``%`` and a NUL search; a value with none of these costs
four C-level scans (one of them a copy without whitespace).
A run is decoded at its 4 offsets, and a decoding is read further only when one C-level search
finds something in it to read (``surr_``, a percent escape, a NUL, another long run): garbage,
which is what 3 of the 4 offsets give, stops there. A value with whitespace between base64
characters is read a second time with its whitespace removed. Other
separators (``.``, ``,``, ``:``, and ``+`` read as a form-encoded space) are not joined: joining
every non-base64 byte would make every value one long run, and ``+`` is itself a base64 character.
"""

from __future__ import annotations

import binascii
import functools
import re
from collections.abc import Container
from urllib.parse import unquote_to_bytes

from proxy.core import placeholders

MAX_LAYERS = 3
# Every placeholder prefix (``surr_`` and the templates'), with the most letters or digits a
# placeholder has after it: the one scanner's shapes (placeholders.PATTERN).
_PREFIXES = tuple(placeholders.MAX_BODY.items())
_PREFIX_BYTES = tuple(p for p, _ in _PREFIXES)
_MIN_BODY = 16  # surr_'s shortest; template placeholders have a fixed, longer body
_ALNUM = re.compile(rb"[A-Za-z0-9]*")
_MIN_RUN = -(-placeholders.SHORTEST * 4 // 3)  # base64 characters of the shortest placeholder
_RUN = re.compile(rb"[A-Za-z0-9+/_-]{%d,}" % _MIN_RUN)
_URLSAFE = bytes.maketrans(b"-_", b"+/")
_B64_CHARS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/_-"
# every base64/base64url character to "a", every other byte to " ": a long run is then a
# substring search (C speed), where the regex costs ~1.7 us per decoding (measured)
_CLASS = bytes(0x61 if b in _B64_CHARS else 0x20 for b in range(256))
_LONG_RUN = b"a" * _MIN_RUN
_PCT_U = re.compile(rb"%[uU]([0-9A-Fa-f]{4})")
_WHITESPACE = b" \t\r\n"  # what base64 decoders skip (RFC 2045 §6.8 lines, Python, Node)


_SHORTEST = placeholders.SHORTEST  # no spelling of a placeholder is shorter
_CACHED = 4096  # bytes: longer values are scanned every time, so the cache stays under 16 MiB


def hidden(value: bytes, registered: Container[bytes]) -> list[bytes]:
    """The placeholders of ``registered`` found in ``value`` in any spelling above, each once,
    in the order found. Raises nothing."""
    if len(value) < _SHORTEST:
        return []
    out: list[bytes] = []
    for candidate in candidates(value):
        for length in placeholders.LENGTHS:
            if length > len(candidate):
                break
            if candidate[:length] in registered:
                if candidate[:length] not in out:
                    out.append(candidate[:length])
                break
    return out


def candidates(value: bytes) -> tuple[bytes, ...]:
    """Every ``surr_`` (or template prefix) run in any spelling of ``value``, each with the
    letters and digits after it, at most one more than its placeholders have
    (so that one longer than a placeholder's 64 shows it): what
    :func:`hidden` checks against the registered placeholders, and :mod:`proxy.core.forgery` for
    checksums. Pure in ``value`` (no claim's placeholders are involved), so cached."""
    if len(value) < _SHORTEST:
        return ()
    return _cached(value) if len(value) <= _CACHED else _candidates(value)


def _candidates(value: bytes) -> tuple[bytes, ...]:
    out: list[bytes] = []
    _scan(value, MAX_LAYERS, out)
    return tuple(out)


# Request heads repeat on a connection (cookies, JWTs): scan each distinct value once.
_cached = functools.lru_cache(maxsize=4096)(_candidates)


def _scan(value: bytes, layers: int, out: list[bytes]) -> None:
    _raw(value, out)
    if layers == 0:
        return
    if b"%" in value:
        decoded = unquote_to_bytes(value)
        if decoded != value:
            _scan(decoded, layers - 1, out)
        if b"%u" in value or b"%U" in value:  # IIS's %uXXXX (a UTF-16 code unit), as UTF-8
            _scan(_PCT_U.sub(lambda m: chr(int(m[1], 16)).encode("utf-8", "replace"), value), layers - 1, out)
    if b"\x00" in value:  # UTF-16/32 of ASCII: the placeholder's bytes with NULs between them;
        _scan(value.replace(b"\x00", b""), layers, out)  # no layer spent: it cannot recur
    done = _runs(value, layers, out)
    joined = value.translate(None, _WHITESPACE)  # base64 in lines or words, as decoders that
    if joined != value:  # skip whitespace read it: only the runs the joining made are new
        _runs(joined, layers, out, done)


def _runs(value: bytes, layers: int, out: list[bytes], done: Container[bytes] = ()) -> list[bytes]:
    """Decode every long base64/base64url run of ``value`` (but those in ``done``) at each of its
    4 character offsets: one of them is the alignment the run was encoded at, whatever preceded
    it. Returns the runs decoded."""
    if _LONG_RUN not in value.translate(_CLASS):
        return []
    runs = [run for run in dict.fromkeys(m.group() for m in _RUN.finditer(value)) if run not in done]
    for found in runs:
        run = found.translate(_URLSAFE)
        for k in range(4):
            part = run[k:]
            rem = len(part) % 4
            part = part[:-1] if rem == 1 else part + b"=" * ((4 - rem) % 4)
            try:
                decoded = binascii.a2b_base64(part)
            except binascii.Error:  # pragma: no cover - every character is valid
                continue
            if (
                any(p in decoded for p in _PREFIX_BYTES)
                or b"%" in decoded
                or b"\x00" in decoded
                or _LONG_RUN in decoded.translate(_CLASS, _WHITESPACE)
            ):
                _scan(decoded, layers - 1, out)
    return runs


def _raw(value: bytes, out: list[bytes]) -> None:
    """Each placeholder prefix of ``value`` with the letters or digits after it (at most one more
    than its placeholders have, so that a longer run shows)."""
    for prefix, most in _PREFIXES:
        at = value.find(prefix)
        while at != -1:
            start = at + len(prefix)
            body = _ALNUM.match(value, start)
            end = min(body.end() if body else start, start + most + 1)
            if end - start >= _MIN_BODY and value[at:end] not in out:
                out.append(value[at:end])
            at = value.find(prefix, start)
