"""End to end: placeholders swapped on every surface (header, Basic/userinfo, query, body), over
HTTP/1.1 and HTTP/2, identity and gzip bodies, a 50 MB body in flat memory, and the carried /
blocked / terminated paths, each audited with the surface named.

A real proxy process, real httpx clients (``http2=True`` for HTTP/2), and real upstreams
(hypercorn, tests/asgi_upstream.py): one offering h2 and http/1.1, one offering only http/1.1
(an HTTP/2 client meeting an HTTP/1 upstream). The upstreams answer with digests only; the
credential values are canaries scanned for in every artifact when the module ends.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import secrets
import ssl
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import brotli  # type: ignore[import-untyped]
import httpx
import pytest
from asgi_upstream import AsgiUpstream
from backports import zstd
from harness import ProxyProcess
from test_audit_schema import validator
from world import Stage, credential, egress, rules

NAMES = ["api.test", "h1.test", "other.test"]
P_SVC = "surr_SurfacesSvcPlaceholder01"  # header, basic, query, body; api.test and h1.test
P_HDR = "surr_SurfacesHdrPlaceholder02"  # default surfaces (header, basic), carry
P_BLK = "surr_SurfacesBlkPlaceholder03"  # header only, block
P_TERM = "surr_SurfacesTermPlaceholder4"  # header only, terminate
UNREG = "surr_NotRegisteredAnywhere000004"
MB = 1024 * 1024


class _H2First(ssl.SSLContext):
    """httpcore offers ALPN "http/1.1, h2" in that order and mitmproxy takes the client's first
    choice, so httpx would always speak HTTP/1.1 to the proxy; offer h2 first, as curl does."""

    def set_alpn_protocols(self, alpn_protocols: Any) -> None:
        super().set_alpn_protocols(["h2", "http/1.1"])


@dataclass
class Env:
    h2: AsgiUpstream  # api.test, other.test: offers h2 and http/1.1
    h1: AsgiUpstream  # h1.test: offers http/1.1 only
    proxy: ProxyProcess
    token: str
    secret: str
    received: list[bytes] = field(default_factory=list)

    def client(self, http2: bool, timeout: float = 30) -> httpx.Client:
        ctx = _H2First(ssl.PROTOCOL_TLS_CLIENT) if http2 else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations(cafile=self.proxy.ca_pem)
        return httpx.Client(proxy=self.proxy.url("c1", self.token), verify=ctx, http2=http2, timeout=timeout)

    def url(self, host: str, path: str) -> str:
        port = self.h1.port if host == "h1.test" else self.h2.port
        return f"https://{host}:{port}{path}"


def _rules(h2_port: int, h1_port: int) -> str:
    api = ["api.test"]
    return rules(
        [egress("api.test", h2_port), egress("other.test", h2_port), egress("h1.test", h1_port)],
        credentials=[
            credential(
                "svc",
                P_SVC,
                ["api.test", "h1.test"],
                "file:secret",
                surfaces=["header", "userinfo", "query", "body"],
            ),
            credential("hdr", P_HDR, api),
            credential("blk", P_BLK, api, surfaces=["header"], on_misplaced="block"),
            credential("term", P_TERM, api, surfaces=["header"], on_misplaced="terminate"),
        ],
    )


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with Stage(tmp_path_factory.mktemp("surfaces")) as st:
        # A value that every surface must escape: quote, ampersand, equals, plus, space, slash.
        secret = f'CANARYsv{secrets.token_hex(8)}"&=+ /x'
        others = {n: f"CANARY{n}{secrets.token_hex(8)}" for n in ("hdr", "blk", "term")}
        (st.tmp / "secret").write_text(secret + "\n")
        for n, v in others.items():
            (st.tmp / f"secret-{n}").write_text(v + "\n")
        st.watch(secret, *others.values())
        token = st.token(secrets.token_urlsafe(16))
        h2 = st.serve(AsgiUpstream(st.ca.ca, NAMES, st.tmp, h2=True))
        h1 = st.serve(AsgiUpstream(st.ca.ca, NAMES, st.tmp, h2=False))
        yield Env(h2, h1, st.proxy(_rules(h2.port, h1.port), NAMES), token, secret, st.received)


PROTOCOLS = [pytest.param(False, id="http1.1"), pytest.param(True, id="http2")]


def _send(env: Env, http2: bool, method: str, url: str, **kw: Any) -> httpx.Response:
    with env.client(http2) as client:
        r = client.request(method, url, **kw)
    env.received.append(r.content)
    env.received.append(str(r.headers).encode())
    assert r.http_version == ("HTTP/2" if http2 else "HTTP/1.1")
    return r


def _event(env: Env, path: str) -> dict[str, Any]:
    return env.proxy.wait_event(path=path)


# --- each surface, HTTP/1.1 and HTTP/2 -------------------------------------------------------


@pytest.mark.parametrize("http2", PROTOCOLS)
def test_header(env: Env, http2: bool) -> None:
    path = f"/header/{int(http2)}"
    r = _send(env, http2, "GET", env.url("api.test", path), headers={"X-Api-Key": P_SVC})
    assert r.status_code == 200
    seen = env.h2.last(path)
    assert seen.header("x-api-key") == env.secret
    # svc may be swapped in bodies here, but a GET has none: its framing is left alone
    assert (seen.header("transfer-encoding"), seen.body_len) == (None, 0)
    assert seen.http_version == ("2" if http2 else "1.1")
    assert _event(env, path)["credentials"] == [{"name": "svc", "version": 1}]


@pytest.mark.parametrize("http2", PROTOCOLS)
def test_userinfo(env: Env, http2: bool) -> None:
    """The client turns https://user:P@host into Basic credentials (RFC 7617); they are swapped."""
    path = f"/userinfo/{int(http2)}"
    url = env.url("api.test", path).replace("https://", f"https://x-token:{P_SVC}@")
    assert _send(env, http2, "GET", url).status_code == 200
    auth = env.h2.last(path).header("authorization")
    assert auth is not None
    assert base64.b64decode(auth.split(" ", 1)[1]).decode() == f"x-token:{env.secret}"


