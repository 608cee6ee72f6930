"""Placeholders: the recognisable strings a sandbox holds instead of real secrets.

Format: ``surr_`` followed by 16 to 64 ASCII letters or digits, not followed by another letter
or digit (e.g. ``surr_4fQ9xT2LmB7pR1sK8vN3wY6zA0cE5hJd``). Because every placeholder has this
shape, finding them is one regex pass over a value, whose cost does not depend on how many
placeholders are registered: each hit is then one dict lookup.

A string of this shape that is not registered for the claim is left alone (it is not a secret).

**Checksum.** Placeholders that surrogate generates end in ``CHECKSUM_LENGTH`` (6) characters that
are a checksum of the rest: base62 of BLAKE2b-64 over ``surr_`` + the random part, reduced
modulo 62**6. No secret is involved: it tells a string that surrogate issued (to some claim,
at some time) from one that merely has the shape, with a chance of 1 in 62**6 (≈ 5.7e10) for a
random string. Compatibility: a registered placeholder is honoured whether or not it carries a
checksum (rules files hold hand-written ones such as ``surr_DemoGithubPlaceholder0001``); only
the *forgery* check needs the checksum: a string with a valid checksum that is not registered
for the requesting claim (another claim's, a deleted one, a forged one) is refused as
``forged_placeholder`` (see :mod:`proxy.core.forgery`). A string without a valid checksum that is
not registered stays inert, as before.

**Templates.** Placeholders may also have a provider's shape (``ghp_`` + 36, ``sk-ant-api03-`` +
95, ...: :mod:`proxy.core.templates`), with surrogate's checksum in the template's alphabet.
:data:`PATTERN` recognises ``surr_`` and every template shape in one alternation: every
recogniser in the proxy goes through it (:func:`find`, :func:`is_placeholder`, :data:`LIKE`,
:data:`PREFIXES`), so a template placeholder is swapped, scanned for forgery, redacted and
exempted wherever a ``surr_`` one is. A real token of a provider's shape that is not registered
and has no valid surrogate checksum stays inert, exactly as an unregistered ``surr_`` string.
"""

from __future__ import annotations

import re
import secrets
import string

from proxy.core import templates

PREFIX = "surr_"
_BODY = f"[{string.ascii_letters}{string.digits}]"
_SURR = f"{PREFIX}{_BODY}{{16,64}}(?![A-Za-z0-9])"
_ALPHABET = string.ascii_letters + string.digits
# Template shapes, longest prefix first (each ends where its run of letters and digits ends).
TEMPLATES: tuple[templates.Template, ...] = tuple(
    sorted(templates.SHIPPED.values(), key=lambda t: -len(t.prefix))
)


def _run(t: templates.Template) -> str:
    """What follows ``t``'s prefix: its letters and digits, then no more of them."""
    cls = "[A-Z0-9]" if t.alphabet == templates.UPPER36 else _BODY
    return f"{cls}{{{t.length}}}(?![A-Za-z0-9])"


def _shape(t: templates.Template) -> str:
    return re.escape(t.prefix) + _run(t)


_SHAPES = {t.name: re.compile(_shape(t)) for t in TEMPLATES}
# ONE scanner for every recogniser (substitution, forgery, hooks, audit, dry runs): ``surr_`` and
# every template shape in one alternation, compiled once; its cost is bounded by the number of
# shipped templates (templates.MAX_TEMPLATES), never by the number of credentials.
PATTERN = re.compile("|".join([_SURR, *(_shape(t) for t in TEMPLATES)]))
PATTERN_BYTES = re.compile(PATTERN.pattern.encode("ascii"))
PREFIXES: tuple[str, ...] = (PREFIX, *(t.prefix for t in TEMPLATES))


def _families() -> tuple[re.Pattern[bytes], ...]:
    """PATTERN_BYTES cut by the first character of the prefix: one pattern per family (``s``:
    surr_, sk-, sk-proj-, sk_live_ ...; ``g``: ghp_ ... github_pat_; ``xoxb-``; ``AKIA``), each
    the family's common literal prefix then the alternation of its shapes. A literal prefix lets
    the regex engine skip to its occurrences (about 40 us per 64 KiB read, whatever its length);
    an alternation of different prefixes tries every position: 10x slower on a body holding
    none (bench/scan.py).
    At one position at most one shape of all can match (two families differ in their first
    character; where one prefix begins another, as ``sk-`` does ``sk-proj-``, the longer has a
    ``-`` or ``_`` where the shorter's run of letters and digits would be), so the leftmost of
    the families' leftmost matches is PATTERN_BYTES's (:func:`find`; a hypothesis test checks)."""
    runs = {PREFIX: f"{_BODY}{{16,64}}(?![A-Za-z0-9])", **{t.prefix: _run(t) for t in TEMPLATES}}
    by_start: dict[str, list[str]] = {}
    for p in PREFIXES:
        by_start.setdefault(p[:1], []).append(p)
    out = []
    for group in by_start.values():
        common = group[0]
        while not all(q.startswith(common) for q in group):
            common = common[:-1]
        alts = "|".join(re.escape(p[len(common) :]) + runs[p] for p in sorted(group, key=len, reverse=True))
        out.append(re.compile(f"{re.escape(common)}(?:{alts})".encode("ascii")))
    return tuple(out)


