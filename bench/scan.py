"""The header scan's cost per request with 1 and with 10,000 placeholders registered (in-process).

Placeholders have one recognisable format, so a request's headers are scanned by one regex pass
and each hit is one dict lookup: the cost must not grow with the number registered.
"""

from __future__ import annotations

import tempfile
import timeit
from pathlib import Path

from proxy.core import placeholders
from proxy.core.hosts import HostPattern
from proxy.core.policy import Credential
from proxy.core.substitute import substitute_request
from proxy.rules.sources import ValueSource


def scan_cost_us(registered: int, number: int = 20_000) -> float:
    """Microseconds per call of substitute_request on 5 headers, one registered placeholder swapped."""
    with tempfile.TemporaryDirectory(prefix="surrogate-bench-scan-") as tmp:
        return _cost(registered, number, Path(tmp))


def _cost(registered: int, number: int, tmp: Path) -> float:
    (tmp / "v").write_text("x")
    source = ValueSource.parse("file:v", tmp)
    creds: dict[bytes, Credential] = {}
    for _ in range(registered):
        ph = placeholders.generate()
        creds[ph.encode()] = Credential("c", ph, (HostPattern.parse("api.test"),), source)
    sent = next(iter(creds))  # a registered one, so the swap itself is measured too
    fields = [
        (b"Host", b"api.test"),
        (b"User-Agent", b"bench/1.0"),
        (b"Accept", b"*/*"),
        (b"Authorization", b"Bearer " + sent),
        (b"X-Trace", b"surr_notregistered0000000000000"),
    ]
    t = timeit.timeit(
        lambda: substitute_request(fields, b"/v1/x?y=1", "api.test", True, creds, ()), number=number
    )
    return t / number * 1e6
