"""How a flow ended, as the audit event and the metrics say it (issue 18 items 6 and 7,
addons/ending.py).

Item 6: a client that stops reading a stream after its last event (the OpenAI SDK after
``data: [DONE]``) was audited ``decision: error, reason: client_closed`` and counted as
``upstream_or_client``. Now it is ``allow``/``client_closed`` in both; a client that leaves
mid-event or before the head is ``error``/``client_closed``; an upstream that dies mid-body is
``error``/``upstream_error``. Real httpx clients over HTTP/1.1 and HTTP/2, a raw upstream
(tests/rawserver.py) that holds its stream open after the last event until the test lets it go.

Item 7: a refusal after substitution (resolve's special_address and own_listener, a refused or
failed upstream connection, a spent budget, a hook route's failure) listed the swapped
credential as used although nothing was sent, and named ``rule: null`` although a rule had
allowed the request. Now ``credentials`` holds only secrets that left, and the allowing rule stays.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import httpx
import pytest
from _netns import Lab, NsProxy, missing, sh
from harness import ProxyProcess
from rawserver import RawUpstream
from world import Stage, claim, control, credential, egress, rules

pytestmark = pytest.mark.e2e

PH = "surr_EndingsPlaceholder00001"
PH_METERED = "surr_EndingsMeteredPlace0002"
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class _H2First(ssl.SSLContext):
    """httpx offers ALPN ``http/1.1`` before ``h2``, and mitmproxy takes the client's first
    choice: this context offers ``h2`` first, as curl and browsers do."""

    def set_alpn_protocols(self, alpn_protocols: Iterable[str]) -> None:
        super().set_alpn_protocols(sorted(alpn_protocols, key=lambda p: p != "h2"))


@dataclass
class World:
    proxy: ProxyProcess
    raw: RawUpstream
    secret: str
    metered: str
    release: threading.Event  # lets a held stream (or head) go on
    received: list[bytes] = field(default_factory=list)
    closed_port: int = 0

    def client(self, http2: bool, timeout: float = 10) -> httpx.Client:
        ctx = _H2First(ssl.PROTOCOL_TLS_CLIENT) if http2 else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations(cafile=str(self.proxy.ca_pem))
        return httpx.Client(
            proxy=self.proxy.url("c", "tok"), verify=ctx, http1=not http2, http2=http2, timeout=timeout
        )

    def url(self, path: str, host: str = "api.test", port: int | None = None) -> str:
        return f"https://{host}:{port or self.raw.port}{path}"

    def metrics(self) -> str:
        with control(self.proxy) as api:
            return api.get("/metrics").text


def _held(release: threading.Event, then: bytes) -> Any:
    def piece() -> bytes:
        release.wait(10)
        return then

    return piece


def _dies() -> bytes:
    raise OSError("the upstream dies mid-body")  # rawserver closes the connection


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with Stage(tmp_path_factory.mktemp("endings")) as st:
        secret = st.secret("k", tag="endings", file="secret")
        metered = st.secret("metered", tag="endmeter", file="metered")
        st.token("tok")
        release = threading.Event()
        raw = st.serve(RawUpstream(st.ca, ["api.test", "closed.test"]))
        event = _chunk(b'data: {"delta": "hi"}\n\n')
        raw.responses["/done"] = [SSE_HEAD, event, _chunk(b"data: [DONE]\n\n"), _held(release, _chunk(b""))]
        raw.responses["/cut"] = [
            SSE_HEAD,
            event,
            _chunk(b'data: {"del'),
            _held(release, _chunk(b"ta\n\n") + _chunk(b"")),
        ]
        raw.responses["/whole"] = [SSE_HEAD, event, _chunk(b"data: [DONE]\n\n"), _chunk(b"")]
        raw.responses["/late-head"] = [_held(release, SSE_HEAD + _chunk(b""))]
        raw.responses["/dies"] = [SSE_HEAD, event, _chunk(b'data: {"par'), _dies]
        raw.responses["/ok"] = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n"
        with socket.socket() as probe:  # a loopback port nothing listens on
            probe.bind(("127.0.0.1", 0))
            closed_port = probe.getsockname()[1]
        # tlsbad.test reaches the raw upstream, whose certificate names only api.test
        proxy = st.proxy(st.write(""), ["api.test", "closed.test", "tlsbad.test"], start=False)
        st.defer(release.set)  # before the proxy stops: a held stream or head goes on
        hosts = ["api.test", "closed.test", "127.0.0.2", "127.0.0.1", "tlsbad.test"]
        text = rules(
            [
                egress("api.test", raw.port),
                egress("closed.test", closed_port),
                egress("127.0.0.2", raw.port),
                egress("127.0.0.1", proxy.port),
                egress("tlsbad.test", raw.port),
            ],
            pool_extra={"hooks": [{"host": "api.test", "paths": ["/hook"], "command": ["/bin/false"]}]},
            claims=[
                claim(
                    "c",
                    [
                        credential("k", PH, hosts, "file:secret"),
                        credential(
                            "metered",
                            PH_METERED,
                            ["api.test"],
                            "file:metered",
                            headers=["X-Metered"],
                            max_requests=1,
                        ),
                    ],
                )
            ],
        )
        proxy.rules.write_text(text)
        proxy.start()
        yield World(proxy, raw, secret, metered, release, st.received, closed_port=closed_port)


PROTOCOLS = pytest.mark.parametrize("http2", [False, True], ids=["http1.1", "http2"])


def _read_until(world: World, http2: bool, path: str, last: str | None) -> list[str]:
    """Stream ``path``, read lines until ``last`` (None: to the end), then close the client's
    connection (HTTP/1.1: the response's connection; HTTP/2: the client, with its GOAWAY)."""
    lines: list[str] = []
    world.release.clear()
    try:
        with world.client(http2) as client, client.stream("GET", world.url(path)) as response:
            assert response.status_code == 200
            assert response.http_version == ("HTTP/2" if http2 else "HTTP/1.1")
            for line in response.iter_lines():
                lines.append(line)
                if line == last:
                    break
    finally:
        world.received.append("\n".join(lines).encode())
    return lines


@PROTOCOLS
def test_a_client_that_stops_after_the_last_event_is_allowed_not_an_error(world: World, http2: bool) -> None:
    """The OpenAI SDK's way: read to ``data: [DONE]``, close; the upstream has not ended yet."""
    path = f"/done?{'h2' if http2 else 'h1'}"
    lines = _read_until(world, http2, path, "data: [DONE]")
    event = world.proxy.wait_event(path=path, timeout=10)
    world.release.set()
    assert lines[-1] == "data: [DONE]"
    assert (event["decision"], event["reason"], event["status"]) == ("allow", "client_closed", 200)
    assert event["message"] is None and event["rule"] == "p.egress[0] api.test"


@PROTOCOLS
def test_a_client_that_leaves_mid_event_is_an_error_of_the_client(world: World, http2: bool) -> None:
    path = f"/cut?{'h2' if http2 else 'h1'}"
    lines: list[str] = []
    world.release.clear()
    with world.client(http2) as client, client.stream("GET", world.url(path)) as response:
        for chunk in response.iter_bytes():  # the event and the start of the next, then leave
            lines.append(chunk.decode())
            if "del" in "".join(lines):
                break
    event = world.proxy.wait_event(path=path, timeout=10)
    world.release.set()
    assert (event["decision"], event["reason"], event["status"]) == ("error", "client_closed", 200)
    assert event["rule"] == "p.egress[0] api.test" and event["message"]


@PROTOCOLS
def test_a_client_that_reads_to_the_end_is_allowed(world: World, http2: bool) -> None:
    path = f"/whole?{'h2' if http2 else 'h1'}"
    lines = _read_until(world, http2, path, None)
    event = world.proxy.wait_event(path=path, timeout=10)
    assert "data: [DONE]" in lines
    assert (event["decision"], event["reason"], event["status"]) == ("allow", "allowed", 200)


@PROTOCOLS
def test_a_client_that_gives_up_before_the_head_is_an_error_of_the_client(world: World, http2: bool) -> None:
    path = f"/late-head?{'h2' if http2 else 'h1'}"
    world.release.clear()
    with world.client(http2, timeout=1) as client, contextlib.suppress(httpx.ReadTimeout):
        client.get(world.url(path))
    event = world.proxy.wait_event(path=path, timeout=10)
    world.release.set()
    assert (event["decision"], event["reason"], event["status"]) == ("error", "client_closed", None)


@PROTOCOLS
def test_an_upstream_that_dies_mid_stream_is_an_upstream_error(world: World, http2: bool) -> None:
    path = f"/dies?{'h2' if http2 else 'h1'}"
    with (
        world.client(http2) as client,
        contextlib.suppress(httpx.HTTPError),
        client.stream("GET", world.url(path)) as response,
    ):
        for _ in response.iter_bytes():
            pass
    event = world.proxy.wait_event(path=path, timeout=10)
    assert (event["decision"], event["reason"]) == ("error", "upstream_error")


# -- item 7: credentials are used only when a secret left; the allowing rule stays -------------


def _request(world: World, url: str, headers: dict[str, str]) -> int:
    with world.client(http2=False) as client:
        try:
            response = client.get(url, headers=headers)
        except httpx.HTTPError:
            return 0
        world.received.append(response.content)
        return response.status_code


BEARER = {"Authorization": f"Bearer {PH}"}

REFUSALS_AFTER_SUBSTITUTION = [
    # (id, url builder, headers, status, reason, rule index)
    ("special-address", lambda w: w.url("/special", "127.0.0.2"), BEARER, 403, "special_address", 2),
    ("own-listener", lambda w: w.url("/own", "127.0.0.1", w.proxy.port), BEARER, 403, "own_listener", 3),
    (
        "connect-refused",
        lambda w: w.url("/closed", "closed.test", w.closed_port),
        BEARER,
        502,
        "upstream_error",
        1,
    ),
    ("upstream-tls-failed", lambda w: w.url("/tlsbad", "tlsbad.test"), BEARER, 502, "upstream_error", 4),
    ("hook-failed", lambda w: w.url("/hook?row"), BEARER, 502, "hook_failed", 0),
]


@pytest.mark.parametrize(
    ("url", "headers", "status", "reason", "rule"),
    [row[1:] for row in REFUSALS_AFTER_SUBSTITUTION],
    ids=[row[0] for row in REFUSALS_AFTER_SUBSTITUTION],
)
def test_a_refusal_after_substitution_lists_no_credential_and_keeps_the_rule(
    world: World, url: Any, headers: dict[str, str], status: int, reason: str, rule: int
) -> None:
    target = url(world)
    assert _request(world, target, headers) == status
    event = world.proxy.wait_event(path="/" + target.split("/", 3)[3], timeout=10)
    assert event["reason"] == reason
    hosts = ["api.test", "closed.test", "127.0.0.2", "127.0.0.1", "tlsbad.test"]
    assert event["credentials"] == [], event
    assert event["rule"] == f"p.egress[{rule}] {hosts[rule]}"
    assert (event["decision"], event["status"]) == ("error" if status >= 500 else "deny", status)


def test_a_spent_budget_lists_no_credential_and_keeps_the_rule(world: World) -> None:
    headers = {"X-Metered": PH_METERED}
    assert _request(world, world.url("/ok?budget-1"), headers) == 200
    first = world.proxy.wait_event(path="/ok?budget-1")
    assert first["credentials"] == [{"name": "metered", "version": 1}]
    assert _request(world, world.url("/ok?budget-2"), headers) == 403
    event = world.proxy.wait_event(path="/ok?budget-2")
    assert (event["reason"], event["credentials"], event["rule"]) == (
        "credential_budget_spent",
        [],
        "p.egress[0] api.test",
    )


def test_a_request_that_left_lists_its_credential(world: World) -> None:
    """The control row: swapped, sent, listed."""
    assert _request(world, world.url("/ok?sent"), BEARER) == 200
    event = world.proxy.wait_event(path="/ok?sent")
    assert event["credentials"] == [{"name": "k", "version": 1}] and event["rule"] == "p.egress[0] api.test"


def test_zz_metrics_say_what_the_audit_says(world: World) -> None:
    """Runs after the traffic above: the same decision and reason labels, no
    ``upstream_or_client``, and no swap counted for the refusals after substitution."""
    text = world.metrics()

    def value(sample: str) -> float:
        line = next((x for x in text.splitlines() if x.startswith(sample + " ")), None)
        return float(line.rsplit(" ", 1)[1]) if line else 0.0

    assert "upstream_or_client" not in text
    assert value('surrogate_requests_total{decision="allow",reason="client_closed",status_class="2xx"}') >= 2
    assert value('surrogate_requests_total{decision="error",reason="client_closed",status_class="2xx"}') >= 2
    assert value('surrogate_requests_total{decision="error",reason="client_closed",status_class="none"}') >= 2
    # swapped into: /ok?sent and the SSE requests carry no placeholder; only /ok?sent counts for k
    assert value('surrogate_substitutions_total{credential="k"}') == 1
    assert value('surrogate_substitutions_total{credential="metered"}') == 1


def test_an_unresolvable_name_lists_no_credential_and_keeps_the_rule(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The issue's example (``502 unresolvable``). The proxy runs in a network namespace of its
    own with only loopback, so the lookup of ``gone.test`` fails there at once and no DNS query
    leaves the machine."""
    why = missing()
    if why is not None:
        pytest.skip(why)
    with Stage(tmp_path_factory.mktemp("unresolvable")) as st:
        st.secret("k", tag="endunres", file="secret")
        st.token("tok")
        text = rules(
            [egress("gone.test")], claims=[claim("c", [credential("k", PH, ["gone.test"], "file:secret")])]
        )
        lab = Lab()
        st.defer(lab.teardown)
        ns = lab.add("unres")
        proxy = st.proxy(text, upstream_ca=None, cls=partial(NsProxy, ns))
        done = sh(
            "curl", "-sS", "--max-time", "20", "-o", "/dev/null", "-w", "%{http_code}",
            "-x", proxy.url("c", "tok"), "--cacert", str(proxy.ca_pem),
            "-H", f"Authorization: Bearer {PH}", "https://gone.test/x",
            ns=ns, check=False,
        )  # fmt: skip
        event = proxy.wait_event(path="/x", timeout=10)
    assert done.stdout == "502", done.stderr
    assert (event["reason"], event["status"], event["credentials"], event["rule"]) == (
        "unresolvable",
        502,
        [],
        "p.egress[0] gone.test",
    )
