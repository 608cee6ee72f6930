"""`surrogate env`'s output for every runtime it serves, and the PKCS#12 trust store of
`surrogate ca bundle --format pkcs12` (loaded with `cryptography` and, where a JDK is installed,
with `keytool -list`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.utils import CryptographyDeprecationWarning

from certs import ca
from proxy.cli.main import main
from proxy.cli.provision import TRUST_VARS, java_options, render, sandbox_env, split_proxy, trust_store_beside
from proxy.rules.loader import load_rules
from unit.cli.world import P_GH, SECRETS

BUNDLE = "/etc/ssl/surrogate.pem"
STORE = "/etc/ssl/surrogate.p12"
NEW_RUNTIMES = {  # variable -> the runtime that reads it (issue 18)
    "NPM_CONFIG_CAFILE": "npm, pnpm, Yarn 1",
    "YARN_HTTPS_CA_FILE_PATH": "Yarn 2+",
    "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": "gRPC C core",
    "DENO_CERT": "Deno",
    "CARGO_HTTP_CAINFO": "Cargo",
}


def env_for(rules_file: Path, proxy: str = "10.0.0.1:8080") -> dict[str, str]:
    claim = load_rules(rules_file).claims["c1"]
    return sandbox_env(claim, SECRETS["token"], proxy, BUNDLE, STORE)


@pytest.mark.parametrize("var", sorted(NEW_RUNTIMES), ids=sorted(NEW_RUNTIMES))
def test_each_runtime_gets_the_pem_bundle(rules_file: Path, var: str) -> None:
    env = env_for(rules_file)
    assert var in TRUST_VARS
    assert env[var] == BUNDLE


def test_every_trust_variable_names_the_bundle_and_the_proxy_variables_the_claim(rules_file: Path) -> None:
    env = env_for(rules_file)
    assert {k: env[k] for k in TRUST_VARS} == dict.fromkeys(TRUST_VARS, BUNDLE)
    url = f"http://c1:{SECRETS['token']}@10.0.0.1:8080"
    for k in (
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "http_proxy",
        "https_proxy",
        "YARN_HTTP_PROXY",
        "YARN_HTTPS_PROXY",
    ):
        assert env[k] == url
    assert env["NODE_USE_ENV_PROXY"] == "1"
    assert env["SURROGATE_PLACEHOLDER_GH"] == P_GH
    secrets = [v for k, v in SECRETS.items() if k != "token"]
    assert not [s for s in secrets if any(s in v for v in env.values())]


def test_the_jvm_gets_the_pkcs12_store_and_the_proxy_but_never_the_token(rules_file: Path) -> None:
    opts = env_for(rules_file)["JAVA_TOOL_OPTIONS"].split(" ")
    assert opts == [
        f"-Djavax.net.ssl.trustStore={STORE}",
        "-Djavax.net.ssl.trustStoreType=PKCS12",
        "-Dhttps.proxyHost=10.0.0.1",
        "-Dhttps.proxyPort=8080",
        "-Dhttp.proxyHost=10.0.0.1",
        "-Dhttp.proxyPort=8080",
        "-Dhttp.nonProxyHosts=localhost|127.0.0.1|[::1]",
        "-Djdk.http.auth.tunneling.disabledSchemes=",
    ]
    assert SECRETS["token"] not in " ".join(opts)  # every JVM prints JAVA_TOOL_OPTIONS on start


@pytest.mark.parametrize(
    ("proxy", "host", "port"),
    [
        ("10.0.0.1:8080", "10.0.0.1", 8080),
        ("[fd00::1]:3128", "fd00::1", 3128),
        ("proxy.internal:1", "proxy.internal", 1),
    ],
)
def test_split_proxy(proxy: str, host: str, port: int) -> None:
    assert split_proxy(proxy) == (host, port)
    assert f"-Dhttps.proxyHost={host} " in java_options(proxy, STORE)


@pytest.mark.parametrize("proxy", ["10.0.0.1", "10.0.0.1:", ":8080", "h:0", "h:65536", "h:80a"])
def test_a_proxy_that_is_not_host_port_is_refused(proxy: str) -> None:
    with pytest.raises(ValueError, match="expected HOST:PORT"):
        split_proxy(proxy)


@pytest.mark.parametrize(
    ("bundle", "store"),
    [
        (None, None),
        ("/etc/ssl/surrogate.pem", "/etc/ssl/surrogate.p12"),
        ("/etc/ssl/bundle", "/etc/ssl/bundle.p12"),
        ("/etc/ssl.d/bundle", "/etc/ssl.d/bundle.p12"),
    ],
)
def test_the_trust_store_defaults_to_the_bundle_path_with_p12(bundle: str | None, store: str | None) -> None:
    assert trust_store_beside(bundle) == store


@pytest.mark.parametrize("fmt", ["shell", "dotenv"])
def test_both_formats_round_trip_through_a_shell_with_the_wget_note_as_comments(
    rules_file: Path, fmt: str
) -> None:
    env = env_for(rules_file)
    text = render(env, fmt, ["wget: ca_certificate = /x", "second note"])
    assert text.startswith("# wget: ca_certificate = /x\n# second note\n")
    script = ("" if fmt == "shell" else "set -a; ") + '. "$1"; env -0'
    path = rules_file.with_name(f"sandbox.{fmt}")
    path.write_text(text)
    done = subprocess.run(
        ["bash", "-c", script, "bash", str(path)],
        capture_output=True,
        check=True,
        env={"PATH": os.environ["PATH"]},
    )
    seen = dict(item.split("=", 1) for item in done.stdout.decode().split("\0") if "=" in item)
    assert {k: seen[k] for k in env} == env


def test_an_unknown_format_is_refused(rules_file: Path) -> None:
    with pytest.raises(ValueError, match="unknown format"):
        render(env_for(rules_file), "yaml")


def test_env_prints_the_new_runtimes_the_jvm_and_the_wget_note(
    rules_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    ca.ensure_ca(state)  # as `surrogate run` made it (env never creates a CA)
    argv = [
        "env",
        "--rules",
        str(rules_file),
        "--claim",
        "c1",
        "--state-dir",
        str(state),
        "--proxy",
        "10.0.0.1:8080",
    ]
    assert main([*argv, "--bundle", BUNDLE]) == 0
    out = capsys.readouterr().out
    assert f"# wget reads https_proxy but no CA variable: add 'ca_certificate = {BUNDLE}'" in out
    for var in NEW_RUNTIMES:
        assert f"export {var}={BUNDLE}\n" in out
    assert f"-Djavax.net.ssl.trustStore={STORE} " in out  # beside the bundle, with .p12
    assert main([*argv, "--bundle", BUNDLE, "--trust-store", "/opt/t.p12"]) == 0
    assert "-Djavax.net.ssl.trustStore=/opt/t.p12 " in capsys.readouterr().out
    assert main(argv) == 0  # no paths given: both written into the state dir, both named
    out = capsys.readouterr().out
    assert f"export NPM_CONFIG_CAFILE={(state / 'ca' / 'bundle.pem').resolve()}\n" in out
    assert f"-Djavax.net.ssl.trustStore={(state / 'ca' / 'bundle.p12').resolve()} " in out
    assert (state / "ca" / "bundle.p12").stat().st_mode & 0o777 == 0o644


def _pem_certs(path: Path) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(path.read_bytes())


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Debian's roots hold one certificate with a negative serial, which cryptography warns about."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CryptographyDeprecationWarning)
        yield


def test_ca_bundle_pkcs12_holds_the_pem_bundles_certificates_as_trusted_entries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    ca.ensure_ca(state)
    assert (
        main(
            [
                "ca",
                "bundle",
                "--state-dir",
                str(state),
                "--format",
                "pkcs12",
                "--out",
                str(tmp_path / "t.p12"),
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.strip() == str(tmp_path / "t.p12")
    assert main(["ca", "bundle", "--state-dir", str(state)]) == 0
    pem = Path(capsys.readouterr().out.strip())
    with _quiet():
        loaded = pkcs12.load_pkcs12((tmp_path / "t.p12").read_bytes(), b"")
    assert loaded.key is None and loaded.cert is None  # certificates only, no key
    got = [c.certificate for c in loaded.additional_certs]
    with _quiet():
        want = _pem_certs(pem)
    assert got == want
    ours = x509.load_pem_x509_certificate(ca.ca_cert_path(state).read_bytes())
    assert [c.friendly_name for c in loaded.additional_certs if c.certificate == ours] == [b"surrogate-ca"]


def test_a_bundle_format_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown bundle format 'jks'"):
        ca.write_sandbox_bundle(tmp_path, None, "jks")


@pytest.mark.skipif(
    shutil.which("keytool") is None, reason="no keytool (apt default-jdk-headless; .ci/run installs it)"
)
def test_keytool_lists_the_trust_store(tmp_path: Path) -> None:
    ca.ensure_ca(tmp_path / "state")
    store = ca.write_sandbox_bundle(tmp_path / "state", None, "pkcs12")
    with _quiet():
        count = len(pkcs12.load_pkcs12(store.read_bytes(), b"").additional_certs)
    for password in ([], ["-storepass", ""]):  # the JVM reads it with no password, keytool with either
        done = subprocess.run(
            ["keytool", "-list", "-keystore", str(store), "-storetype", "PKCS12", *password],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"Your keystore contains {count} entries" in done.stdout
        assert "surrogate-ca, " in done.stdout and ", trustedCertEntry," in done.stdout
