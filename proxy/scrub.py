"""Scrubbing: secret → placeholder in what comes back, so an upstream that reflects a secret
(an echo endpoint, an error page, a token-info call) cannot hand it to the sandbox.

:class:`Scrubber` works on a stream of chunks. It replaces every complete occurrence of a
secret, in any of the forms below, and holds back only the longest tail of a chunk that could
still be the start of one, so a secret split across two reads is still caught while an SSE event
that cannot be a secret's start goes out in the same read. The carry is bounded by the longest
form (at most 6 bytes per secret byte, for ``\\u`` escapes) minus one byte. The output is the
same whatever the chunking: a property the tests check.

Forms caught, for a secret S and its placeholder P:

- **S itself, and S with any of its characters escaped**, in any mix: percent-encoding of the
  character's UTF-8 bytes with upper- or lower-case hex (RFC 3986 §2.1), ``+`` for a space
  (application/x-www-form-urlencoded), JSON ``\\uXXXX`` of any character, upper- or lower-case
  hex, with a surrogate pair beyond the BMP (RFC 8259 §7), and JSON's ``\\/``, ``\\"``, ``\\\\``.
  Replaced by P as it is: a placeholder is ``surr_`` and ASCII letters and digits, which need no
  escaping in a URL, a form or a JSON string.
- **Base64 of S**, standard and URL-safe alphabets (RFC 4648 §4, §5), its characters possibly
  percent- or JSON-escaped as above (``%2B``, ``\\/``):
    * the whole encoding of S alone, padded or not: replaced by the encoding of P in the same
      alphabet and padding, so a client that decodes it reads P (when S's encoding needs no
      padding, padded and unpadded spellings are one string, and P's encoding is given padded);
    * S inside a longer encoded run (``Basic`` credentials ``user:S``, a JWT, a JSON blob): S
      starts at one of three bit alignments, and for each the characters fully determined by S
      (all but at most 2 at the start and 2 at the end, which mix in the neighbouring bytes) are
      matched. Replaced by the same slice of P's encoding at the same alignment: the secret is
      gone, but a client decoding the run reads P with its first and last byte possibly
      altered, and, unless ``len(P) ≡ len(S) (mod 3)``, shifted bytes after it. Only slices of at
      least 8 characters are matched (secrets of 6 bytes or more): shorter ones would hit
      unrelated base64 text.

Not caught (documented limits): double encoding (``%2541``), HTML character references
(``&#x41;``), base64 with line breaks inside S's slice (MIME, PEM), base64 of an escaped S,
other encodings (hex, base32, compression inside the body), and S split by anything the forms
above do not produce. The leftover boundary characters of a base64 slice carry at most 4 bits
of S's first and last bytes.

Speed: Python's ``re`` scans a plain-string alternation at ~150 MB/s but the escape-aware one
at ~5-10 MB/s, so the latter runs only within reach of an escape sequence; text dense with
escapes (JSON with many ``\\/`` or ``\\"``) is scrubbed at that slower rate (see bench/scrub.py).

Pure; no I/O.
"""

from __future__ import annotations

import base64
import functools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

Unit = tuple[bytes, ...]  # the byte strings one character of a form may be written as

MIN_BASE64 = 8  # characters: shorter base64 slices are not matched (false positives)
_JSON_SHORT = {"/": b"\\/", '"': b'\\"', "\\": b"\\\\"}


def _cases(text: str) -> list[str]:
    """Every upper/lower-case spelling of the hex digits in ``text``."""
    out = [""]
    for ch in text:
        out = [o + c for o in out for c in dict.fromkeys((ch.upper(), ch.lower()))]
    return out


