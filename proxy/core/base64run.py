"""The base64 spellings of a secret, and how one is replaced so that the text stays valid base64
and keeps nothing of the secret (RFC 4648 §4 standard and §5 URL-safe alphabets).

A secret S of n bytes inside a longer encoded run (``Basic user:S``, a JWT, a JSON blob) starts
k ∈ {0, 1, 2} bytes into a 3-byte group. Its *core* is the run of characters S alone decides;
at most one character on each side (the *boundary* characters) mixes S's first or last byte with
the neighbouring byte. The scrubber finds cores (and S's whole encoding) as plain spellings.

Decision (issue 13 class 2): **decode, replace, re-encode, locally**. The placeholder P is
stretched to R = P + spaces, ``len(R) ≡ n (mod 3)``, so every character after the secret keeps
its place in the 4-character grid and still decodes to the same bytes; the core is replaced by
R's core at the same alignment, and each boundary character is re-encoded with R's bits in place
of S's (its other bits, the neighbour's, are kept). A client that decodes the run reads its own
bytes around R: P then 0 to 2 spaces. The run stays valid base64 (its length and padding are
unchanged modulo 4) and no bit of S is left in it.

S's whole encoding standing alone (the next character is not of the alphabet) is replaced by P's
whole encoding instead, in the same alphabet and padding, so it decodes to exactly P.

A boundary character is re-encoded raw or escaped (``%2B``, ``\\/``, ``\\u002b``: written
back in the same kind of escape), and a match found percent-escaped is written back
percent-escaped. The byte before a possible match, and the 5 before it that tell whether it
ends an escape, are held back when it is a base64 character (see proxy/core/scrub.py), so the cut of
the stream changes nothing.

Pure; no I/O.
"""

from __future__ import annotations

import base64
import dataclasses
import re
from dataclasses import dataclass

MIN_BASE64 = 8  # characters: shorter base64 slices are not matched (false positives)
FILL = b" "  # what stretches P to S's length modulo 3

_STANDARD = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_URLSAFE = _STANDARD[:62] + b"-_"
BASE64_BYTES = frozenset(_STANDARD + _URLSAFE)
_MEMBERS = {False: frozenset(_STANDARD), True: frozenset(_URLSAFE)}
_ESCAPE_HEADS = frozenset(b"%\\")
# an escape that ends where it is looked at (a boundary character that is the end of one is escaped)
_ESCAPE_END = re.compile(rb"(?:%[0-9A-Fa-f]{2}|\\u[0-9A-Fa-f]{4}|\\[/\"\\])\Z")
CONTEXT = 5  # bytes before a boundary character that tell whether it ends an escape (\uXXXX)


def _b64(data: bytes, urlsafe: bool) -> bytes:
    return (base64.urlsafe_b64encode if urlsafe else base64.standard_b64encode)(data)


_TO_URLSAFE = bytes.maketrans(b"+/", b"-_")
_STANDARD_ONLY, _URLSAFE_ONLY = frozenset(b"+/"), frozenset(b"-_")
_LOOK = 4096  # characters of the surrounding run looked at to tell the alphabet


@dataclass(frozen=True, slots=True)
class Run:
    """How to replace one base64 spelling of S.

    ``urlsafe``: the spelling's alphabet, None when it holds no character that tells (then the
    surrounding run tells, standard when nothing does); ``core``: R's characters at S's
    alignment ``k``, standard alphabet; ``first``/``last``: R's first and last byte (for the
    boundary characters); ``end``: ``(k + n) % 3``, whether (1, 2) or not (0) S's last byte
    shares a character with the next byte; ``whole``: the spelling is S's whole encoding (k = 0;
    unpadded, its last character is that boundary character when ``end``); ``padded``: with its
    padding (it ends a run); ``alone``: P's whole encoding (standard alphabet, same padding), the
    replacement when a whole spelling stands alone."""

    urlsafe: bool | None
    k: int
    end: int
    core: bytes
    first: int
    last: int
    whole: bool = False
    padded: bool = False
    alone: bytes = b""

    def lead(self, char: int, alphabet: bytes) -> bytes:
        """The boundary character before the core (``k`` > 0), S's bits replaced by R's."""
        i = alphabet.index(char)
        i = (i & 0b110000) | (self.first >> 4) if self.k == 1 else (i & 0b111100) | (self.first >> 6)
        return alphabet[i : i + 1]

    def trail(self, char: int, alphabet: bytes) -> bytes:
        """The boundary character after the core (``end`` > 0), S's bits replaced by R's."""
        i = alphabet.index(char)
        i = ((self.last & 3) << 4) | (i & 0b001111) if self.end == 1 else ((self.last & 15) << 2) | (i & 0b11)
        return alphabet[i : i + 1]


def _alphabet_of(text: bytes) -> bool | None:
    if b"-" in text or b"_" in text:
        return True
    return False if b"+" in text or b"/" in text else None