@pytest.mark.parametrize("http2", PROTOCOLS)
@pytest.mark.parametrize("spelling", [P_SVC, P_SVC.replace("_", "%5F")], ids=["raw", "percent-encoded"])
def test_query(env: Env, http2: bool, spelling: str) -> None:
    path = f"/query/{int(http2)}/{'enc' if '%' in spelling else 'raw'}"
    r = _send(env, http2, "GET", env.url("api.test", f"{path}?a=1&key={spelling}&b=2"))
    assert r.status_code == 200
    target = env.h2.last(path).target
    assert f"key={quote(env.secret, safe='-._~')}&" in target
    assert parse_qs(urlsplit(target).query) == {"a": ["1"], "key": [env.secret], "b": ["2"]}
    event = _event(env, f"{path}?a=REDACTED&key=REDACTED&b=REDACTED")
    assert event["credentials"] == [{"name": "svc", "version": 1}]


def _check_framing(seen: Any, http2_upstream: bool, length: int) -> None:
    assert seen.complete and seen.body_len == length
    assert seen.header("content-length") in (None, str(length))
    if not http2_upstream:
        assert seen.header("transfer-encoding") == "chunked" or seen.header("content-length") == str(length)


@pytest.mark.parametrize("http2", PROTOCOLS)
@pytest.mark.parametrize("host", ["api.test", "h1.test"], ids=["same-protocol", "h1-upstream"])
def test_json_body(env: Env, http2: bool, host: str) -> None:
    path = f"/json/{int(http2)}/{host}"
    doc = {"token": P_SVC, "note": f"twice {P_SVC}", "other": UNREG}
    r = _send(env, http2, "POST", env.url(host, path), json=doc)
    assert r.status_code == 200
    upstream = env.h1 if host == "h1.test" else env.h2
    seen = upstream.last(path)
    assert seen.decoded is not None
    assert json.loads(seen.decoded) == {"token": env.secret, "note": f"twice {env.secret}", "other": UNREG}
    _check_framing(seen, host == "api.test" and http2, len(seen.decoded))
    assert seen.header("content-length") is None  # the length changed: never a stale one
    assert _event(env, path)["credentials"] == [{"name": "svc", "version": 1}]