def _unit(ch: str) -> Unit:
    raw = ch.encode()
    pct = "".join(f"%{b:02X}" for b in raw)
    cp = ord(ch)
    json_u = [f"\\u{cp:04X}"] if cp <= 0xFFFF else []
    if cp > 0xFFFF:  # a surrogate pair (RFC 8259 §7); two spellings only, not every case mix
        hi, lo = 0xD800 + ((cp - 0x10000) >> 10), 0xDC00 + ((cp - 0x10000) & 0x3FF)
        pair = f"\\u{hi:04X}\\u{lo:04X}"
        alts = [raw, pct.encode(), pct.lower().encode(), pair.encode(), pair.lower().encode()]
    else:
        alts = [raw, *(p.encode() for p in _cases(pct))]
        alts += [("\\u" + h).encode() for j in json_u for h in _cases(j[2:])]
    if ch == " ":
        alts.append(b"+")
    if ch in _JSON_SHORT:
        alts.append(_JSON_SHORT[ch])
    return tuple(dict.fromkeys(alts))


@dataclass(frozen=True, slots=True)
class _Form:
    units: tuple[Unit, ...]
    replacement: bytes
    rank: int  # the unescaped length: longer forms are tried first at the same position


def _escaped(text: str, replacement: bytes) -> _Form:
    return _Form(tuple(_unit(c) for c in text), replacement, len(text))


def _b64(data: bytes, urlsafe: bool) -> str:
    return (base64.urlsafe_b64encode if urlsafe else base64.standard_b64encode)(data).decode()


