"""Canary secrets, and the scan that proves none of them leaked (DESIGN.md invariant 1).

Tests use :func:`make` for every real credential value they give the proxy: a distinctive random
string, remembered for the session. A test that writes such a value to a file the proxy reads
(``value: file:...``) does it with :func:`source`, which registers that one path as the secret's
source: the only file allowed to hold it. At the end of the session the root conftest scans every
file under pytest's basetemp (audit logs, stores and their -wal/-shm, stderr captures, CA dirs,
client outputs) with :func:`scan_tree`; modules also check the bytes their clients received with
:func:`assert_absent`.

A value is looked for in the forms a careless code path would write it in: raw, base64 (standard
and URL-safe, at each of the three byte alignments, as inside ``Basic user:secret``),
percent-encoded, JSON ``\\u``-escaped (every byte escaped, upper- and lower-case hex) and the
hex of its first 16 bytes (either case). A report names the file, the form and the canary's tag,
never the value.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import ahocorasick  # type: ignore[import-not-found]  # no stubs

_values: list[str] = []
_exempt: set[Path] = set()


def make(tag: str) -> str:
    """A fresh canary secret for this session: ``CANARY<tag><24 hex>`` (letters and digits only)."""
    value = f"CANARY{tag}{secrets.token_hex(12)}"
    _values.append(value)
    return value


def register(value: str) -> str:
    """Watch for a secret value a test made some other way (e.g. a fixed constant)."""
    _values.append(value)
    return value


def source(path: Path, value: str) -> Path:
    """Write ``value`` (and a newline) to ``path``, the secret's by-design source file."""
    path.write_text(value + "\n")
    return exempt(path)


def exempt(path: Path) -> Path:
    """Register one file that holds a canary by design (a test's record of what an upstream saw)."""
    _exempt.add(path.resolve())
    return path


def values() -> list[str]:
    return list(_values)


def exempted() -> frozenset[Path]:
    return frozenset(_exempt)


def forms(value: str) -> dict[str, bytes]:
    """The spellings of ``value`` that are searched for, by name."""
    raw = value.encode()
    out = {"raw": raw}
    for align in range(3):
        for name, encode in (("base64", base64.b64encode), ("base64url", base64.urlsafe_b64encode)):
            encoded = encode(b"\0" * align + raw)
            # the first group holds the alignment bytes, the last one depends on what follows
            form = encoded[4 if align else 0 : -4]
            if form not in out.values():  # URL-safe is often the same as standard
                out[f"{name}+{align}"] = form
    out["percent"] = "".join(f"%{b:02X}" for b in raw).encode()
    out["percent-lower"] = "".join(f"%{b:02x}" for b in raw).encode()
    out["json-escaped"] = "".join(f"\\u{b:04x}" for b in raw).encode()
    out["json-escaped-upper"] = "".join(f"\\u{b:04X}" for b in raw).encode()
    # hex, as h2 prints an event's bytes (lower case, the first 20 only: a GOAWAY's debug data in
    # mitmproxy's error message): the first 16 bytes, CANARY<tag> and a few random characters
    out["hex-head"] = raw[:16].hex().encode()
    out["hex-head-upper"] = raw[:16].hex().upper().encode()
    return out


def _tag(value: str) -> str:
    return value[: max(len(value) - 24, 8)] + "…"  # CANARY<tag>…: says which, not the value


class _Index:
    """Every form of every watched value in one Aho-Corasick automaton (pyahocorasick; bytes
    mapped 1:1 to code points through latin-1): a file is read once, in chunks, whatever the
    number of canaries and forms. (An earlier index searched each form's group only when the
    data held the group's common prefix; a registered value not spelled ``CANARY…`` emptied
    that prefix, and the session-end scans took 90 s of ``bytes in`` per canary per file.)"""

    def __init__(self, watched: Iterable[str]) -> None:
        self.automaton: Any = None
        self.longest = 0
        labels: dict[str, set[str]] = {}
        for value in dict.fromkeys(watched):
            for name, form in forms(value).items():
                if form:
                    labels.setdefault(form.decode("latin-1"), set()).add(f"{_tag(value)} as {name}")
        if labels:
            self.automaton = ahocorasick.Automaton()
            for word, hits in labels.items():
                self.automaton.add_word(word, tuple(sorted(hits)))
                self.longest = max(self.longest, len(word))
            self.automaton.make_automaton()

    def find(self, data: bytes) -> list[str]:
        return sorted(self._hits(data.decode("latin-1"))) if data else []

    def _hits(self, text: str) -> set[str]:
        if self.automaton is None or not text:
            return set()
        return {hit for _, hits in self.automaton.iter(text) for hit in hits}

    def find_file(self, path: Path, chunk: int = 1 << 20) -> list[str]:
        """The hits in one file, read ``chunk`` bytes at a time; consecutive chunks overlap by
        the longest form less one byte, so a form across a chunk boundary is still found."""
        found: set[str] = set()
        keep = self.longest - 1
        with path.open("rb") as f:
            tail = ""
            while block := f.read(chunk):
                text = tail + block.decode("latin-1")
                found |= self._hits(text)
                tail = text[-keep:] if keep > 0 else ""
        return sorted(found)


def find(data: bytes, watched: Iterable[str]) -> list[str]:
    """``"<tag> as <form>"`` for every watched value found in ``data``."""
    return _Index(watched).find(data)


def assert_absent(artifacts: Mapping[str, bytes], watched: Iterable[str] | None = None) -> None:
    """Fail naming the artifact and form when a canary (default: every one made) is in one."""
    index = _Index(_values if watched is None else watched)
    found = [f"{what}: {hit}" for what, data in artifacts.items() for hit in index.find(data)]
    assert not found, "canary secret found in " + "; ".join(found)


def scan_tree(root: Path, watched: Iterable[str], exempt: Iterable[Path] = ()) -> list[str]:
    """``"<path>: <tag> as <form>"`` for every file under ``root`` holding a watched value.

    Files in ``exempt`` (resolved paths) are skipped; sockets, FIFOs and unreadable files too.
    Each file is streamed once through one automaton of every form of every value; a file that
    is binary-identical to one already scanned (same size and BLAKE2b digest: a store's copies,
    a clone's objects) reports the hits of its twin without a second search.
    """
    index, skip = _Index(watched), {p.resolve() for p in exempt}
    hits: list[str] = []
    if index.automaton is None or not root.exists():
        return hits
    seen: dict[tuple[int, bytes], list[str]] = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink() or not path.is_file() or path.resolve() in skip:
            continue
        try:
            key = _digest(path)
            if key not in seen:
                seen[key] = index.find_file(path)
        except OSError:
            continue
        hits += [f"{path}: {hit}" for hit in seen[key]]
    return hits


def _digest(path: Path) -> tuple[int, bytes]:
    """(size, BLAKE2b digest) of a file's bytes, streamed."""
    with path.open("rb") as f:
        digest = hashlib.file_digest(f, "blake2b")
    return path.stat().st_size, digest.digest()
