"""Request-body substitution throughput beside plain streaming, measured side by side in one run.

One surrogate process (pinned to the proxy core) and an nginx sink on loopback (bench CA; POST
/sink reads and discards any body). curl (pinned to the other core) uploads the same 50 MiB
file, over HTTP/1.1 through one tunnel, as three claims of the same proxy:

- ``plain``: a claim with no credential: the body is streamed untouched, never scanned;
- ``scan``: a claim whose credential is not swapped in bodies: every read is scanned and each
  placeholder found is carried (audited), nothing changes;
- ``swap``: a claim whose credential has the ``body`` surface: every read scanned, each
  placeholder (one straddling every 64 KiB boundary) swapped, Content-Length dropped, chunked.

Rounds interleave the three (order rotated each round); medians are printed as a markdown table
with MB/s, the ratio to ``plain``, the proxy's CPU seconds per upload (/proc/PID/stat) and
its peak RSS growth (VmHWM reset before each
upload). Run: ``.venv/bin/python bench/bodies.py [--rounds N]`` (needs nginx and curl, as
``make bench`` does).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

from load import Target, cpu_seconds, reset_peak_rss, status_kib  # noqa: E402
from proxies import UPSTREAM_HOST, Surrogate  # noqa: E402
from run import _cores  # noqa: E402
from upstreams import BenchCA, Nginx, _nginx_conf, pinned  # noqa: E402

PLACEHOLDER = "surr_BenchBodyPlaceholder0001"  # the swap claim's; the scan claim's differs (unique per file)
PLACEHOLDERS = {"plain": PLACEHOLDER, "scan": "surr_BenchScanPlaceholder0002", "swap": PLACEHOLDER}
SECRET = "BenchBodySecretValue-0123456789-abcdefghijklmnop"  # longer than the placeholder
BLOCKS = 800  # x 64 KiB = 50 MiB
KINDS = ("plain", "scan", "swap")


def _body(path: Path, placeholder: str) -> int:
    """Write the upload: 50 MiB of filler with ``placeholder`` straddling each 64 KiB boundary."""
    block = 64 * 1024
    with open(path, "wb") as f:
        for i in range(BLOCKS):
            shift = i % (len(placeholder) + 1)
            f.write(b"." * (block - shift) + placeholder.encode() + b"." * shift)
    return path.stat().st_size


def _rules(tmp: Path, port: int) -> Path:
    (tmp / "secret").write_text(SECRET + "\n")
    for kind in KINDS:
        (tmp / f"token-{kind}").write_text(f"bench-{kind}-token\n")
    claim = "  - id: {k}\n    pool: p\n    proxy_token: file:token-{k}\n"
    cred = (
        "    credentials:\n      - name: k\n        value: file:secret\n"
        "        placeholder: {p}\n        hosts: [" + UPSTREAM_HOST + "]\n"
    )
    rules = tmp / "rules.yaml"
    rules.write_text(
        textwrap.dedent(f"""\
        version: 1
        pools:
          p:
            egress:
              - host: {UPSTREAM_HOST}
                ports: [{port}]
        claims:
        """)
        + claim.format(k="plain")
        + claim.format(k="scan")
        + cred.format(p=PLACEHOLDERS["scan"])
        + claim.format(k="swap")
        + cred.format(p=PLACEHOLDERS["swap"])
        + "        surfaces: [header, body]\n"
    )
    return rules


class Sink(Nginx):
    """The bench nginx with one more location: POST /sink discards a body of any size."""

    def __init__(self, tmp: Path, ca: BenchCA, cpu: int | None) -> None:
        super().__init__(tmp, ca, cpu)
        conf = _nginx_conf(self.root, self.port, ca).replace(
            "        location = /small {",
            "        client_max_body_size 0;\n"
            '        location = /sink {\n            return 200 "ok";\n        }\n'
            "        location = /small {",
        )
        self.conf.write_text(conf)


def upload(target: Target, url: str, body: Path, size: int, cpu: int | None) -> tuple[float, float, float]:
    """(MB/s, peak RSS growth in MiB, proxy CPU seconds) of one upload of ``body`` through ``target``."""
    assert target.proxy_url is not None and target.pid is not None
    cmd = ["curl", "-sS", "--fail", "--cacert", str(target.ca_pem), "-x", target.proxy_url, "-o", "/dev/null",
           "-H", "Content-Type: application/octet-stream", "--data-binary", f"@{body}",
           "-w", "%{size_upload} %{time_total}\n", url]  # fmt: skip
    base = status_kib(target.pid, "VmRSS")
    reset_peak_rss(target.pid)
    cpu_before = cpu_seconds(target.pid)
    out = subprocess.run(pinned(cmd, cpu), capture_output=True, text=True, check=True).stdout.split()
    if int(out[0]) != size:
        raise RuntimeError(f"{target.name}: uploaded {out[0]} bytes, expected {size}")
    growth = (status_kib(target.pid, "VmHWM") - base) / 1024
    return size / float(out[1]) / 1e6, growth, cpu_seconds(target.pid) - cpu_before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    proxy_cpu, load_cpu = _cores()
    with tempfile.TemporaryDirectory(prefix="surrogate-bench-bodies-") as d:
        tmp = Path(d)
        ca = BenchCA(tmp)
        sink = Sink(tmp, ca, load_cpu).start()
        proxy = Surrogate("surrogate", tmp / "surrogate", _rules(tmp, sink.port), ca.ca_pem, proxy_cpu)
        try:
            proxy.start()
            bodies = {k: tmp / f"body-{k}" for k in KINDS}
            size = {_body(bodies[k], PLACEHOLDERS[k]) for k in KINDS}.pop()  # one size: same lengths
            url = f"https://{UPSTREAM_HOST}:{sink.port}/sink"
            speeds: dict[str, list[float]] = {k: [] for k in KINDS}
            growth: dict[str, list[float]] = {k: [] for k in KINDS}
            cpu: dict[str, list[float]] = {k: [] for k in KINDS}
            for r in range(args.rounds):
                for kind in KINDS[r % 3 :] + KINDS[: r % 3]:
                    mbs, rss, used = upload(
                        proxy.target(kind, f"bench-{kind}-token"), url, bodies[kind], size, load_cpu
                    )
                    speeds[kind].append(mbs)
                    growth[kind].append(rss)
                    cpu[kind].append(used)
        finally:
            proxy.stop()
            sink.stop()
    print({k: [round(x) for x in v] for k, v in speeds.items()}, file=sys.stderr)
    plain = statistics.median(speeds["plain"])
    print(f"request body, {size / 2**20:.0f} MiB over HTTP/1.1, median of {args.rounds} rounds\n")
    print("| body | MB/s | vs plain | proxy CPU s / upload | peak RSS growth (MiB) |")
    print("|---|---:|---:|---:|---:|")
    labels = {
        "plain": "plain streaming (no credential)",
        "scan": "scanned, placeholders carried",
        "swap": f"substituted ({BLOCKS} placeholders swapped)",
    }
    for kind in KINDS:
        mbs = statistics.median(speeds[kind])
        print(
            f"| {labels[kind]} | {mbs:.0f} | {mbs / plain:.2f}x | {statistics.median(cpu[kind]):.2f} "
            f"| {statistics.median(growth[kind]):.1f} |"
        )


if __name__ == "__main__":
    main()
