"""SigV4 re-signing through a real proxy process (issue 15's benchmark line), side by side in one
run: one surrogate process (``--workers 1``), two loopback upstreams under a test CA (a SigV4
verifier with the REAL key, tests/sigv4_upstream.py, and the plain tests/servers.py Upstream),
real clients (boto3 signing with the placeholders; httpx).

- **CPU per request**: the proxy's CPU (utime + stime of its processes, /proc/PID/stat) over N
  small GETs on one kept-alive tunnel: a SigV4 request re-signed (verified as the placeholder's,
  signed again with the real key) vs a bearer placeholder swapped in ``Authorization``.
- **Streaming upload**: ~50 MB PUT, MB/s (wall) and the proxy's CPU seconds: S3 ``aws-chunked``
  with chunk signatures (``STREAMING-AWS4-HMAC-SHA256-PAYLOAD``, each 64 KiB chunk verified and
  re-signed on the chain) vs ``UNSIGNED-PAYLOAD`` (the header re-signed, the body streamed
  untouched) vs a plain bearer-swap PUT, all to a sink that reads and discards (the proxy's
  pace, not a verifier's: that the re-signed chunks verify with the real key is
  tests/e2e/test_sigv4.py's). Bodies are built before the clock starts (client signing is not
  measured); the CPU figure is the proxy's alone.

Ratios are printed against the plain case. Run: ``PYTHONPATH=. nice python bench/sigv4_proxy.py
[--requests N] [--mb M] [--rounds R]`` (uploads: R interleaved rounds, medians).
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

import boto3  # noqa: E402
import httpx  # noqa: E402
import psutil  # noqa: E402
from botocore.auth import S3SigV4Auth  # noqa: E402
from botocore.awsrequest import AWSRequest  # noqa: E402
from botocore.config import Config  # noqa: E402
from botocore.credentials import Credentials  # noqa: E402
from harness import ProxyProcess  # noqa: E402
from load import cpu_seconds  # noqa: E402
from servers import TestCA, Upstream  # noqa: E402
from sigv4_upstream import SigV4Upstream  # noqa: E402

from proxy.core import sigv4  # noqa: E402
from proxy.core.sigv4chunks import chunk_string  # noqa: E402

AKID, SECRET_PH = "surr_BenchAwsKeyIdPlaceholder1", "surr_BenchAwsSecretPlaceholder"
BEARER_PH = "surr_BenchBearerPlaceholder001"
REAL = {"access_key_id": "AKIABENCHREALKEY0001", "secret_access_key": "bench/real+SECRET00000000000000000"}
CHUNK = 64 * 1024


def _proxy_cpu(pid: int) -> float:
    procs = [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
    return sum(cpu_seconds(p) for p in procs)


def _rules(tmp: Path, s3: int, api: int) -> Path:
    (tmp / "secret-aws").write_text(json.dumps(REAL) + "\n")
    (tmp / "secret-bearer").write_text("bench-real-bearer-token-0123456789\n")
    (tmp / "token").write_text("benchtoken\n")
    path = tmp / "rules.yaml"
    path.write_text(f"""version: 1
pools:
  p:
    limits: {{requests_per_second: 10000, burst: 10000}}  # the claim's rate is not what is measured
    egress:
      - {{host: s3.test, ports: [{s3}]}}
      - {{host: api.test, ports: [{api}]}}
      - {{host: sink.test, ports: [{api}]}}
claims:
  - id: c
    pool: p
    proxy_token: file:token
    credentials:
      - name: aws
        kind: aws_sigv4
        value: file:secret-aws
        placeholder: {AKID}
        hosts: [s3.test, sink.test]
        aws_sigv4: {{secret_placeholder: {SECRET_PH}, regions: [us-east-1], services: [s3]}}
      - name: bearer
        value: file:secret-bearer
        placeholder: {BEARER_PH}
        hosts: [api.test]
