"""The keys that encrypt credential values at rest: AES-256-GCM, kept in one key file (mode 0600).

Key file format (JSON)::

    {"version": 1, "current": "3f9a0c1e", "keys": {"3f9a0c1e": "<base64 of 32 bytes>", ...}}

New values are encrypted under ``current``; older keys stay until no stored value uses them, so a
rotation never strands a ciphertext. A blob is ``nonce (12 bytes) + ciphertext + tag``; the caller
binds it to its place with associated data (the store uses claim, credential name and version), so
a blob copied elsewhere fails to decrypt.

The file is only ever replaced whole: written to a temp file in the same folder (created 0600 by
``mkstemp``, so no process-wide umask change is needed), fsynced, ``os.replace``d over the old one,
and the folder fsynced, all under an exclusive ``flock`` on the folder, so two processes (the proxy
and a sidecar) never lose each other's keys. A file that group or others may access, or that does
not parse, is refused with a message naming the file and the fault, never a key.

Errors (both :class:`proxy.core.errors.SurrogateError`): :class:`KeyFileError` (the file is unsafe,
malformed or unwritable) and :class:`DecryptError` (unknown key id, or the blob fails to
authenticate).
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import json
import os
import re
import secrets
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from proxy.core.errors import SurrogateError

NONCE_BYTES = 12
_TAG_BYTES = 16
_KEY_ID = re.compile(r"[0-9a-f]{8}")

# (current key id, key id -> key) -> the same, changed
type _Change = Callable[[str, dict[str, bytes]], tuple[str, dict[str, bytes]]]


class KeyFileError(SurrogateError):
    """The key file is group/other-accessible, malformed, or cannot be written."""


class DecryptError(SurrogateError):
    """A stored blob does not decrypt: unknown key id, corruption, or moved from another place."""


@dataclass(frozen=True, slots=True, repr=False)  # no repr: it would show key material
class _Keys:
    raw: bytes  # the file's bytes as last read, to notice another process's change
    current: str
    ciphers: dict[str, AESGCM]
    material: dict[str, bytes]


def _parse(path: Path, raw: bytes) -> _Keys:
    def bad(what: str) -> KeyFileError:
        return KeyFileError(f"key file {path} {what}")

    try:
        doc = json.loads(raw)
    except ValueError:
        raise bad("is not valid JSON") from None
    if not isinstance(doc, dict) or doc.get("version") != 1:
        raise bad('must be a JSON object with "version": 1')
    keys = doc.get("keys")
    if not isinstance(keys, dict) or not keys:
        raise bad('has no "keys" object with at least one key')
    material: dict[str, bytes] = {}
    for kid, text in keys.items():
        if not _KEY_ID.fullmatch(kid):
            raise bad(f"has a malformed key id {kid!r} (want 8 lowercase hex digits)")
        try:
            key = base64.b64decode(text, validate=True) if isinstance(text, str) else b""
        except binascii.Error:
            key = b""
        if len(key) != 32:
            raise bad(f"key {kid} is not base64 of exactly 32 bytes")
        material[kid] = key
    current = doc.get("current")
    if not isinstance(current, str) or current not in material:
        raise bad('has a "current" that names no key in "keys"')
    return _Keys(raw, current, {k: AESGCM(v) for k, v in material.items()}, material)


def _dump(current: str, material: dict[str, bytes]) -> bytes:
    keys = {k: base64.b64encode(v).decode("ascii") for k, v in sorted(material.items())}
    return json.dumps({"version": 1, "current": current, "keys": keys}, indent=2).encode() + b"\n"


def _read(path: Path) -> bytes:
    """The file's bytes, after checking it is a regular file no one but the owner can access."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise KeyFileError(f"cannot read key file {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise KeyFileError(f"key file {path} is not a regular file")
        if st.st_mode & 0o077:
            raise KeyFileError(
                f"key file {path} is accessible by group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
                f"it must be 0600: chmod 600 {path}"
            )
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read()
    finally:
        os.close(fd)