_FAMILIES = _families()  # bounded by the distinct first characters of the prefixes
SHORTEST = min(21, *(t.total for t in TEMPLATES))
LONGEST = max(len(PREFIX) + 64, *(t.total for t in TEMPLATES))
# Every length a placeholder may have: surr_ + 16..64, and each template's.
LENGTHS: tuple[int, ...] = tuple(sorted({*range(21, 70), *(t.total for t in TEMPLATES)}))
# Most letters and digits after each prefix that a placeholder has.
MAX_BODY: dict[bytes, int] = {PREFIX.encode(): 64, **{t.prefix.encode(): t.length for t in TEMPLATES}}


def _like(prefix: str) -> str:
    escaped = "".join(
        {"_": "(?:_|%5[Ff])", "-": "(?:-|%2[Dd])"}.get(c, re.escape(c)) for c in prefix
    )
    return f"(?i:{escaped})"


# A placeholder-shaped run in any letter case or with its "_"/"-" percent-encoded, with all the
# letters and digits after it (the audit's redaction of names a sandbox chose).
LIKE = re.compile(
    "|".join(
        [
            f"{_like(PREFIX)}[A-Za-z0-9]{{16,}}",
            *(f"{_like(t.prefix)}[A-Za-z0-9]{{{t.length},}}" for t in TEMPLATES),
        ]
    )
)
LIKE_HINTS: tuple[str, ...] = tuple(dict.fromkeys(p[:2].lower() for p in PREFIXES))


def is_placeholder(text: str) -> bool:
    """True when ``text`` is exactly one placeholder: ``surr_`` or a template shape."""
    return PATTERN.fullmatch(text) is not None


def template_of(text: str) -> templates.Template | None:
    """The template whose shape ``text`` is exactly, or None (``surr_`` or no placeholder)."""
    for t in TEMPLATES:
        if text.startswith(t.prefix) and _SHAPES[t.name].fullmatch(text):
            return t
    return None


def describe(text: str) -> str:
    """``template github_classic (ghp_ + 36 of [A-Za-z0-9])`` or ``surr_`` for ``text``: what
    rules check and explain show (no value involved)."""
    t = template_of(text)
    return f"template {t.name} ({t.describe()})" if t else "surr_"


FORMATS = "'surr_' + 16..64 letters or digits, or a template shape (" + ", ".join(
    t.describe() for t in TEMPLATES
) + ")"

CHECKSUM_LENGTH = templates.CHECKSUM_LENGTH
checksum_in = templates.checksum_in
_CHECKSUM_SPACE = len(_ALPHABET) ** CHECKSUM_LENGTH


def checksum(stem: str) -> str:
    """The ``CHECKSUM_LENGTH`` base62 characters that end a generated placeholder whose other
    characters are ``stem`` (prefix included)."""
    return checksum_in(stem, _ALPHABET)


def has_valid_checksum(text: str) -> bool:
    """True when ``text`` is exactly one placeholder carrying surrogate's checksum (and, for a
    GitHub template, GitHub's CRC32 too), i.e. one surrogate generated or minted from a template
    (or a lucky 1-in-len(alphabet)**6 string)."""
    if not is_placeholder(text):
        return False
    t = template_of(text)
    if t is None:
        stem, tail = text[:-CHECKSUM_LENGTH], text[-CHECKSUM_LENGTH:]
        return checksum(stem) == tail
    start, end = templates.checksum_span(t)
    if t.github_crc32 and not templates.github_checksum_ok(text, t):
        return False  # every minted GitHub placeholder carries both: this one was not minted
    return checksum_in(text[:start], t.alphabet) == text[start:end]


def generate(length: int = 32) -> str:
    """A fresh random placeholder (``length`` characters after the prefix, 16..64), whose last 6
    characters are its checksum. Raises ValueError for another length."""
    if not 16 <= length <= 64:
        raise ValueError("placeholder length must be 16..64")
    stem = PREFIX + "".join(secrets.choice(_ALPHABET) for _ in range(length - CHECKSUM_LENGTH))
    return stem + checksum(stem)


def find(value: bytes) -> list[re.Match[bytes]]:
    """All placeholder-shaped runs in ``value``, left to right: exactly the matches of
    ``PATTERN_BYTES.finditer(value)`` (the leftmost match from where the last one ended, again
    and again), each family searched on its own (:func:`_families`)."""
    ahead = [m for f in _FAMILIES if (m := f.search(value)) is not None]
    out: list[re.Match[bytes]] = []
    while ahead:
        first = min(ahead, key=lambda m: m.start())
        out.append(first)
        end = first.end()
        nxt: list[re.Match[bytes]] = []
        for m in ahead:
            # the family that matched, and any whose next match starts before ``end``, search
            # again from there: a match may start inside the one found (``sk-…sk-…`` after a
            # ``surr_…sk``), where the family's own search did not look
            again = m.re.search(value, end) if m is first or m.start() < end else m
            if again is not None:
                nxt.append(again)
        ahead = nxt
    return out
