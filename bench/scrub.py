"""Response scrubbing's cost (issue 6), measured side by side in one run, on loopback.

1. In process: :class:`proxy.core.scrub.Scrubber` over 256 KiB reads of 32 MB (4 MB for the last
   body), with 1 and 10 credentials, on six kinds of body: plain text, random bytes, JSON dense
   with the escapes that wake the escape-aware matcher (``\\"``, ``\\/``, ``\\u00e9``), an API's
   JSON (bench/upstreams.py), every byte value, and nothing but ``%73`` (escapes of a byte the
   secrets hold: the escape finder's and decoder's worst case); beside a plain copy.
2. Through surrogate: a 50 MB download by a claim with a credential (scrubbed) and by a claim
   without (plain streaming, the same proxy), and directly; MB/s, median of 3.
3. SSE: time from request to the first event on a kept-alive connection, directly, through the
   plain claim and through the scrubbed one, interleaved; median and p95 of 40.

Run: ``.venv/bin/python bench/scrub.py`` (about 1 minute; ``--in-process``: section 1 only).
Numbers vary with machine load: read the ratios, which are taken in the same run.
"""

from __future__ import annotations

import os
import ssl
import statistics
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

from harness import ProxyProcess  # noqa: E402
from servers import TestCA, Upstream  # noqa: E402
from upstreams import JSON_RECORD  # noqa: E402

from proxy.core.scrub import Scrubber  # noqa: E402

READ = 256 * 1024  # what surrogate reads from an upstream per event (proxy/engine/reads.py)
BIG = 50_000_000