@pytest.mark.parametrize("http2", PROTOCOLS)
def test_form_body(env: Env, http2: bool) -> None:
    path = f"/form/{int(http2)}"
    r = _send(env, http2, "POST", env.url("api.test", path), data={"a": "1", "token": P_SVC})
    assert r.status_code == 200
    seen = env.h2.last(path)
    assert seen.decoded is not None
    assert parse_qs(seen.decoded.decode(), strict_parsing=True) == {"a": ["1"], "token": [env.secret]}


COMPRESS = {
    "gzip": gzip.compress,
    "br": brotli.compress,
    "zstd": lambda b: zstd.compress(b),
}


@pytest.mark.parametrize("http2", PROTOCOLS)
@pytest.mark.parametrize("encoding", ["gzip", "br", "zstd"])
def test_compressed_body_is_decoded_swapped_and_re_encoded(env: Env, http2: bool, encoding: str) -> None:
    path = f"/{encoding}/{int(http2)}"
    plain = json.dumps({"refresh_token": P_SVC, "pad": "x" * 100_000}).encode()
    r = _send(
        env,
        http2,
        "POST",
        env.url("api.test", path),
        content=COMPRESS[encoding](plain),
        headers={"Content-Type": "application/json", "Content-Encoding": encoding},
    )
    assert r.status_code == 200
    seen = env.h2.last(path)
    assert seen.header("content-encoding") == encoding
    expected = json.dumps({"refresh_token": env.secret, "pad": "x" * 100_000}).encode()
    assert seen.decoded_sha256 == hashlib.sha256(expected).hexdigest()


# --- a 50 MB body: placeholders at every 64 KiB boundary, flat memory ----------------------------


@pytest.mark.parametrize("http2", PROTOCOLS)
def test_body_in_an_encoding_that_cannot_be_checked_is_refused(env: Env, http2: bool) -> None:
    path = f"/compress/{int(http2)}"
    r = _send(
        env,
        http2,
        "POST",
        env.url("api.test", path),
        content=b"\x1f\x9d...",
        headers={"Content-Encoding": "compress"},
    )
    assert r.status_code == 415 and r.json()["error"] == "bad_request_body"
    assert env.h2.saw(path) == []


def test_gzip_bomb_past_the_decoded_bound_closes_the_connection(env: Env) -> None:
    path = "/bomb"
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = b"\0" * MB
    bomb = b"".join(z.compress(zeros) for _ in range(300)) + z.flush()  # 300 MiB in about 300 KB
    with env.client(False) as client, pytest.raises(httpx.HTTPError):
        client.post(env.url("api.test", path), content=bomb, headers={"Content-Encoding": "gzip"})
    event = _event(env, path)
    assert (event["reason"], event["status"]) == ("bad_request_body", None)
    assert all(not seen.complete for seen in env.h2.saw(path))


def _rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of ``pid`` in KiB, from /proc/<pid>/status."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def _big_body(value: bytes, blocks: int = 800) -> Iterator[bytes]:
    """800 blocks of 64 KiB (50 MiB) of filler, ``value`` straddling each block boundary by a
    varying amount (0 to all of its length)."""
    block = 64 * 1024
    for i in range(blocks):
        shift = i % (len(P_SVC) + 1)
        yield b"." * (block - shift) + value + b"." * shift


@pytest.mark.parametrize("http2", PROTOCOLS)
def test_50mb_body_every_placeholder_swapped_in_flat_memory(env: Env, http2: bool) -> None:
    path = f"/big/{int(http2)}"
    assert env.proxy.proc is not None
    pid = env.proxy.proc.pid
    before, _ = _rss_kib(pid)
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS: earlier tests' peaks do not count
    expected = hashlib.sha256()
    length = 0
    for piece in _big_body(env.secret.encode()):
        expected.update(piece)
        length += len(piece)
    with env.client(http2, timeout=120) as client:
        r = client.post(env.url("api.test", path), content=_big_body(P_SVC.encode()))
    assert r.status_code == 200
    seen = env.h2.last(path)
    assert seen.complete and seen.body_len == length
    assert seen.body_sha256 == expected.hexdigest()
    _, peak = _rss_kib(pid)
    if not http2:
        # Flat: the proxy's peak resident memory grew by far less than the 50 MB that went through.
        assert peak - before < 25 * 1024, f"proxy RSS grew {(peak - before) // 1024} MiB for a 50 MB body"
    # Over HTTP/2 it is not flat, with or without substitution: mitmproxy 12.3 acknowledges each
    # DATA frame as it arrives (proxy/layers/http/_http2.py, acknowledge_received_data) and queues
    # what the upstream's window cannot take yet (_http_h2.py stream_buffers), so a client faster
    # than the upstream fills the proxy's memory. Measured here: +49 MiB peak for 50 MiB of plain
    # HTTP/2 streaming toward a host with nothing to swap, the same as with the swap.
    event = _event(env, path)
    assert event["credentials"] == [{"name": "svc", "version": 1}]
    assert event["bytes_out"] == length


