"""Which values of a credential are live: the ones response scrubbing must still catch.

A rotated secret may stay valid upstream for a while (an API key with an overlap period, an
OAuth access token until it expires), so an upstream can still reflect it. A credential's live
values are its current value plus its previous values that were superseded less than
:data:`LIVE_SECONDS` ago, at most :data:`LIVE_VERSIONS` of them (the newest), where known:

- store credentials (control API, OAuth capture): the store keeps the sealed previous values in
  ``credential_history`` (same encryption, associated data of their own version); they survive
  a restart, and are dropped with the credential, or once outside the window at the next write;
- ``file:`` sources: the values this process read before the file changed, in memory (lost on
  restart or when a rules reload builds new sources);
- ``env:`` sources are read once: only the current value.
"""

from __future__ import annotations

import contextlib

from proxy.core.errors import SecretUnavailable
from proxy.core.policy import Credential
from proxy.core.secrets import Secret

LIVE_SECONDS = 24 * 3600.0
LIVE_VERSIONS = 8


def live_values(credential: Credential, now: float) -> list[Secret]:
    """The credential's current value (when readable) and its live previous ones, newest first."""
    out: list[Secret] = []
    with contextlib.suppress(SecretUnavailable):  # nothing read, nothing to hide
        out.append(credential.secret()[0])
    previous = getattr(credential.source, "previous", None)
    if previous is not None:
        out += [s for s in previous(now - LIVE_SECONDS) if s not in out]
    return out