class KeyRing:
    """The AES-256-GCM keys of one key file. ``repr`` shows key ids, never key material."""

    __slots__ = ("_keys", "_lock", "_path")

    def __init__(self, path: Path, keys: _Keys) -> None:
        self._path = path
        self._keys = keys  # replaced whole, never mutated: readers need no lock
        self._lock = threading.Lock()

    @classmethod
    def load_or_create(cls, path: Path) -> KeyRing:
        """Load the key file at ``path``, creating it (one fresh key, mode 0600) when absent."""
        path = Path(path)
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as e:
            raise KeyFileError(f"cannot create the folder of key file {path}: {e.strerror}") from None
        if not path.exists():
            with _locked_dir(path) as dir_fd:
                if not path.exists():  # another process may have created it while we waited
                    kid = secrets.token_hex(4)
                    _replace(path, _dump(kid, {kid: AESGCM.generate_key(bit_length=256)}), dir_fd)
        return cls(path, _parse(path, _read(path)))

    @property
    def path(self) -> Path:
        return self._path

    @property
    def current(self) -> str:
        """The id of the key new values are encrypted under."""
        return self._keys.current

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(sorted(self._keys.ciphers))

    def encrypt(self, plaintext: bytes, aad: bytes) -> tuple[str, bytes]:
        """Encrypt under the current key: ``(key id, nonce + ciphertext)``."""
        keys = self._keys
        nonce = os.urandom(NONCE_BYTES)
        return keys.current, nonce + keys.ciphers[keys.current].encrypt(nonce, plaintext, aad)

    def decrypt(self, key_id: str, blob: bytes, aad: bytes) -> bytes:
        """Decrypt a blob from :meth:`encrypt`; raises :class:`DecryptError`."""
        cipher = self._keys.ciphers.get(key_id)
        if cipher is None:  # another process may have added it since we loaded
            self.refresh()
            cipher = self._keys.ciphers.get(key_id)
        if cipher is None:
            raise DecryptError(f"no key {key_id!r} in key file {self._path}")
        if len(blob) < NONCE_BYTES + _TAG_BYTES:
            raise DecryptError(f"stored value under key {key_id} is truncated")
        try:
            return cipher.decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], aad)
        except InvalidTag:
            raise DecryptError(
                f"stored value under key {key_id} fails authentication (corrupted, or not written "
                "for this place)"
            ) from None

    def refresh(self) -> None:
        """Re-read the key file; cheap when it has not changed (one read, one compare)."""
        with self._lock:
            raw = _read(self._path)
            if raw != self._keys.raw:
                self._keys = _parse(self._path, raw)

    def add_key(self) -> str:
        """Add a fresh key, make it current and persist; older keys stay for older values."""
        kid = secrets.token_hex(4)
        self._update(lambda cur, keys: (kid, {**keys, kid: AESGCM.generate_key(bit_length=256)}))
        return kid

    def retire(self, key_id: str) -> bool:
        """Remove a key no value uses any more (False when already gone); the current key is refused."""
        if key_id not in self._keys.ciphers:
            self.refresh()
        if key_id == self._keys.current:
            raise ValueError(f"key {key_id} is the current key of {self._path}; add a new key first")
        if key_id not in self._keys.ciphers:
            return False
        self._update(lambda cur, keys: (cur, {k: v for k, v in keys.items() if k != key_id}))
        return True

    def _update(self, change: _Change) -> None:
        with self._lock, _locked_dir(self._path) as dir_fd:
            keys = _parse(self._path, _read(self._path))  # another process's keys are kept
            current, material = change(keys.current, keys.material)
            if current == keys.current and material.keys() == keys.material.keys():
                self._keys = keys
                return
            raw = _dump(current, material)
            _replace(self._path, raw, dir_fd)
            self._keys = _parse(self._path, raw)

    def __repr__(self) -> str:
        return f"KeyRing(path={str(self._path)!r}, current={self.current!r}, keys={list(self.key_ids)!r})"

    __str__ = __repr__

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("a KeyRing is not picklable")


@contextmanager
def _locked_dir(path: Path) -> Iterator[int]:
    """An exclusive flock on the key file's folder (held across processes and threads)."""
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise KeyFileError(f"cannot open the folder of key file {path}: {e.strerror}") from None
    try:
        fcntl.flock(dir_fd, fcntl.LOCK_EX)
        yield dir_fd
    finally:
        os.close(dir_fd)  # closing releases the lock


def _replace(path: Path, data: bytes, dir_fd: int) -> None:
    """Atomically and durably replace ``path`` with ``data`` (mode 0600)."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise KeyFileError(f"cannot write key file {path}: {e.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        os.fsync(dir_fd)
    except OSError as e:
        with suppress(OSError):
            os.unlink(tmp)
        raise KeyFileError(f"cannot write key file {path}: {e.strerror}") from None
