"""Format-valid placeholders (issue 15) end to end: the OpenAI and Anthropic Python SDKs and
``gh`` hold placeholders minted from shipped templates (``sk-proj-``, ``sk-ant-api03-``,
``ghp_``) in their own environment variables (OPENAI_API_KEY, ANTHROPIC_API_KEY, GH_TOKEN) and
talk through a real proxy to local upstreams under the real host names (tests/e2e/_apis.py,
pinned to one address of 127.0.0.0/8 by the proxy's ``--resolve``). Each SDK takes its
placeholder (no format refusal), the upstream sees only the real canary, and what the client got
holds no canary (the stage checks every received byte at close).

Also through the proxy: a template placeholder no claim registered, or another claim's, is
refused ``forged_placeholder`` before any upstream connection; a real-looking ``ghp_`` token
with GitHub's valid CRC32 but no surrogate checksum passes inert (the upstream gets it as sent);
a template placeholder split across two reads is swapped in an upload and scrubbed back in a
response exactly (servers.Upstream /upload, /reflect-split)."""

from __future__ import annotations

import random
import secrets
import shutil
import string
import subprocess
import sys
import textwrap
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from _apis import STREAM_WORDS, Apis
from _sandboxenv import printed_env, sandbox
from harness import ProxyProcess
from servers import Upstream
from world import Stage, claim, control, credential, egress, rules

from proxy.core import placeholders, templates

pytestmark = pytest.mark.e2e

OPENAI = templates.mint(templates.SHIPPED["openai"])
ANTHROPIC = templates.mint(templates.SHIPPED["anthropic"])
GITHUB = templates.mint(templates.SHIPPED["github_classic"])
UPLOAD = templates.mint(templates.SHIPPED["stripe_live"])  # on api.test, body surface
OTHERS_GITHUB = templates.mint(templates.SHIPPED["github_classic"])  # claim "other"'s
NOBODYS_OPENAI = templates.mint(templates.SHIPPED["openai"])  # valid checksum, registered nowhere
_GH62 = string.digits + string.ascii_uppercase + string.ascii_lowercase


def real_looking_ghp() -> str:
    """A ``ghp_`` token as GitHub issues them: 30 random, then base62 CRC32 of them."""
    body = "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(30))
    n, crc = zlib.crc32(body.encode()), ""
    while n:
        n, d = divmod(n, 62)
        crc = _GH62[d] + crc
    return "ghp_" + body + crc.rjust(6, "0")


