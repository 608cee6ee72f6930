"""End to end: substitution slots (issue 13, class 4). A real proxy process, a real HTTPS upstream
that records what it received and reflects it (``/echo``), and curl.

A placeholder in a header a host reflects (Origin, Referer, Cookie, X-Request-Id,
Sec-WebSocket-Protocol) or in the Basic user name reaches the upstream as the placeholder, never
the secret, and is audited as carried; in the credential headers (Authorization, X-Api-Key, ...)
and the Basic password it is swapped. A credential that names its slots is swapped there only;
one with ``on_misplaced: block`` refuses a misplaced placeholder before any upstream connection.
"""

from __future__ import annotations

import base64
import json
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from harness import ProxyProcess
from servers import Upstream
from world import Stage, credential, egress, rules

pytestmark = pytest.mark.e2e

PH = "surr_SlotsE2eDefaultPlaceholder1"  # default slots, carry
PH_NAMED = "surr_SlotsE2eNamedPlaceholder02"  # headers [Cookie, X-Custom-Auth], basic_parts [user]
PH_BLOCK = "surr_SlotsE2eBlockPlaceholder03"  # default slots, block


@dataclass
class World:
    upstream: Upstream
    proxy: ProxyProcess
    token: str
    secrets: dict[str, str]  # credential name -> canary value
    received: list[bytes] = field(default_factory=list)

    def curl(self, path: str, *args: str) -> tuple[int, bytes]:
        done = subprocess.run(
            ["curl", "-sS", "--max-time", "20", "-x", self.proxy.url("c1", self.token)]
            + ["--cacert", str(self.proxy.ca_pem), "-w", "\n%{http_code}", *args]
            + [f"https://api.test:{self.upstream.port}{path}"],
            capture_output=True,
            timeout=30,
            check=False,
        )
        self.received.append(done.stdout + done.stderr)
        body, _, code = done.stdout.rpartition(b"\n")
        return int(code), body

    def got(self, path: str) -> list[tuple[str, str]]:
        """The header fields (names lower-cased) the upstream received at ``path`` (one request)."""
        (rec,) = [r for r in self.upstream.requests if r.path == path]
        return [(n.lower(), v) for n, v in rec.headers]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with Stage(tmp_path_factory.mktemp("slots")) as st:
        token = st.token("slots-token-" + secrets.token_hex(8), newline=False)
        values = {name: st.secret(name, tag=f"slots{name}") for name in ("svc", "named", "strict")}
        upstream = st.upstream(["api.test"])
        text = rules(
            [egress("api.test", upstream.port)],
            credentials=[
                credential("svc", PH, ["api.test"]),
                credential(
                    "named", PH_NAMED, ["api.test"], headers=["Cookie", "X-Custom-Auth"], basic_parts=["user"]
                ),
                credential("strict", PH_BLOCK, ["api.test"], on_misplaced="block"),
            ],
        )
        yield World(upstream, st.proxy(text, ["api.test"]), token, values, st.received)


def _basic(userpass: str) -> str:
    return "Basic " + base64.b64encode(userpass.encode()).decode()


REFLECTED = [
    ("Origin", f"https://{PH}.app.test"),
    ("Referer", f"https://app.test/page?t={PH}"),
    ("Cookie", f"session={PH}; theme=dark"),
    ("X-Request-Id", PH),
    ("Sec-WebSocket-Protocol", f"chat, {PH}"),
]


@pytest.mark.parametrize(("name", "value"), REFLECTED, ids=[r[0] for r in REFLECTED])
@pytest.mark.parametrize("http", ["--http1.1", "--http2"])
def test_a_placeholder_in_a_reflected_header_reaches_the_upstream_as_the_placeholder(
    world: World, name: str, value: str, http: str
) -> None:
    key = f"{name}{http}"  # query keys stay in the audit event's path (values are redacted)
    status, body = world.curl(f"/echo?{key}=1", http, "-H", f"{name}: {value}")
    assert status == 200
    got = world.got(f"/echo?{key}=1")
    assert (name.lower(), value) in got  # the placeholder, as sent
    assert world.secrets["svc"] not in json.dumps(got)
    assert value.encode() in body  # the upstream reflected it: the placeholder came back
    event = world.proxy.wait_event(path=f"/echo?{key}=REDACTED")
    assert (event["decision"], event["credentials"], event["carried"]) == ("allow", [], ["svc"])
    assert event["carried_on"] == [{"name": "svc", "surface": "header"}]


def test_a_placeholder_as_the_basic_user_name_is_not_swapped(world: World) -> None:
    status, _ = world.curl("/t/basic-user", "-u", f"{PH}:x-oauth-basic")
    assert status == 200
    assert ("authorization", _basic(f"{PH}:x-oauth-basic")) in world.got("/t/basic-user")


def test_the_credential_headers_and_the_basic_password_are_swapped(world: World) -> None:
    secret = world.secrets["svc"]
    assert world.curl("/t/bearer", "-H", f"Authorization: Bearer {PH}")[0] == 200
    assert ("authorization", f"Bearer {secret}") in world.got("/t/bearer")
    assert world.curl("/t/api-key", "-H", f"x-api-key: {PH}")[0] == 200
    assert ("x-api-key", secret) in world.got("/t/api-key")
    assert world.curl("/t/basic-password", "-u", f"git:{PH}")[0] == 200
    assert ("authorization", _basic(f"git:{secret}")) in world.got("/t/basic-password")


def test_named_slots_are_the_only_ones(world: World) -> None:
    secret = world.secrets["named"]
    status, _ = world.curl(
        "/t/named",
        "-H", f"Cookie: s={PH_NAMED}",
        "-H", f"X-Custom-Auth: {PH_NAMED}",
        "-H", f"Authorization: Bearer {PH_NAMED}",
    )  # fmt: skip
    assert status == 200
    got = world.got("/t/named")
    assert ("cookie", f"s={secret}") in got and ("x-custom-auth", secret) in got
    assert ("authorization", f"Bearer {PH_NAMED}") in got  # not one of its slots: carried
    assert world.curl("/t/named-basic", "-u", f"{PH_NAMED}:{PH_NAMED}")[0] == 200
    assert ("authorization", _basic(f"{secret}:{PH_NAMED}")) in world.got("/t/named-basic")


@pytest.mark.parametrize(
    ("args", "surface"),
    [(["-H", f"Origin: https://{PH_BLOCK}.app.test"], "header"), (["-u", f"{PH_BLOCK}:x"], "basic")],
    ids=["origin", "basic-user"],
)
def test_a_misplaced_placeholder_of_a_blocking_credential_is_refused_before_connecting(
    world: World, args: list[str], surface: str
) -> None:
    before = world.upstream.connections
    path = f"/t/blocked-{surface}"
    status, body = world.curl(path, *args)
    assert status == 403 and json.loads(body)["error"] == "placeholder_misplaced"
    assert [r for r in world.upstream.requests if r.path == path] == []
    assert world.upstream.connections == before
    event = world.proxy.wait_event(path=path)
    assert (event["reason"], event["violation_surface"]) == ("placeholder_misplaced", surface)