# --- carried, blocked, terminated: each audited with the surface ----------------------------


@pytest.mark.parametrize("http2", PROTOCOLS)
def test_carried_in_a_body_toward_an_unbound_host(env: Env, http2: bool) -> None:
    """Conversation history sent to another allowed host: the placeholder passes inert."""
    path = f"/carried-body/{int(http2)}"
    doc = {"messages": [f"my key is {P_HDR} and {P_SVC}"]}
    r = _send(env, http2, "POST", env.url("other.test", path), json=doc)
    assert r.status_code == 200
    seen = env.h2.last(path)
    assert seen.decoded is not None and json.loads(seen.decoded) == doc  # placeholders, not secrets
    event = _event(env, path)
    assert event["decision"] == "allow" and event["credentials"] == []
    assert sorted(event["carried"]) == ["hdr", "svc"]
    assert sorted(event["carried_on"], key=lambda c: c["name"]) == [
        {"name": "hdr", "surface": "body"},
        {"name": "svc", "surface": "body"},
    ]


@pytest.mark.parametrize("http2", PROTOCOLS)
def test_carried_in_the_query_toward_a_bound_host(env: Env, http2: bool) -> None:
    path = f"/carried-query/{int(http2)}"
    assert _send(env, http2, "GET", env.url("api.test", f"{path}?k={P_HDR}")).status_code == 200
    assert P_HDR in env.h2.last(path).target
    event = _event(env, f"{path}?k=REDACTED")
    assert event["carried_on"] == [{"name": "hdr", "surface": "query"}]
    assert event["violation_surface"] is None


@pytest.mark.parametrize("http2", PROTOCOLS)
def test_blocked_in_the_query(env: Env, http2: bool) -> None:
    path = f"/blocked-query/{int(http2)}"
    r = _send(env, http2, "GET", env.url("api.test", f"{path}?k={P_BLK}"))
    assert r.status_code == 403 and r.json()["error"] == "placeholder_misplaced"
    assert env.h2.saw(path) == []
    event = _event(env, f"{path}?k=REDACTED")
    assert (event["decision"], event["reason"], event["violation_surface"]) == (
        "deny",
        "placeholder_misplaced",
        "query",
    )


@pytest.mark.parametrize("http2", PROTOCOLS)
def test_violation_in_a_header_toward_an_unbound_host(env: Env, http2: bool) -> None:
    path = f"/violation-header/{int(http2)}"
    r = _send(env, http2, "GET", env.url("other.test", path), headers={"X-Key": P_HDR})
    assert r.status_code == 403 and r.json()["error"] == "placeholder_violation"
    event = _event(env, path)
    assert (event["decision"], event["violation_surface"]) == ("violation", "header")


@pytest.mark.parametrize("http2", PROTOCOLS)
def test_terminated_in_the_query(env: Env, http2: bool) -> None:
    path = f"/terminated-query/{int(http2)}"
    with env.client(http2) as client, pytest.raises(httpx.HTTPError):
        client.get(env.url("api.test", f"{path}?k={P_TERM}"))
    assert env.h2.saw(path) == []
    event = _event(env, f"{path}?k=REDACTED")
    assert event["status"] is None
    assert (event["reason"], event["violation_surface"]) == ("placeholder_misplaced", "query")


def _stream_with_late_placeholder(placeholder: bytes) -> Iterator[bytes]:
    yield b'{"pad": "' + b"." * (256 * 1024) + b'", '  # several reads leave before the placeholder
    yield b'"k": "' + placeholder + b'", "after": "' + b"." * 1024 + b'"}'


