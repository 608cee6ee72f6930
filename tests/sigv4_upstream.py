"""A loopback HTTPS upstream that verifies AWS SigV4 with the REAL key, built on botocore (the
AWS SDK's own signer): it rebuilds each request (method, URL, the signed headers, the body) as an
``AWSRequest``, signs it with the real key at the request's own X-Amz-Date and compares the
Authorization. 403 ``SignatureDoesNotMatch`` otherwise. S3-ish answers: PUT stores the object
(an aws-chunked body de-chunked), GET returns it; a POST to the sts host answers
GetCallerIdentity. Every answer names the real access key id, so the proxy's scrubbing shows.
"""

from __future__ import annotations

import hashlib
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl

from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from servers import TestCA


def _dechunk(body: bytes) -> bytes:
    out, rest = [], body
    while rest:
        line, _, rest = rest.partition(b"\r\n")
        size = int(line.split(b";")[0], 16)
        if size == 0:
            break
        out.append(rest[:size])
        rest = rest[size + 2 :]
    return b"".join(out)


class SigV4Upstream:
    def __init__(self, ca: TestCA, names: list[str], key_id: str, secret: str, token: str | None) -> None:
        self.creds = Credentials(key_id, secret, token)
        self.objects: dict[str, bytes] = {}
        self.parts: dict[str, dict[int, bytes]] = {}  # multipart upload id -> part number -> bytes
        self.accepted: list[str] = []
        self.mismatch = False  # True: refuse every request, as if it read the request otherwise
        self.signatures: list[str] = []  # the signature of each request it refused
        self.refused: list[str] = []
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ca.ca.issue_cert(*names, "127.0.0.1").configure_cert(self.ctx)
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def _body(self) -> bytes:
                if self.headers.get("transfer-encoding", "").lower() == "chunked":
                    parts = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        if size == 0:
                            self.rfile.readline()
                            break
                        parts.append(self.rfile.read(size))
                        self.rfile.readline()
                    return b"".join(parts)
                return self.rfile.read(int(self.headers.get("content-length", "0")))

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("x-amz-request-owner", upstream.creds.access_key)
                self.end_headers()
                self.wfile.write(body)

            def _handle(self) -> None:
                body = self._body()
                ok = upstream.verify(self.command, self.headers, self.path, body)
                (upstream.accepted if ok else upstream.refused).append(f"{self.command} {self.path}")
                if not ok:
                    return self._answer(403, upstream.mismatch_body(self.command, self.path, self.headers))
                host = self.headers["host"].split(":")[0]
                key, _, query = self.path.partition("?")
                params = dict(parse_qsl(query, keep_blank_values=True))
                if not host.startswith("sts.") and (self.command == "POST" or "uploadId" in params):
                    return self._multipart(key, params, body)
                if host.startswith("sts."):
                    arn = f"arn:aws:iam::123456789012:user/{upstream.creds.access_key}"
                    xml = (
                        "<GetCallerIdentityResponse><GetCallerIdentityResult><Arn>" + arn + "</Arn>"
                        "<UserId>" + upstream.creds.access_key + "</UserId><Account>123456789012</Account>"
                        "</GetCallerIdentityResult></GetCallerIdentityResponse>"
                    )
                    return self._answer(200, xml.encode())
                if self.command == "PUT":
                    if self.headers.get("content-encoding", "").startswith(
                        "aws-chunked"
                    ) or "aws-chunked" in (self.headers.get("content-encoding", "")):
                        body = _dechunk(body)
                    upstream.objects[key] = body
                    self.send_response(200)
                    self.send_header("ETag", '"' + hashlib.md5(body).hexdigest() + '"')  # noqa: S324
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                if key in upstream.objects:
                    return self._answer(200, upstream.objects[key])
                return self._answer(404, b"<Error><Code>NoSuchKey</Code></Error>")

            def _multipart(self, key: str, params: dict[str, str], body: bytes) -> None:
                if "uploads" in params:
                    upload = f"u{len(upstream.parts)}"
                    upstream.parts[upload] = {}
                    xml = (
                        f"<InitiateMultipartUploadResult><Bucket>b</Bucket><Key>{key}</Key>"
                        f"<UploadId>{upload}</UploadId></InitiateMultipartUploadResult>"
                    )
                    return self._answer(200, xml.encode())
                upload = params["uploadId"]
                if self.command == "PUT":
                    if "aws-chunked" in self.headers.get("content-encoding", ""):
                        body = _dechunk(body)
                    upstream.parts[upload][int(params["partNumber"])] = body
                    self.send_response(200)
                    self.send_header("ETag", '"' + hashlib.md5(body).hexdigest() + '"')  # noqa: S324
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                parts = upstream.parts.pop(upload)
                upstream.objects[key] = b"".join(parts[n] for n in sorted(parts))
                xml = f'<CompleteMultipartUploadResult><Key>{key}</Key><ETag>"x"</ETag>'
                xml += "</CompleteMultipartUploadResult>"
                return self._answer(200, xml.encode())

            do_GET = do_PUT = do_POST = _handle  # noqa: N815

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.socket = self.ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def mismatch_body(self, method: str, path: str, headers: Any) -> bytes:
        """S3's SignatureDoesNotMatch answer: it repeats the key id, the signature provided and the
        canonical request it computed, also as space-separated hex (``CanonicalRequestBytes``),
        so the real key id and session token the proxy sent come back in it."""
        target, _, query = path.partition("?")
        auth = headers.get("authorization", "")
        given = auth.rsplit("Signature=", 1)[-1] if "Signature=" in auth else ""
        given = given or dict(parse_qsl(query)).get("X-Amz-Signature", "")
        self.signatures.append(given)
        lines = [f"{k.lower()}:{v}" for k, v in headers.items()]
        creq = "\n".join([method, target, query, *lines])
        hexed = " ".join(f"{b:02x}" for b in creq.encode())
        return (
            f"<Error><Code>SignatureDoesNotMatch</Code><AWSAccessKeyId>{self.creds.access_key}"
            f"</AWSAccessKeyId><SignatureProvided>{given}</SignatureProvided>"
            f"<CanonicalRequest>{creq}</CanonicalRequest>"
            f"<CanonicalRequestBytes>{hexed}</CanonicalRequestBytes></Error>"
        ).encode()

    def verify(self, method: str, headers: Any, path: str, body: bytes) -> bool:
        if self.mismatch:
            return False
        auth = headers.get("authorization", "")
        if not auth.startswith("AWS4-HMAC-SHA256 "):
            return self._verify_query(method, headers, path)
        items = dict(p.strip().split("=", 1) for p in auth[len("AWS4-HMAC-SHA256 ") :].split(","))
        key_id, date, region, service, _ = items["Credential"].split("/")
        if key_id != self.creds.access_key:
            return False
        names = items["SignedHeaders"].split(";")
        kept = {n: headers[n] for n in names if n in headers}
        url = f"https://{headers['host']}{path}"
        req = AWSRequest(method=method, url=url, headers=kept, data=body)
        req.context["timestamp"] = headers["x-amz-date"]
        signer = (S3SigV4Auth if service == "s3" else SigV4Auth)(self.creds, service, region)
        signer._modify_request_before_signing = lambda r: None  # type: ignore[method-assign]
        if self.creds.token is not None and headers.get("x-amz-security-token") != self.creds.token:
            return False
        sig = signer.signature(signer.string_to_sign(req, signer.canonical_request(req)), req)
        if sig != items["Signature"]:
            return False
        if headers.get("x-amz-content-sha256") == "STREAMING-AWS4-HMAC-SHA256-PAYLOAD":
            scope = f"{date}/{region}/{service}/aws4_request"
            return self._verify_chunks(body, headers["x-amz-date"], scope, sig, req, signer)
        return True

    def _verify_chunks(
        self, body: bytes, amz_date: str, scope: str, seed: str, req: Any, signer: Any
    ) -> bool:
        """The S3 chunked-upload chain (AWS "Transferring payload in multiple chunks"), real key."""
        empty = hashlib.sha256(b"").hexdigest()
        prev, rest = seed, body
        while True:
            line, _, rest = rest.partition(b"\r\n")
            size_s, _, ext = line.partition(b";chunk-signature=")
            size = int(size_s, 16)
            data, rest = rest[:size], rest[size + 2 :]
            text = "\n".join(
                ["AWS4-HMAC-SHA256-PAYLOAD", amz_date, scope, prev, empty, hashlib.sha256(data).hexdigest()]
            )
            prev = signer.signature(text, req)
            if prev != ext.decode():
                return False
            if size == 0:
                return rest == b""

    def _verify_query(self, method: str, headers: Any, path: str) -> bool:
        target, _, query = path.partition("?")
        params = dict(parse_qsl(query, keep_blank_values=True))
        if params.get("X-Amz-Algorithm") != "AWS4-HMAC-SHA256":
            return False
        key_id, date, region, service, _ = params["X-Amz-Credential"].split("/")
        if key_id != self.creds.access_key or params.get("X-Amz-Security-Token") != self.creds.token:
            return False
        unsigned = "&".join(p for p in query.split("&") if not p.startswith("X-Amz-Signature="))
        req = AWSRequest(
            method=method,
            url=f"https://{headers['host']}{target}?{unsigned}",
            headers={"host": headers["host"]},
        )
        signer = S3SigV4Auth(self.creds, service, region)
        req.context["timestamp"] = params["X-Amz-Date"]
        creq = "\n".join([
            method, target, signer.canonical_query_string(req), f"host:{headers['host']}\n", "host",
            "UNSIGNED-PAYLOAD",
        ])  # fmt: skip
        sts = "\n".join(["AWS4-HMAC-SHA256", params["X-Amz-Date"], f"{date}/{region}/{service}/aws4_request",
                         hashlib.sha256(creq.encode()).hexdigest()])  # fmt: skip
        return signer.signature(sts, req) == params["X-Amz-Signature"]
