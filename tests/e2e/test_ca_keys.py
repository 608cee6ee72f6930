"""Issue 19: real clients verify the proxy's leaf certificates whichever key its CA has.

A new state dir gets an EC P-256 CA (certs/ca.py), so the leaf the sandbox sees carries an EC
key and an ECDSA signature; a state dir holding an RSA CA (what surrogate made before, through
mitmproxy's CertStore) keeps it, and its leaves stay RSA. curl, Python's ssl and git verify
through both, and the placeholder is swapped as usual.
"""

from __future__ import annotations

import base64
import os
import secrets
import socket
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import canary
import pytest
from _env import env_rules
from conftest import NAMES
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from harness import Env
from mitmproxy import certs
from servers import README_TEXT
from world import Stage

pytestmark = pytest.mark.e2e

KINDS = ("ec", "rsa")


@pytest.fixture(scope="module")
def envs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Env]]:
    with Stage(tmp_path_factory.mktemp("cakeys")) as st:
        secret, secret2 = st.secret("gh"), st.secret("gh2", tag="ghtwo")
        injected = canary.make("inj")
        st.watch(injected)
        token = st.token(secrets.token_urlsafe(16), "token1")
        st.token(secrets.token_urlsafe(16), "token2")
        upstream = st.upstream(NAMES, git_password=secret)
        rules = st.write(env_rules(upstream.port))
        made: dict[str, Env] = {}
        for kind in KINDS:
            work = st.tmp / kind
            work.mkdir()
            if kind == "rsa":  # the state dir an older surrogate left behind
                certs.CertStore.create_store(work / "state" / "ca", "mitmproxy", 2048)
            proxy = st.proxy(rules, NAMES, workdir=work, env={"E2E_INJECTED_SECRET": injected})
            e = Env(upstream, st.ca.ca_pem, proxy, token, "", secret, injected, secret2, st.tmp / "secret-gh")
            e.received = st.received  # Invariant 1, checked when the stage closes
            made[kind] = e
        yield made


def _leaf(env: Env) -> x509.Certificate:
    """The leaf certificate the proxy shows a client in a CONNECT tunnel to api.test (verified)."""
    with socket.create_connection(("127.0.0.1", env.proxy.port), timeout=10) as raw:
        raw.sendall(
            f"CONNECT api.test:{env.upstream.port} HTTP/1.1\r\nHost: api.test:{env.upstream.port}\r\n"
            f"Proxy-Authorization: {_basic(env)}\r\n\r\n".encode()
        )
        assert raw.recv(4096).startswith(b"HTTP/1.1 200")
        ctx = ssl.create_default_context(cafile=str(env.proxy.ca_pem))
        with ctx.wrap_socket(raw, server_hostname="api.test") as tls:
            der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def _basic(env: Env) -> str:
    return "Basic " + base64.b64encode(f"c1:{env.token}".encode()).decode()


@pytest.mark.parametrize(
    ("kind", "key_type", "algorithm"),
    [
        ("ec", ec.EllipticCurvePublicKey, x509.SignatureAlgorithmOID.ECDSA_WITH_SHA256),
        ("rsa", rsa.RSAPublicKey, x509.SignatureAlgorithmOID.RSA_WITH_SHA256),
    ],
)
def test_the_leaf_key_follows_the_ca_key(
    envs: dict[str, Env], kind: str, key_type: type, algorithm: x509.ObjectIdentifier
) -> None:
    leaf = _leaf(envs[kind])
    assert isinstance(leaf.public_key(), key_type)
    assert leaf.signature_algorithm_oid == algorithm
    root = x509.load_pem_x509_certificate(envs[kind].proxy.ca_pem.read_bytes())
    assert isinstance(root.public_key(), key_type)
    leaf.verify_directly_issued_by(root)


@pytest.mark.parametrize("kind", KINDS)
def test_curl_verifies_and_the_placeholder_is_swapped(envs: dict[str, Env], kind: str) -> None:
    env = envs[kind]
    path = f"/t/cakeys-curl-{kind}"
    done = subprocess.run(
        ["curl", "-sS", "--max-time", "20", "-x", env.proxy_url, "--cacert", str(env.proxy.ca_pem),
         "-H", f"Authorization: Bearer {env.placeholder}", env.url("api.test", path)],
        capture_output=True, timeout=30, check=False,
    )  # fmt: skip
    env.received.append(done.stdout + done.stderr)
    assert done.returncode == 0, done.stderr
    [rec] = [r for r in env.upstream.requests if r.path == path]
    assert [v for k, v in rec.headers if k.lower() == "authorization"] == [f"Bearer {env.secret}"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tls_max", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_python_ssl_verifies_over_tls_1_2_and_1_3(
    envs: dict[str, Env], kind: str, tls_max: ssl.TLSVersion
) -> None:
    env = envs[kind]
    with socket.create_connection(("127.0.0.1", env.proxy.port), timeout=10) as raw:
        raw.sendall(
            f"CONNECT api.test:{env.upstream.port} HTTP/1.1\r\nHost: api.test:{env.upstream.port}\r\n"
            f"Proxy-Authorization: {_basic(env)}\r\n\r\n".encode()
        )
        assert raw.recv(4096).startswith(b"HTTP/1.1 200")
        ctx = ssl.create_default_context(cafile=str(env.proxy.ca_pem))
        ctx.maximum_version = tls_max
        with ctx.wrap_socket(raw, server_hostname="api.test") as tls:
            assert tls.version() == ("TLSv1.3" if tls_max == ssl.TLSVersion.TLSv1_3 else "TLSv1.2")
            tls.sendall(b"GET /t/cakeys-py HTTP/1.1\r\nHost: api.test\r\nConnection: close\r\n\r\n")
            got = b""
            while chunk := tls.recv(65536):
                got += chunk
    env.received.append(got)
    assert got.startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("kind", KINDS)
def test_git_clone_verifies(envs: dict[str, Env], kind: str, tmp_path: Path) -> None:
    env = envs[kind]
    repo_url = f"https://git:{env.placeholder}@api.test:{env.upstream.port}/git/repo.git"
    git_env = {
        **os.environ,
        "GIT_SSL_CAINFO": str(env.proxy.ca_pem),
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_CONFIG_NOSYSTEM": "1",
        "HOME": str(tmp_path),
    }
    done = subprocess.run(
        ["git", "-c", f"http.proxy={env.proxy_url}", "clone", repo_url, str(tmp_path / "clone")],
        capture_output=True, env=git_env, timeout=60, check=False,
    )  # fmt: skip
    env.received.append(done.stdout + done.stderr)
    assert done.returncode == 0, done.stderr.decode()
    assert (tmp_path / "clone" / "README").read_text() == README_TEXT
