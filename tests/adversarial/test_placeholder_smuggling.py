"""Placeholder smuggling: odd spellings cannot carry a placeholder past the violation check
toward a host its credential is not bound to. Defence: proxy/core/substitute.py ``substitute_request``
(lenient Basic decoding, percent-decoded request target). Forged placeholders (checksums) are the
other helper's tests/adversarial/test_placeholder_forgery.py."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
from typing import Any
from urllib.parse import quote

import pytest
from harness import World, status_line

PH = "surr_HostileTestPlaceholder001"


@pytest.mark.parametrize(
    "header",
    [
        "Basic\t" + base64.b64encode(f"x:{PH}".encode()).decode(),
        "Basic " + base64.b64encode(f"xx:{PH}".encode()).decode().rstrip("="),
        "Basic "
        + " ".join(base64.b64encode(f"x:{PH}".encode()).decode()[i : i + 8] for i in range(0, 44, 8)),
        "basic " + base64.b64encode(f"x:{PH}".encode()).decode(),
    ],
    ids=["tab-separator", "no-padding", "spaces-inside", "lower-case-scheme"],
)
def test_odd_basic_spellings_still_count_as_a_placeholder(world: World, header: str) -> None:
    before = world.upstream.connections
    done = world.curl("--http1.1", "-H", f"Authorization: {header}", world.url("/odd-basic", "other.test"))
    assert done.stdout.endswith(b"403") and b"placeholder_violation" in done.stdout
    assert world.paths("/odd-basic") == [] and world.upstream.connections == before


@pytest.mark.parametrize(
    "query",
    [PH.replace("_", "%5F"), PH.replace("_", "%5f"), "".join(f"%{b:02X}" for b in PH.encode()), PH],
    ids=["underscore-encoded", "lower-hex", "every-byte-encoded", "plain"],
)
def test_a_placeholder_in_the_query_toward_an_unbound_host_is_a_violation(world: World, query: str) -> None:
    before = world.upstream.connections
    done = world.curl(world.url(f"/q?key={query}", "other.test"))
    assert done.stdout.endswith(b"403") and b"placeholder_violation" in done.stdout
    assert world.paths("/q") == [] and world.upstream.connections == before


def test_a_placeholder_in_any_header_toward_an_unbound_host_is_a_violation(world: World) -> None:
    before = world.upstream.connections
    done = world.curl("-H", f"X-Anything: prefix-{PH}-suffix", world.url("/any-header", "other.test"))
    assert done.stdout.endswith(b"403") and b"placeholder_violation" in done.stdout
    assert world.paths("/any-header") == [] and world.upstream.connections == before


# --- issue 13, class 5: every spelling is refused toward an unbound host, and audited ---------
# Each of these reached other.test unrefused before (no secret left: only the placeholder did).


def _b64(data: bytes, urlsafe: bool = False, pad: bool = True) -> str:
    out = base64.urlsafe_b64encode(data) if urlsafe else base64.b64encode(data)
    return (out if pad else out.rstrip(b"=")).decode()


def _refused_and_audited(world: World, done: subprocess.CompletedProcess[bytes], path: str) -> dict[str, Any]:
    """The request got 403 placeholder_violation, the upstream saw nothing of it, and its audit
    event says violation, naming the credential (found by the refusal's request id)."""
    body, _, code = done.stdout.rpartition(b"\n")
    assert code == b"403", done.stdout + done.stderr
    refusal = json.loads(body)
    assert (refusal["error"], refusal["decision"]) == ("placeholder_violation", "violation")
    assert world.paths(path) == []
    event = world.proxy.wait_event(request_id=refusal["request_id"])
    assert (event["decision"], event["reason"], event["credentials"]) == (
        "violation",
        "placeholder_violation",
        [],
    )
    assert event["violation_surface"] in ("header", "basic", "query", "path")
    return event


# A user name whose base64url differs from its base64 ("~~?" encodes to "fn4_" / "fn4/").
URLSAFE_USER = b"~~?"
NAMED = [
    (["--http1.1", "-H", f"{PH}: 1"], "/sm/name", "header-name"),
    (["--http1.1", "-H", f"X-{PH}-Flag: 1"], "/sm/name-inside", "inside-a-header-name"),
    (["-H", f"Authorization: Basic {_b64(URLSAFE_USER + b':' + PH.encode(), urlsafe=True, pad=False)}"],
     "/sm/basic-url", "basic-base64url"),
    (["-H", f"Cookie: s={PH.replace('_', '%5F')}"], "/sm/cookie", "cookie-percent-encoded"),
    (["-H", f"X-Trace: {_b64(PH.encode())}"], "/sm/b64", "base64-in-any-header"),
    # r2 review: each reached other.test unrefused before
    (["-H", "X-Trace: " + " ".join(_b64(PH.encode())[i : i + 8] for i in range(0, 40, 8))],
     "/sm/b64-words", "base64-broken-by-spaces-in-a-header"),
    ([], "/sm/b64-lines?t=" + "%0D%0A".join(_b64(PH.encode())[i : i + 16] for i in range(0, 40, 16)),
     "base64-in-lines-in-the-query"),
    ([], "/sm/utf16?t=" + quote(PH.encode("utf-16-le")), "utf16-percent-encoded-in-the-query"),
    ([], "/sm/utf16-key?" + quote(PH.encode("utf-16")) + "=1", "utf16-with-bom-as-a-query-key"),
    (["-H", f"X-Trace: {_b64(PH.encode('utf-16-le'))}"], "/sm/utf16-b64", "base64-of-utf16-in-a-header"),
    (["-H", f"Cookie: a=1; s={quote(PH.encode('utf-16-be'))}"], "/sm/utf16-cookie", "utf16-in-a-cookie"),
    ([], "/sm/iis?t=" + PH.replace("_", "%u005F"), "iis-percent-u-in-the-query"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "path"), [n[:2] for n in NAMED], ids=[n[2] for n in NAMED])
def test_named_spellings_toward_an_unbound_host_are_refused_and_audited(
    world: World, args: list[str], path: str
) -> None:
    before = world.upstream.connections
    done = world.curl(*args, world.url(path, "other.test"))
    _refused_and_audited(world, done, path)
    assert world.upstream.connections == before


def _percent(text: str, every: int, lower: bool) -> str:
    """``text`` with every ``every``-th character percent-encoded (``_`` always), in one hex case."""
    out = ""
    for i, c in enumerate(text):
        if c == "_" or i % every == 0:
            hx = f"%{ord(c):02X}"
            out += hx.lower() if lower else hx
        else:
            out += c
    return out


def _spellings() -> list[tuple[str, str]]:
    """(spelling, id): percent-encoding of any character in either hex case, base64 and base64url
    of the placeholder at each of the 3 alignments inside a longer value, padded and not, and one
    nested (base64 of a percent-encoded placeholder)."""
    out = [(_percent(PH, 1, False), "percent-every-byte"), (_percent(PH, 3, True), "percent-some-lower")]
    for k in range(3):
        inner = b"k" * k + PH.encode() + b"!"
        out.append((_b64(inner), f"base64-align{k}"))
        out.append((_b64(inner, urlsafe=True, pad=False), f"base64url-align{k}-unpadded"))
    out.append(("v1." + _b64(_percent(PH, 5, False).encode(), urlsafe=True), "base64url-of-percent"))
    return out


def _placed(spelling: str, where: str) -> tuple[list[str], str]:
    """curl arguments and path for ``spelling`` placed ``where``; query and path parts keep the
    characters a URL cannot hold literally percent-encoded (as a client would send them)."""
    url_safe = spelling.replace("+", "%2B").replace("/", "%2F").replace("=", "%3D")
    if where == "header-value":
        return ["-H", f"X-Correlation: a,{spelling};b"], "/gen/hv"
    if where == "header-name-mixed-case":  # '%' is a token character: any spelling fits
        return ["--http1.1", "-H", f"x-TrAcE-{url_safe}: 1"], "/gen/hn"
    if where == "userinfo-password":
        return ["-u", f"git:{spelling}"], "/gen/ui"
    if where == "query-key":
        return [], f"/gen/qk?{url_safe}=1"
    if where == "query-value":
        return [], f"/gen/qv?a=1&t=x{url_safe}"
    return [], f"/gen/{url_safe}/seg"


PLACES = [
    "header-value",
    "header-name-mixed-case",
    "userinfo-password",
    "query-key",
    "query-value",
    "path-segment",
]


@pytest.mark.parametrize("where", PLACES)
@pytest.mark.parametrize(("spelling", "sid"), _spellings(), ids=[s[1] for s in _spellings()])
def test_generated_spellings_anywhere_toward_an_unbound_host_are_refused_and_audited(
    world: World, spelling: str, sid: str, where: str
) -> None:
    args, path = _placed(spelling, where)
    done = world.curl(*args, world.url(path, "other.test"))
    _refused_and_audited(world, done, path.split("?")[0])


@pytest.mark.parametrize(
    "userinfo", [f"x:{PH}", PH, f"x:{PH.replace('_', '%5F')}"], ids=["password", "user", "percent"]
)
@pytest.mark.parametrize("tunnelled", [False, True], ids=["plain-http", "in-a-tunnel"])
def test_url_userinfo_in_the_request_line_is_refused_before_any_upstream_connection(
    world: World, userinfo: str, tunnelled: bool
) -> None:
    """Clients send URL userinfo as Basic credentials (scanned above); one written into the
    request line itself is refused by mitmproxy's HTTP/1 reader (400) before any hook runs, so
    there is no request and no audit event, only the refusal (RFC 9110 §4.2.4 forbids it)."""
    before = world.upstream.connections
    port = world.upstream.port
    if tunnelled:
        head = f"GET https://{userinfo}@other.test:{port}/ui HTTP/1.1\r\nHost: other.test:{port}\r\n\r\n"
        data = world.tunnel_request(head.encode(), host="other.test")
    else:
        with socket.create_connection(("127.0.0.1", world.proxy.port), timeout=10) as s:
            s.sendall(
                f"GET http://{userinfo}@plain.test:{port}/ui HTTP/1.1\r\nHost: plain.test:{port}\r\n"
                f"Proxy-Authorization: {world.proxy_auth()}\r\n\r\n".encode()
            )
            data = s.recv(65536)
        world.received.append(data)
    assert status_line(data) == b"400", data[:200]
    assert world.paths("/ui") == [] and world.upstream.connections == before