def _base64_forms(secret: bytes, placeholder: bytes) -> list[_Form]:
    forms = []
    for urlsafe in (False, True):
        whole, whole_p = _b64(secret, urlsafe), _b64(placeholder, urlsafe)
        for text, repl in ((whole, whole_p), (whole.rstrip("="), whole_p.rstrip("="))):
            if len(text) >= MIN_BASE64:
                forms.append(_escaped(text, repl.encode()))
        for k in range(3):  # S starts k bytes into a 3-byte group of the run
            lead, n, m = -(-8 * k // 6), len(secret), len(placeholder)
            core = _b64(b"\0" * k + secret, urlsafe)[lead : 8 * (k + n) // 6]
            core_p = _b64(b"\0" * k + placeholder, urlsafe)[lead : 8 * (k + m) // 6]
            if len(core) >= MIN_BASE64:
                forms.append(_escaped(core, core_p.encode()))
    return forms


def _forms(secret: bytes, placeholder: bytes) -> list[_Form]:
    try:
        text = secret.decode("utf-8")
    except UnicodeDecodeError:
        forms = [_Form(tuple((bytes([b]),) for b in secret), placeholder, len(secret))]
    else:
        forms = [_escaped(text, placeholder)]
    return forms + _base64_forms(secret, placeholder)


# the escapes the forms use: %XX, \\uXXXX, \\/ \\" \\\\ (and + for a space, added when needed)
_ESCAPE = rb"%[0-9A-Fa-f]{2}|\\u[0-9A-Fa-f]{4}|\\[/\"\\]"


# _ESCAPE's escapes as fixed strings over a skeleton of the data: hex digits read "h", the bytes an
# escape is made of stay, everything else is NUL.
_SKELETON = bytes(
    ord("h") if chr(b) in "0123456789abcdefABCDEF" else b if chr(b) in '%\\u/"+' else 0 for b in range(256)
)
_KINDS = (b"%hh", b"\\uhhhh", b"\\/", b'\\"', b"\\\\")


def _regex(units: tuple[Unit, ...]) -> bytes:
    return b"".join(b"(?:" + b"|".join(re.escape(a) for a in u) + b")" for u in units)


def _partial(units: tuple[Unit, ...], data: bytes, pos: int) -> bool:
    """True when ``data[pos:]`` is a proper prefix of some spelling of ``units``."""
    end, stack = len(data), [(0, pos)]
    while stack:
        u, p = stack.pop()
        if p == end:
            if u < len(units):
                return True
            continue
        if u == len(units):
            continue
        for alt in units[u]:
            if data.startswith(alt, p):
                stack.append((u + 1, p + len(alt)))
            elif end - p < len(alt) and alt.startswith(data[p:]):
                return True
    return False


@dataclass(frozen=True, slots=True)
class _Compiled:
    forms: list[_Form]
    each: list[re.Pattern[bytes]]
    raw: dict[bytes, bytes]
    literal: re.Pattern[bytes] | None
    full: re.Pattern[bytes] | None
    escape: re.Pattern[bytes]
    starts: dict[int, list[_Form]]
    longest: int
    kinds: tuple[bytes, ...]  # each kind of escape, as it reads in a skeleton (see _escapes)
    first: re.Pattern[bytes]  # any byte a form may start with


@functools.lru_cache(maxsize=64)
def _compile(pairs: tuple[tuple[bytes, bytes], ...], escapes: bool) -> _Compiled:
    """The patterns for ``pairs``, built once per set of pairs (a few ms: not per response)."""
    forms: dict[tuple[Unit, ...], _Form] = {}
    for secret, placeholder in pairs:
        if not secret:
            continue
        made = _forms(secret, placeholder) if escapes else [_Form(((secret,),), placeholder, len(secret))]
        for f in made:
            forms.setdefault(f.units, f)
    # longest first, so that a secret that contains another is replaced whole
    ordered = sorted(forms.values(), key=lambda f: f.rank, reverse=True)
    # Python's re is fast on an alternation of plain strings (~150 MB/s) and slow on one of
    # escape-aware forms (~5 MB/s), so the escape-aware pattern only runs near an escape.
    raw: dict[bytes, bytes] = {}
    for f in ordered:
        raw.setdefault(b"".join(u[0] for u in f.units), f.replacement)
    # the lookahead on the possible first bytes lets re skip most positions at once (~2.5x)
    first = sorted({a[0] for f in ordered for a in f.units[0]})
    lookahead = b"(?=[" + b"".join(re.escape(bytes([b])) for b in first) + b"])"
    starts: dict[int, list[_Form]] = {}
    for f in ordered:
        for b in dict.fromkeys(a[0] for a in f.units[0]):
            starts.setdefault(b, []).append(f)
    spaces = any(u[0] == b" " for f in ordered for u in f.units)
    return _Compiled(
        forms=ordered,
        each=[re.compile(_regex(f.units)) for f in ordered],
        raw=raw,
        literal=re.compile(b"|".join(re.escape(r) for r in raw)) if ordered else None,
        full=re.compile(lookahead + b"(?:" + b"|".join(_regex(f.units) for f in ordered) + b")")
        if ordered
        else None,
        escape=re.compile(_ESCAPE + (rb"|\+" if spaces else b"")),
        starts=starts,
        kinds=_KINDS + ((b"+",) if spaces else ()),
        first=re.compile(b"[" + b"".join(re.escape(bytes([b])) for b in first) + b"]" if first else b"(?!)"),
        longest=max((sum(max(map(len, u)) for u in f.units) for f in ordered), default=0),
    )


class Scrubber:
    """``pairs``: (secret, placeholder) byte strings; empty secrets are ignored.

    ``escapes=False`` matches the raw secrets only.
    """

    def __init__(self, pairs: Iterable[tuple[bytes, bytes]], escapes: bool = True) -> None:
        c = _compile(tuple(pairs), escapes)
        self._forms, self._each, self._raw, self._literal = c.forms, c.each, c.raw, c.literal
        self._full, self._escape, self._starts, self._longest = c.full, c.escape, c.starts, c.longest
        self._kinds, self._first = c.kinds, c.first
        self._skeleton: tuple[bytes, bytes] | None = None  # (data, its skeleton), see _escapes
        self._carry = b""

    @property
    def active(self) -> bool:
        return self._literal is not None

    @property
    def longest(self) -> int:
        """Bytes of the longest spelling of any form: the carry stays below this."""
        return self._longest

    def _next(self, data: bytes, pos: int) -> tuple[int, int, bytes] | None:
        """The match ``re`` would find with the whole escape-aware alternation from ``pos``:
        (start, end, replacement), or None.

        A spelling with an escape in it holds an escape ``_ESCAPE`` finds, so a match can only
        start within ``longest`` bytes before one; elsewhere only the plain spellings can match,
        and the plain-string alternation finds those.
        """
        assert self._literal is not None and self._full is not None
        lit = self._literal.search(data, pos)
        limit = lit.start() if lit else len(data)
        n = self._longest
        escapes = self._escapes(data, pos)
        t = next(escapes, None)
        while t is not None:
            start, last = max(pos, t - n + 1), t
            if start > limit:
                break
            # one search over a run of escapes whose start windows touch
            while (t := next(escapes, None)) is not None and t < last + n:
                last = t
            m = self._full.search(data, start, last + n)
            if m is not None and m.start() <= last:
                f = next(i for i, rx in enumerate(self._each) if rx.match(data, m.start()))
                return m.start(), m.end(), self._forms[f].replacement
            pos = last + 1
        return (lit.start(), lit.end(), self._raw[lit.group()]) if lit else None

    def _escapes(self, data: bytes, pos: int) -> Iterator[int]:
        """Where escapes start in ``data`` from ``pos``, in order.

        Few ``%``/``\\`` bytes (text): find each with memchr and check it. Many (binary data):
        map ``data`` to a skeleton (hex digits to ``h``, the escape bytes kept, all else NUL) in
        which each kind of escape is one fixed string bytes.find locates, so only real escapes
        cost a Python step.
        """
        heads: tuple[bytes, ...] = (b"%", b"\\", b"+") if b"+" in self._kinds else (b"%", b"\\")
        if sum(data.count(h, pos) for h in heads) <= 64:
            text, kinds, check = data, heads, True
        else:
            if self._skeleton is None or self._skeleton[0] is not data:
                self._skeleton = (data, data.translate(_SKELETON))
            text, kinds, check = self._skeleton[1], self._kinds, False
        nxt = {k: text.find(k, pos) for k in kinds}
        while live := [i for i in nxt.values() if i >= 0]:
            i = min(live)
            if not check or self._escape.match(data, i):
                yield i
            for k, at in nxt.items():
                if at == i:
                    nxt[k] = text.find(k, i + 1)

    def _scan(self, data: bytes, cut: int) -> tuple[bytes, int]:
        """Replace the matches starting before ``cut``; returns the output and where it stops."""
        out: list[bytes] = []
        pos = 0
        while pos < cut and (m := self._next(data, pos)) is not None and m[0] < cut:
            start, end, replacement = m
            out += (data[pos:start], replacement)
            # A complete match that runs into the held tail cannot grow (else the tail would
            # start at the match): send it replaced, hold back only what follows it.
            pos, cut = end, max(cut, end)
        out.append(data[pos:cut])
        return b"".join(out), cut

    def _held(self, data: bytes) -> int:
        """Length of the longest tail of ``data`` that could still grow into a match."""
        tail = len(data) - min(self._longest - 1, len(data))
        for m in self._first.finditer(data, tail):  # leftmost first: the longest tail
            i = m.start()
            if i < len(data) and any(_partial(f.units, data, i) for f in self._starts[data[i]]):
                return len(data) - i
        return 0

    def feed(self, chunk: bytes) -> bytes:
        """Scrub ``chunk`` (with what was held back); returns what may be sent now."""
        if self._literal is None:
            return chunk
        data = self._carry + chunk
        # Hold back the longest tail that could start a match: the next read may complete it
        # (also when it already holds a shorter match that a longer form extends).
        out, cut = self._scan(data, len(data) - self._held(data))
        self._carry = data[cut:]
        return out

    def finish(self) -> bytes:
        """The held-back tail at the end of the stream, scrubbed."""
        rest, self._carry = self._carry, b""
        return self.scrub(rest)

    def scrub(self, data: bytes) -> bytes:
        """Scrub a whole value at once (a header value)."""
        return self._scan(data, len(data))[0] if self._literal is not None else data