""")
    return path


def _signed_put(url: str, data: bytes, payload: str) -> tuple[dict[str, str], list[bytes]]:
    """Headers and body reads of a PUT signed with the placeholder keys: ``payload`` is
    sigv4.STREAMING (chunk-signed aws-chunked) or UNSIGNED-PAYLOAD (the body as is)."""
    headers = {"X-Amz-Content-SHA256": payload}
    if payload == sigv4.STREAMING:
        pieces = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)] + [b""]
        framed = sum(len(b"%x;chunk-signature=" % len(p)) + 64 + 4 + len(p) for p in pieces)
        headers |= {"Content-Encoding": "aws-chunked", "Content-Length": str(framed),
                    "X-Amz-Decoded-Content-Length": str(len(data))}  # fmt: skip
    else:
        headers["Content-Length"] = str(len(data))
    req = AWSRequest(method="PUT", url=url, headers=headers)

    class Signer(S3SigV4Auth):
        def payload(self, request: AWSRequest) -> str:
            return payload

    Signer(Credentials(AKID, SECRET_PH), "s3", "us-east-1").add_auth(req)
    if payload != sigv4.STREAMING:
        return dict(req.headers.items()), [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)]
    amz_date = req.context["timestamp"]
    scope = f"{amz_date[:8]}/us-east-1/s3/aws4_request"
    key = sigv4.signing_key(SECRET_PH, amz_date[:8], "us-east-1", "s3")
    prev, reads = req.headers["Authorization"].rsplit("Signature=", 1)[1], []
    for p in pieces:
        prev = sigv4.sign(key, chunk_string(amz_date, scope, prev, p))
        reads.append(b"%x;chunk-signature=%s\r\n%s\r\n" % (len(p), prev.encode(), p))
    return dict(req.headers.items()), reads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--mb", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        ca = TestCA(tmp)
        s3 = SigV4Upstream(ca, ["s3.test"], REAL["access_key_id"], REAL["secret_access_key"], None)
        s3.start()
        api = Upstream(ca, ["api.test", "sink.test"], tmpdir=tmp)
        api.start()
        pins = {"s3.test": "127.0.0.1", "api.test": "127.0.0.1", "sink.test": "127.0.0.1"}
        rules = _rules(tmp, s3.port, api.port)
        proxy = ProxyProcess(rules, tmp, upstream_ca=ca.ca_pem, resolve=pins, workers=1)
        proxy.start()
        try:
            _run(args, proxy, s3, api)
        finally:
            proxy.stop()
            s3.stop()
            api.stop()


def _run(args: argparse.Namespace, proxy: ProxyProcess, s3: SigV4Upstream, api: Upstream) -> None:
    url = proxy.url("c", "benchtoken")
    pid = proxy.proc.pid if proxy.proc else 0
    ctx = ssl.create_default_context(cafile=str(proxy.ca_pem))
    boto = boto3.session.Session().client(
        "s3", endpoint_url=f"https://s3.test:{s3.port}", region_name="us-east-1",
        aws_access_key_id=AKID, aws_secret_access_key=SECRET_PH, verify=str(proxy.ca_pem),
        config=Config(proxies={"https": url}, s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )  # fmt: skip
    boto.put_object(Bucket="b", Key="k", Body=b"small object")
    web = httpx.Client(proxy=url, verify=ctx, timeout=120, trust_env=False)
    bearer = {"Authorization": f"Bearer {BEARER_PH}"}

    def sig() -> None:
        boto.get_object(Bucket="b", Key="k")["Body"].read()

    def swap() -> None:
        r = web.get(f"https://api.test:{api.port}/x", headers=bearer)
        assert r.status_code == 200, r.text[:300]

    per: dict[str, float] = {}
    for name, fn in (("sigv4 re-signed GET", sig), ("bearer header swap GET", swap)):
        for _ in range(20):  # warm: tunnel, certificates, caches
            fn()
        before = _proxy_cpu(pid)
        for _ in range(args.requests):
            fn()
        per[name] = (_proxy_cpu(pid) - before) / args.requests * 1e6
    base = per["bearer header swap GET"]
    for name, us in per.items():
        print(f"{name}: proxy CPU {us:.0f} us/request ({us / base:.2f}x the header swap), n={args.requests}")
    data = os.urandom(args.mb * 1024 * 1024)
    target = f"https://sink.test:{api.port}/upload"  # reads and discards: the proxy's pace, not a verifier's
    uploads = {
        "aws-chunked, chunk signatures re-signed": (target, *_signed_put(target, data, sigv4.STREAMING)),
        "UNSIGNED-PAYLOAD (header re-signed)": (target, *_signed_put(target, data, "UNSIGNED-PAYLOAD")),
        "plain PUT, bearer header swap": (f"https://api.test:{api.port}/upload",
                                          {**bearer, "Content-Length": str(len(data))},
                                          [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)]),
    }  # fmt: skip
    names = list(uploads)
    walls: dict[str, list[float]] = {n: [] for n in names}
    cpus: dict[str, list[float]] = {n: [] for n in names}
    for round_ in range(args.rounds):  # interleaved, the order rotated each round; medians shown
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            where, headers, reads = uploads[name]
            cpu, start = _proxy_cpu(pid), time.perf_counter()
            r = web.put(where, headers=headers, content=iter(reads))
            walls[name].append(time.perf_counter() - start)
            cpus[name].append(_proxy_cpu(pid) - cpu)
            assert r.status_code == 200, (name, r.status_code, r.text[:200])
            sent = sum(len(x) for x in reads)
            assert r.json()["received"] == sent, (name, r.text[:200])  # re-signed chunks keep their length
    rows = [(n, len(data) / statistics.median(walls[n]) / 1e6, statistics.median(cpus[n])) for n in names]
    plain = rows[-1]
    for name, mbps, cpu in rows:
        print(f"{args.mb} MiB upload, {name}: {mbps:.0f} MB/s ({mbps / plain[1]:.2f}x plain), "
              f"proxy CPU {cpu:.2f} s = {len(data) / cpu / 1e6:.0f} MB per CPU-second "
              f"({cpu / plain[2]:.2f}x plain)")  # fmt: skip
    assert not s3.refused, s3.refused


if __name__ == "__main__":
    main()