def spellings(secret: bytes, placeholder: bytes) -> dict[bytes, Run]:
    """S's base64 spellings (standard and URL-safe, whole and at each alignment; at least
    :data:`MIN_BASE64` characters), each with how to replace it (see module)."""
    runs: dict[bytes, Run] = {}
    n, m = len(secret), len(placeholder)
    filled = placeholder + FILL * ((n - m) % 3)
    whole, alone = _b64(secret, False), _b64(placeholder, False)
    cores = []
    for k in range(3):  # S starts k bytes into a 3-byte group of the run
        lead = -(-8 * k // 6)
        core = _b64(b"\0" * k + secret, False)[lead : 8 * (k + n) // 6]
        core_r = _b64(b"\0" * k + filled, False)[lead : 8 * (k + len(filled)) // 6]
        cores.append((core, Run(_alphabet_of(core), k, (k + n) % 3, core_r, filled[0], filled[-1])))
    for urlsafe in (False, True):
        for k, (core, run) in enumerate(cores):
            if urlsafe:
                core = core.translate(_TO_URLSAFE)
                run = dataclasses.replace(run, urlsafe=_alphabet_of(core))
            if k == 0:
                # When S's encoding needs no padding, both are one string, which may also go on in
                # a run; alone, it is replaced by P's encoding padded (RFC 4648 §3.2).
                encoded = whole.translate(_TO_URLSAFE) if urlsafe else whole
                for text, padded in ((encoded, encoded.endswith(b"=")), (encoded.rstrip(b"="), False)):
                    if len(text) >= MIN_BASE64 and text not in runs:
                        replacement = alone if padded or text == encoded else alone.rstrip(b"=")
                        runs[text] = dataclasses.replace(
                            run, urlsafe=_alphabet_of(text), whole=True, padded=padded, alone=replacement
                        )
            if len(core) >= MIN_BASE64:
                runs.setdefault(core, run)
    return runs


def _urlsafe(run: Run, data: bytes, start: int, end: int) -> bool:
    """The alphabet of the run around ``data[start:end]``: the spelling's, else the nearest
    character of the surrounding run that tells, else standard."""
    if run.urlsafe is not None:
        return run.urlsafe
    i, j = start - 1, end
    while i >= max(0, start - _LOOK) or j < min(len(data), end + _LOOK):
        for at in (i, j):
            if 0 <= at < len(data):
                c = data[at]
                if c in _URLSAFE_ONLY:
                    return True
                if c in _STANDARD_ONLY:
                    return False
        i = i - 1 if i >= 0 and data[i] in BASE64_BYTES else -1
        j = j + 1 if j < len(data) and data[j] in BASE64_BYTES else len(data)
        if i < 0 and j >= len(data):
            break
    return False


_ESCAPE_AT = re.compile(rb"%[0-9A-Fa-f]{2}|\\u[0-9A-Fa-f]{4}|\\[/\"\\]")


def _unescape(escape: bytes) -> int:
    """The byte an escape (``%XX``, ``\\uXXXX``, ``\\/``) stands for; -1 past Latin-1."""
    if escape[0] == 0x25:
        return int(escape[1:3], 16)
    if escape[1] == 0x75:
        point = int(escape[2:6], 16)
        return point if point < 0x100 else -1
    return escape[1]


def _reescape(escape: bytes, char: bytes) -> bytes:
    """``char`` where ``escape`` stood: raw when it is a letter or digit, else in the same kind
    of escape (a raw "+" in a form is a space)."""
    if char.isalnum():
        return char
    upper = not any(c in b"abcdef" for c in escape[1:])
    if escape[0] == 0x25:
        return (b"%%%02X" if upper else b"%%%02x") % char[0]
    if escape[1] == 0x75:
        return (b"\\u%04X" if upper else b"\\u%04x") % char[0]
    return b"\\" + char if char == b"/" else char


def _percent(text: bytes) -> bytes:
    """``text`` with every byte but letters and digits percent-encoded (RFC 3986 §2.1)."""
    return b"".join(bytes([c]) if bytes([c]).isalnum() else b"%%%02X" % c for c in text)


def replace(run: Run, data: bytes, pos: int, start: int, end: int, spelling: bytes) -> tuple[int, bytes, int]:
    """Replace the match ``data[start:end]`` (``spelling``, decoded) of ``run``; ``data[:pos]``
    is already sent. Returns (where the replaced text starts, its replacement, where it ends).

    A boundary character next to the match is re-encoded whether it is raw or escaped (it is
    written back in the same kind of escape); a match found percent-escaped is written back
    percent-escaped (a raw "+" in a form would read as a space)."""
    urlsafe = _urlsafe(run, data, start, end)
    alphabet = _URLSAFE if urlsafe else _STANDARD
    members = _MEMBERS[urlsafe]
    after = data[end] if end < len(data) else -1
    percent = 0x25 in data[start:end]
    if run.whole and (run.padded or not (after in members or after in _ESCAPE_HEADS)):
        body = run.alone.translate(_TO_URLSAFE) if urlsafe else run.alone
        return start, _percent(body) if percent else body, end
    head, body = start, run.core.translate(_TO_URLSAFE) if urlsafe else run.core
    lead = b""
    if run.k and start > pos:  # (data[:pos] is sent)
        escape = _ESCAPE_END.search(data, max(0, start - 1 - CONTEXT), start)
        if escape is not None:
            char = _unescape(escape.group())
            if char in members and escape.start() >= pos:
                head, lead = escape.start(), _reescape(escape.group(), run.lead(char, alphabet))
        elif data[start - 1] in members:
            head, lead = start - 1, run.lead(data[start - 1], alphabet)
    trail = b""
    if run.end and run.whole:  # its last character is the boundary: escaped or not, in the match
        escape = _ESCAPE_END.search(data, max(start, end - 1 - CONTEXT), end)
        new = run.trail(spelling[-1], alphabet)
        trail = _reescape(escape.group(), new) if escape is not None else new
    elif run.end and after in members:
        trail, end = run.trail(after, alphabet), end + 1
    elif run.end and (escape := _ESCAPE_AT.match(data, end)) is not None:
        char = _unescape(escape.group())
        if char in members:
            trail, end = _reescape(escape.group(), run.trail(char, alphabet)), escape.end()
    return head, lead + (_percent(body) if percent else body) + trail, end