def _bodies() -> dict[str, bytes]:
    size = 32 << 20
    text = (b"data: the quick brown fox jumps over the lazy dog 0123456789\n" * (size // 62))[:size]
    escaped = (b'{"text": "caf\\u00e9 \\"quoted\\" http:\\/\\/x.test\\/a"}\n' * (size // 50))[:size]
    api = (JSON_RECORD * (size // len(JSON_RECORD) + 1))[:size]
    every = bytes(range(256)) * (size // 256)  # a % and a \ every 256 bytes, as text
    # a hostile upstream's body of nothing but escapes of a byte the secrets hold ("s"): each is
    # decoded, in windows that merge into one per read
    hostile = (b"%73" * (size // 3))[: size // 8]
    return {"text": text, "random": os.urandom(size), "json-escapes": escaped, "api-json": api,
            "every-byte": every, "%73%73...": hostile}  # fmt: skip


def _pairs(n: int) -> list[tuple[bytes, bytes]]:
    return [(f"sk-live-{i:04d}-{'x' * 32}".encode(), f"surr_Placeholder{i:020d}".encode()) for i in range(n)]


def _mbps(run: Callable[[], object], size: int) -> float:
    start = time.perf_counter()
    run()
    return size / (time.perf_counter() - start) / 1e6


def in_process() -> None:
    print("1. in process, MB/s over 256 KiB reads (plain copy beside)")
    print(f"   {'body':<14}{'plain':>10}{'1 cred':>10}{'10 creds':>10}")
    for name, body in _bodies().items():
        reads = [body[i : i + READ] for i in range(0, len(body), READ)]
        row = [_mbps(lambda reads=reads: b"".join(bytes(r) for r in reads), len(body))]  # type: ignore[misc]
        for n in (1, 10):
            s = Scrubber(_pairs(n))
            row.append(_mbps(lambda s=s, reads=reads: [s.feed(r) for r in reads] + [s.finish()], len(body)))  # type: ignore[misc]
        print(f"   {name:<14}" + "".join(f"{v:>10.0f}" for v in row))


RULES = """\
version: 1
pools:
  p:
    egress:
      - host: api.test
        ports: [{port}]
claims:
  - id: scrub
    pool: p
    proxy_token: file:token
    credentials:
      - name: key
        value: file:secret
        placeholder: surr_BenchScrubPlaceholder0001
        hosts: [api.test]
  - id: plain
    pool: p
    proxy_token: file:token
"""


def _download(client: httpx.Client, url: str) -> float:
    got, start = 0, time.perf_counter()
    with client.stream("GET", url) as r:
        for piece in r.iter_raw():
            got += len(piece)
    assert got == BIG, got
    return BIG / (time.perf_counter() - start) / 1e6


def _first_event(client: httpx.Client, url: str) -> float:
    start = time.perf_counter()
    with client.stream("GET", url) as r:
        for _ in r.iter_raw():
            return (time.perf_counter() - start) * 1000
    raise AssertionError("no event")


def through_proxy() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-scrub-") as d:
        tmp = Path(d)
        (tmp / "token").write_text("benchtoken\n")
        (tmp / "secret").write_text("sk-live-bench-secret-0123456789abcdef\n")
        ca = TestCA(tmp)
        upstream = Upstream(ca, ["api.test"], tmpdir=tmp).start()
        upstream.sse_release.set()  # /sse sends both events at once: the first read is what counts
        rules = tmp / "rules.yaml"
        rules.write_text(textwrap.dedent(RULES).format(port=upstream.port))
        proxy = ProxyProcess(rules, tmp, upstream_ca=ca.ca_pem, resolve={"api.test": "127.0.0.1"}).start()
        try:
            named, direct = f"https://api.test:{upstream.port}", f"https://127.0.0.1:{upstream.port}"
            proxy_ctx = ssl.create_default_context(cafile=str(proxy.ca_pem))
            direct_ctx = ssl.create_default_context(cafile=str(ca.ca_pem))
            direct_ctx.check_hostname = False  # loopback by address; the certificate names api.test
            targets = {
                "direct": (httpx.Client(verify=direct_ctx, timeout=60), direct),
                "plain claim": (
                    httpx.Client(proxy=proxy.url("plain", "benchtoken"), verify=proxy_ctx, timeout=60),
                    named,
                ),
                "scrubbed claim": (
                    httpx.Client(proxy=proxy.url("scrub", "benchtoken"), verify=proxy_ctx, timeout=60),
                    named,
                ),
            }
            print("\n2. 50 MB download, MB/s (median of 3)")
            print("3. SSE time to first event on a kept-alive connection, ms (median / p95 of 40)")
            rows = {}
            mbps = {
                name: statistics.median(_download(c, f"{u}/bytes/{BIG}") for _ in range(3))
                for name, (c, u) in targets.items()
            }
            for c, u in targets.values():
                _first_event(c, f"{u}/sse")  # warm: connection and TLS set up
            lats: dict[str, list[float]] = {name: [] for name in targets}
            for _ in range(40):  # interleaved, so that load drift hits every target alike
                for name, (c, u) in targets.items():
                    lats[name].append(_first_event(c, f"{u}/sse"))
            for name, (c, _u) in targets.items():
                c.close()
                lat = sorted(lats[name])
                rows[name] = (mbps[name], statistics.median(lat), lat[int(len(lat) * 0.95) - 1])
            print(f"   {'':<16}{'MB/s':>8}{'first event p50':>18}{'p95':>8}")
            for name, (mbps, p50, p95) in rows.items():
                print(f"   {name:<16}{mbps:>8.0f}{p50:>15.2f} ms{p95:>6.2f} ms")
            s, p, dr = rows["scrubbed claim"], rows["plain claim"], rows["direct"]
            print(
                f"   scrubbed/plain throughput {s[0] / p[0]:.2f}x; first event: scrubbed - plain "
                f"{s[1] - p[1]:+.2f} ms, scrubbed - direct {s[1] - dr[1]:+.2f} ms (median)"
            )
        finally:
            proxy.stop()
            upstream.stop()


if __name__ == "__main__":
    in_process()
    if "--in-process" not in sys.argv[1:]:
        through_proxy()
