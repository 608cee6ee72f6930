"""The header scan's cost per request with 1 and with 10,000 placeholders registered (in-process).

Placeholders have one recognisable format, so a request's headers are scanned by one regex pass
and each hit is one dict lookup: the cost must not grow with the number registered. Template
placeholders (proxy/core/templates.py) are in that one pass too: ``template`` registers
placeholders of a shipped template instead of ``surr_`` ones (the cost must not change either),
and :func:`body_scan_us` times the streaming body swap over a body holding no placeholder.

``python bench/scan.py`` prints every figure (in-process, a few seconds).
"""

from __future__ import annotations

import tempfile
import timeit
from pathlib import Path

from proxy.core import bodies, placeholders, templates
from proxy.core.hosts import HostPattern
from proxy.core.policy import Credential
from proxy.core.substitute import substitute_request
from proxy.rules.sources import ValueSource


def scan_cost_us(registered: int, number: int = 20_000, template: str | None = None) -> float:
    """Microseconds per call of substitute_request on 5 headers, one registered placeholder swapped
    (``template``: the registered placeholders are minted of that shipped template)."""
    with tempfile.TemporaryDirectory(prefix="surrogate-bench-scan-") as tmp:
        return _cost(registered, number, Path(tmp), template)


def _cost(registered: int, number: int, tmp: Path, template: str | None) -> float:
    (tmp / "v").write_text("x")
    source = ValueSource.parse("file:v", tmp)
    creds: dict[bytes, Credential] = {}
    for _ in range(registered):
        ph = templates.mint(templates.get(template)) if template else placeholders.generate()
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


# A JSON body of the kind an agent uploads (prose, code, keys), with no placeholder in it but the
# letters every prefix begins with ("s", "g", "x", "A"), and "sk-"/"ghp" near-misses.
_TEXT = (
    b'{"role": "user", "content": "Summarise the task-list: ask-me, risk-based sk-tests, '
    b'github pages, xox ghpages, AKIAs and surr notes. def f(x): return x * 2\\n"}, '
)


def body_scan_us(size: int = 1 << 20, read: int = 64 * 1024, number: int = 20) -> float:
    """Microseconds per MiB of the streaming body swap (bodies.Swapper) fed ``read``-byte reads of
    a ``size``-byte body holding no placeholder."""
    body = (_TEXT * (size // len(_TEXT) + 1))[:size]
    reads = [body[i : i + read] for i in range(0, size, read)]

    def run() -> None:
        s = bodies.Swapper(lambda ph: None)
        for r in reads:
            s.feed(r)
        s.finish()

    return timeit.timeit(run, number=number) / number * 1e6 / (size / (1 << 20))


if __name__ == "__main__":
    print(f"header scan, 1 surr_ registered:      {scan_cost_us(1):7.2f} us/request")
    print(f"header scan, 10,000 surr_ registered: {scan_cost_us(10_000):7.2f} us/request")
    for name in ("github_classic", "openai", "aws_access_key_id"):
        print(f"header scan, 10,000 {name} registered: {scan_cost_us(10_000, template=name):7.2f} us/request")
    print(f"body swap, no placeholder:            {body_scan_us():7.0f} us/MiB")