@pytest.mark.parametrize("http2", PROTOCOLS)
@pytest.mark.parametrize(
    ("placeholder", "reason"),
    [
        pytest.param(P_BLK, "placeholder_misplaced", id="block"),
        pytest.param(P_TERM, "placeholder_misplaced", id="terminate"),
    ],
)
def test_refused_in_a_body_closes_the_connection(
    env: Env, http2: bool, placeholder: str, reason: str
) -> None:
    """The request head has left: the connection is closed; the upstream never gets a whole request."""
    path = f"/refused-body/{int(http2)}/{placeholder[-4:]}"
    with env.client(http2) as client, pytest.raises(httpx.HTTPError):
        client.post(
            env.url("api.test", path),
            content=_stream_with_late_placeholder(placeholder.encode()),
            headers={"Content-Type": "application/json"},
        )
    event = _event(env, path)
    assert (event["reason"], event["violation_surface"], event["status"]) == (reason, "body", None)
    for seen in env.h2.saw(path):  # the head may have arrived; never the whole body
        assert not seen.complete


# --- issue 13, class 7: the audit never holds a secret, nor a placeholder that was swapped -----

AUDIT_QUERIES = [
    ("{ph}", "REDACTED", "bare-key"),
    ("{ph}=1", "REDACTED=REDACTED", "key-with-value"),
    ("a=1&{ph}&b", "a=REDACTED&REDACTED&b", "bare-key-between"),
    ("x.{ph}.y=1", "REDACTED=REDACTED", "inside-a-key"),
    ("{enc}=1", "REDACTED=REDACTED", "percent-encoded-key"),
    ("{lower}", "REDACTED", "lower-case-hex-key"),
    ("k={ph}", "k=REDACTED", "value"),
]


@pytest.mark.parametrize("http2", PROTOCOLS)
@pytest.mark.parametrize(("query", "logged", "name"), AUDIT_QUERIES, ids=[q[2] for q in AUDIT_QUERIES])
def test_a_placeholder_swapped_in_a_query_key_is_redacted_in_the_audit(
    env: Env, http2: bool, query: str, logged: str, name: str
) -> None:
    """``?PH`` and ``?PH=1`` used to be swapped and then logged with their keys: the secret in the
    audit line. The audit logs the target as sent, and redacts every component with a placeholder."""
    enc = P_SVC.replace("_", "%5F").replace("s", "%73", 1)
    lower = "".join(f"%{b:02x}" for b in P_SVC.encode())
    path = f"/audit-query/{int(http2)}/{name}"
    q = query.format(ph=P_SVC, enc=enc, lower=lower)
    r = _send(env, http2, "GET", env.url("api.test", f"{path}?{q}"))
    assert r.status_code == 200
    assert quote(env.secret, safe="-._~") in env.h2.last(path).target  # it was swapped
    event = _event(env, f"{path}?{logged}")
    assert event["credentials"] == [{"name": "svc", "version": 1}]
    line = json.dumps(event)
    for spelling in (P_SVC, P_SVC[5:], enc, lower, env.secret, quote(env.secret, safe="-._~")):
        assert spelling not in line


def test_placeholders_in_path_segments_and_params_are_redacted_in_the_audit(env: Env) -> None:
    path = f"/audit-seg/{P_SVC}/x;k={P_SVC};v=1/y"
    r = _send(env, False, "GET", env.url("api.test", f"{path}?{P_SVC}=1&n=2"))
    assert r.status_code == 200
    event = _event(env, "/audit-seg/REDACTED/x;k=REDACTED;v=1/y?REDACTED=REDACTED&n=REDACTED")
    assert P_SVC not in json.dumps(event) and env.secret not in json.dumps(event)


def test_every_audit_line_of_this_module_matches_the_schema(env: Env) -> None:
    """Runs last in this module: the events of every path above, against docs/audit-schema.json."""
    v = validator()
    events = env.proxy.audit_events()
    assert any(e.get("carried_on") for e in events) and any(e.get("violation_surface") for e in events)
    problems = [f"{e.get('path')}: {err.message}" for e in events for err in v.iter_errors(e)]
    assert problems == []
