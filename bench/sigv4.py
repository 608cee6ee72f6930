"""SigV4 re-signing cost, in process (the core only, no proxy): CPU per re-signed request vs a
plain header swap (proxy.core.substitute on a Bearer placeholder), and aws-chunked streaming
MB/s with chunk re-signing (a plain stream does no per-byte work; one SHA-256 pass shown for
scale). Prints one line per figure.

    PYTHONPATH=. python bench/sigv4.py
"""

from __future__ import annotations

import hashlib
import os
import time

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from proxy.core import sigv4
from proxy.core.sigv4 import Allowed, Keys
from proxy.core.sigv4chunks import ChunkResigner, chunk_string

PH = Keys("surr_AwsKeyIdPlaceholder0001", "surr_AwsSecretPlaceholder0001")
REAL = Keys("AKIAREALREALREAL0001", "real/secret+KEY0000000000000000000000000")
ANY = Allowed(frozenset({"*"}), frozenset({"*"}))


def _cpu(fn: object, n: int) -> float:
    start = time.process_time()
    for _ in range(n):
        fn()  # type: ignore[operator]
    return (time.process_time() - start) / n * 1e6


def resign_us(n: int = 5000) -> float:
    req = AWSRequest(method="GET", url="https://bucket.s3.test/key.txt", headers={})
    S3SigV4Auth(Credentials(PH.access_key_id, PH.secret_access_key), "s3", "us-east-1").add_auth(req)
    fields = [(b"Host", b"bucket.s3.test"), *((k.encode(), v.encode()) for k, v in req.headers.items())]

    def one() -> None:
        signed = sigv4.parse("/key.txt", fields)
        assert signed is not None
        sigv4.resign("GET", "/key.txt", fields, "bucket.s3.test", signed, PH, REAL, ANY)

    return _cpu(one, n)


def swap_us(n: int = 5000) -> float:
    from proxy.core.policy import Credential
    from proxy.core.secrets import Secret
    from proxy.core.substitute import substitute_request

    class Src:
        def current(self) -> tuple[Secret, int]:
            return Secret("real-token-value"), 1

    from proxy.core.hosts import HostPattern

    cred = Credential("t", "surr_BenchPlaceholder000001", (HostPattern.parse("api.test"),), Src())  # type: ignore[arg-type]
    fields = [(b"Host", b"api.test"), (b"Authorization", b"Bearer surr_BenchPlaceholder000001")]
    table = {b"surr_BenchPlaceholder000001": cred}
    return _cpu(lambda: substitute_request(fields, b"/x", "api.test", True, table, (), 0.0), n)


def chunked_mbps(size: int = 64 * 1024 * 1024, chunk: int = 64 * 1024) -> tuple[float, float]:
    date, scope = "20260101T000000Z", "20260101/us-east-1/s3/aws4_request"
    key = sigv4.signing_key(PH.secret_access_key, "20260101", "us-east-1", "s3")
    rkey = sigv4.signing_key(REAL.secret_access_key, "20260101", "us-east-1", "s3")
    piece = os.urandom(chunk)
    prev, body = "0" * 64, []
    for _ in range(size // chunk):
        prev = sigv4.sign(key, chunk_string(date, scope, prev, piece))
        body.append(b"%x;chunk-signature=%s\r\n%s\r\n" % (chunk, prev.encode(), piece))
    prev = sigv4.sign(key, chunk_string(date, scope, prev, b""))
    body.append(b"0;chunk-signature=%s\r\n\r\n" % prev.encode())
    reads = b"".join(body)
    reads_list = [reads[i : i + 65536] for i in range(0, len(reads), 65536)]
    r = ChunkResigner(date, scope, key, "0" * 64, rkey, "1" * 64)
    start = time.process_time()
    for x in reads_list:
        r.feed(x)
    r.finish()
    resigned = size / (time.process_time() - start) / 1e6
    start = time.process_time()
    for x in reads_list:
        hashlib.sha256(x).digest()
    plain = size / max(time.process_time() - start, 1e-9) / 1e6
    return resigned, plain


if __name__ == "__main__":
    print(f"sigv4 re-sign (parse+verify+sign), CPU per request: {resign_us():.1f} us")
    print(f"plain header swap (substitute_request), CPU per request: {swap_us():.1f} us")
    resigned, plain = chunked_mbps()
    print(
        f"aws-chunked 64 KiB chunks: re-signed {resigned:.0f} MB/s, one SHA-256 pass {plain:.0f} MB/s; "
        "a plain stream does no per-byte work"
    )