@dataclass
class World:
    proxy: ProxyProcess
    apis: Apis
    upstream: Upstream
    secrets: dict[str, str]
    env: dict[str, str]
    tmp: Path
    received: list[bytes]

    def run(self, args: list[str], extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
        """``args`` with the printed environment plus ``extra`` and nothing else."""
        done = subprocess.run(
            args,
            capture_output=True,
            text=True,
            env={**self.env, **extra},
            cwd=self.tmp,
            timeout=90,
            check=False,
        )
        self.received.append((done.stdout + done.stderr).encode())
        return done

    def python(self, script: str, extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return self.run([sys.executable, "-c", textwrap.dedent(script)], {**self.base_urls(), **extra})

    def base_urls(self) -> dict[str, str]:
        if self.apis.port == 443:
            return {}
        origin = f":{self.apis.port}"
        return {
            "OPENAI_BASE_URL": f"https://api.openai.com{origin}/v1",
            "ANTHROPIC_BASE_URL": f"https://api.anthropic.com{origin}",
        }

    def events(self, host: str) -> list[dict[str, object]]:
        return [e for e in self.proxy.audit_events() if e.get("event") == "request" and e.get("host") == host]

    def curl(self, *args: str, proxy: str | None = None) -> tuple[int, bytes]:
        done = subprocess.run(
            ["curl", "-sS", "--max-time", "20", "-x", proxy or self.env["HTTPS_PROXY"]]
            + ["--cacert", str(self.proxy.ca_pem), "-w", "\n%{http_code}", *args],
            capture_output=True,
            timeout=30,
            check=False,
        )
        self.received.append(done.stdout + done.stderr)
        body, _, code = done.stdout.rpartition(b"\n")
        return int(code), body


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    addr = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}"
    with Stage(tmp_path_factory.mktemp("templates")) as st:
        names = ("openai", "anthropic", "github", "upload")
        values = {name: st.secret(name, tag=f"tp{name}") for name in names}
        st.token("templates-proxy-token")
        (st.tmp / "other-token").write_text("templates-other-token\n")
        accepted = {
            "api.openai.com": values["openai"],
            "api.anthropic.com": values["anthropic"],
            "api.github.com": values["github"],
        }
        try:
            apis = Apis(st.ca, accepted, (addr, 443))
        except PermissionError:  # not root, no CAP_NET_BIND_SERVICE
            apis = Apis(st.ca, accepted, (addr, 0))
        st.enter(apis)
        upstream = st.upstream(["api.test"])
        text = rules(
            [egress(h, apis.port) for h in sorted(accepted)] + [egress("api.test", upstream.port)],
            claims=[
                claim(
                    "sbx",
                    [
                        credential("openai", OPENAI, ["api.openai.com"], placeholder_template="openai"),
                        credential(
                            "anthropic", ANTHROPIC, ["api.anthropic.com"], placeholder_template="anthropic"
                        ),
                        credential(
                            "github", GITHUB, ["api.github.com"], placeholder_template="github_classic"
                        ),
                        credential(
                            "upload",
                            UPLOAD,
                            ["api.test"],
                            placeholder_template="stripe_live",
                            surfaces=["header", "body"],
                        ),
                    ],
                ),
                claim(
                    "other",
                    [credential("github", OTHERS_GITHUB, ["api.github.com"], "file:secret-github")],
                    token="file:other-token",
                ),
            ],
        )
        pins = dict.fromkeys(accepted, addr) | {"api.test": "127.0.0.1"}
        proxy = st.proxy(text, pins)
        env = sandbox(printed_env(proxy, "sbx"), st.tmp / "home")
        w = World(proxy, apis, upstream, values, env, st.tmp, st.received)
        yield w


def _sent(world: World, host: str) -> set[str]:
    return {c for _, _, c in world.apis.requests(host)}


def _no_canary(done: subprocess.CompletedProcess[str], world: World) -> None:
    out = done.stdout + done.stderr
    assert not [n for n, v in world.secrets.items() if v in out]


def test_the_rules_file_holds_template_placeholders() -> None:
    for ph, name in ((OPENAI, "openai"), (ANTHROPIC, "anthropic"), (GITHUB, "github_classic")):
        assert placeholders.template_of(ph) is templates.SHIPPED[name]
        assert placeholders.has_valid_checksum(ph)
    assert (
        OPENAI.startswith("sk-proj-") and ANTHROPIC.startswith("sk-ant-api03-") and GITHUB.startswith("ghp_")
    )


def test_the_openai_sdk_takes_a_template_placeholder_from_openai_api_key(world: World) -> None:
    done = world.python(
        """
        import openai
        client = openai.OpenAI(max_retries=0)  # reads OPENAI_API_KEY itself
        stream = client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        print("|".join(c.choices[0].delta.content or "" for c in stream if c.choices))
        """,
        {"OPENAI_API_KEY": OPENAI},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "|".join([*STREAM_WORDS, ""])
    assert _sent(world, "api.openai.com") == {f"Bearer {world.secrets['openai']}"}
    assert {(e["decision"], e["status"]) for e in world.events("api.openai.com")} == {("allow", 200)}
    _no_canary(done, world)


def test_the_anthropic_sdk_takes_a_template_placeholder_from_anthropic_api_key(world: World) -> None:
    done = world.python(
        """
        import anthropic
        client = anthropic.Anthropic(max_retries=0)  # reads ANTHROPIC_API_KEY itself
        with client.messages.stream(
            model="claude-sonnet-4-5", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            print("|".join(stream.text_stream))
        """,
        {"ANTHROPIC_API_KEY": ANTHROPIC},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "|".join(STREAM_WORDS)
    secret = world.secrets["anthropic"]
    assert _sent(world, "api.anthropic.com") and _sent(world, "api.anthropic.com") <= {
        secret,
        f"Bearer {secret}",
    }
    assert {(e["decision"], e["status"]) for e in world.events("api.anthropic.com")} == {("allow", 200)}
    _no_canary(done, world)


def _gh(world: World, token: str) -> subprocess.CompletedProcess[str]:
    gh = shutil.which("gh")
    if gh is None:
        pytest.skip("no gh here (apt gh; .ci/run installs it)")
    if world.apis.port != 443:
        pytest.skip("gh reaches api.github.com on port 443 only, which this user may not bind")
    extra = {
        "GH_TOKEN": token,
        "GH_CONFIG_DIR": str(world.tmp / "gh"),
        "GH_NO_UPDATE_NOTIFIER": "1",
        "GH_PROMPT_DISABLED": "1",
    }
    return world.run([gh, "api", "user", "--jq", ".login"], extra)


def test_gh_takes_a_ghp_template_placeholder_from_gh_token(world: World) -> None:
    before = len(world.apis.requests("api.github.com"))
    done = _gh(world, GITHUB)
    assert done.returncode == 0 and done.stdout.strip() == "surrogate-octocat", done.stdout + done.stderr
    assert {c for _, _, c in world.apis.requests("api.github.com")[before:]} == {
        f"token {world.secrets['github']}"
    }
    _no_canary(done, world)


def test_another_claims_ghp_placeholder_is_refused_as_forged(world: World) -> None:
    before = len(world.apis.requests("api.github.com"))
    done = _gh(world, OTHERS_GITHUB)
    assert done.returncode != 0
    assert world.apis.requests("api.github.com")[before:] == []  # no upstream request
    (event,) = [e for e in world.events("api.github.com") if e.get("reason") == "forged_placeholder"]
    assert event["decision"] == "violation" and [p.lower() for p in event["forged"]] == [
        "header authorization"
    ]
    assert OTHERS_GITHUB not in world.proxy.audit_path.read_text()
    _no_canary(done, world)


def test_a_template_placeholder_nobody_registered_is_refused_as_forged(world: World) -> None:
    done = world.python(
        """
        import openai
        client = openai.OpenAI(max_retries=0)
        try:
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], stream=True
            )
        except openai.PermissionDeniedError as e:
            print("refused", e.status_code, e.response.text)
        """,
        {"OPENAI_API_KEY": NOBODYS_OPENAI},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("refused 403") and "forged_placeholder" in done.stdout, done.stdout
    assert NOBODYS_OPENAI not in done.stdout
    assert f"Bearer {NOBODYS_OPENAI}" not in _sent(world, "api.openai.com")
    assert any(e.get("reason") == "forged_placeholder" for e in world.events("api.openai.com"))


def test_a_real_looking_unregistered_ghp_token_passes_inert(world: World) -> None:
    token = real_looking_ghp()
    assert placeholders.is_placeholder(token) and not placeholders.has_valid_checksum(token)
    before = len(world.apis.requests("api.github.com"))
    done = _gh(world, token)
    assert done.returncode != 0  # the upstream answers 401: it is nobody's secret
    assert [c for _, _, c in world.apis.requests("api.github.com")[before:]] == [f"token {token}"]
    last = world.events("api.github.com")[-1]
    assert last["reason"] != "forged_placeholder" and last["forged"] == [] and last["status"] == 401


def test_an_upload_with_a_template_placeholder_across_reads_is_swapped(world: World) -> None:
    """The placeholder stands across the 64 KiB boundary where the reads mitmproxy hands the
    stream may cut it (the unit tests cut it at every byte): the body the upstream got is longer
    by exactly the secret's length minus the placeholder's."""
    body = b"a" * (65536 - len(UPLOAD) // 2) + UPLOAD.encode() + b"&z=" + b"b" * 70000
    path = world.tmp / "upload.bin"
    path.write_bytes(body)
    status, got = world.curl("--data-binary", f"@{path}", f"https://api.test:{world.upstream.port}/upload")
    assert status == 200, got
    (rec,) = [r for r in world.upstream.requests if r.path == "/upload"]
    assert rec.body_len == len(body) - len(UPLOAD) + len(world.secrets["upload"])


def test_a_response_reflecting_the_secret_split_in_two_reads_is_scrubbed_to_the_template_placeholder(
    world: World,
) -> None:
    status, got = world.curl(
        "-H", f"Authorization: Bearer {UPLOAD}", f"https://api.test:{world.upstream.port}/reflect-split"
    )
    assert status == 200
    assert got == f"you sent: Bearer {UPLOAD}\n".encode()
    (rec,) = [r for r in world.upstream.requests if r.path == "/reflect-split"]
    assert ("authorization", f"Bearer {world.secrets['upload']}") in [(n.lower(), v) for n, v in rec.headers]


def test_a_placeholder_the_control_api_mints_of_a_template_is_swapped(world: World) -> None:
    """PUT with ``placeholder_template`` and no placeholder: the API mints one of the template's
    shape and returns it; sent by the claim, the upstream gets the real secret."""
    with control(world.proxy, timeout=10) as api:
        made = api.post("/v1/claims", json={"id": "minted", "pool": "p"})
        assert made.status_code == 201, made.text
        token = made.json()["proxy_token"]
        put = api.put(
            "/v1/claims/minted/credentials/gh",
            json={
                "hosts": ["api.test"],
                "value": world.secrets["upload"],
                "placeholder_template": "github_oauth",
            },
        )
        assert put.status_code == 201, put.text
        ph = put.json()["placeholder"]
    assert placeholders.template_of(ph) is templates.SHIPPED["github_oauth"] and ph.startswith("gho_")
    assert placeholders.has_valid_checksum(ph)
    proxy = world.proxy.url("minted", token)
    url = f"https://api.test:{world.upstream.port}/api-minted"
    for _ in range(50):  # the registry picks the new claim up on its next refresh
        status, _ = world.curl("-H", f"Authorization: token {ph}", url, proxy=proxy)
        if status != 407:
            break
        time.sleep(0.1)
    assert status == 200
    (rec,) = [r for r in world.upstream.requests if r.path == "/api-minted"]
    assert ("authorization", f"token {world.secrets['upload']}") in [(n.lower(), v) for n, v in rec.headers]
