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

Where a boundary character cannot be re-encoded, it keeps at most 4 bits of S's first or last
byte: when it is itself escaped (``%2B``, ``\\/``; a raw one next to an escaped match is
re-encoded), or when a match ends at the end of a read the scrubber could not hold (the byte
before a possible match, and the 5 that tell whether it ends an escape, are held back when it is
a base64 character, see proxy/scrub.py).

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


def replace(run: Run, data: bytes, pos: int, start: int, end: int, spelling: bytes) -> tuple[int, bytes, int]:
    """Replace the match ``data[start:end]`` (``spelling``, decoded) of ``run``; ``data[:pos]``
    is already sent. Returns (where the replaced text starts, its replacement, where it ends)."""
    urlsafe = _urlsafe(run, data, start, end)
    alphabet = _URLSAFE if urlsafe else _STANDARD
    members = _MEMBERS[urlsafe]
    after = data[end] if end < len(data) else -1
    if run.whole and (run.padded or not (after in members or after in _ESCAPE_HEADS)):
        return start, run.alone.translate(_TO_URLSAFE) if urlsafe else run.alone, end
    head, body = start, run.core.translate(_TO_URLSAFE) if urlsafe else run.core
    before = data[start - 1] if start > pos else -1  # (data[:pos] is sent)
    # a raw base64 character next to the match is its boundary character, escaped or not the
    # match itself (one that ends an escape, "B" of "%2B", is not: left as it is)
    if run.k and before in members and not _ESCAPE_END.search(data, max(0, start - 1 - CONTEXT), start):
        head, body = start - 1, run.lead(before, alphabet) + body
    if run.end and run.whole:
        body += run.trail(spelling[-1], alphabet)
    elif run.end and after in members:
        body += run.trail(after, alphabet)
        end += 1
    return head, body, end
