"""``surrogate env``: what a sandbox needs to use the proxy, for the common runtimes.

The variables: ``HTTP_PROXY``/``HTTPS_PROXY`` (and lower-case forms, which curl, Go, gRPC and
Python read) with the claim's proxy credential; ``NO_PROXY`` for loopback; the PEM trust bundle
for each runtime that carries its own (:data:`TRUST_VARS`: OpenSSL and Python, requests, curl,
Node, git, pip, the AWS SDKs, npm and pnpm, Yarn 2+, gRPC's C core, Deno, Cargo);
``NODE_USE_ENV_PROXY=1`` (Node 22.21+ and 24+ honour the proxy variables in fetch and
``https`` with it; Node 20 does not); ``JAVA_TOOL_OPTIONS`` for the JVM (:func:`java_options`); and one
``SURROGATE_PLACEHOLDER_<NAME>`` per credential. Printed as shell ``export`` lines or as a
``.env`` file, after ``#`` comment lines for what no variable can say (:func:`notes`: wget).
The proxy credential is the sandbox's own (it is useless outside the proxy); no real secret is
ever printed.

Sources: npm ``cafile`` (``npm_config_*`` variables, docs.npmjs.com *config*), Yarn
``httpsCaFilePath``/``httpsProxy`` (``YARN_*``, yarnpkg.com *configuration/yarnrc*), gRPC
``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH`` (grpc/doc/environment_variables.md), Deno ``DENO_CERT``,
Cargo ``CARGO_HTTP_CAINFO`` (``http.cainfo``), the JDK's networking properties
(``https.proxyHost``…, ``jdk.http.auth.tunneling.disabledSchemes``) and JSSE's
``javax.net.ssl.trustStore``.
"""

from __future__ import annotations

import re
import shlex
from urllib.parse import quote

from proxy.core.policy import Claim

_NAME = re.compile(r"[^A-Z0-9]+")
TRUST_VARS = (
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
    "PIP_CERT",
    "AWS_CA_BUNDLE",
    "NPM_CONFIG_CAFILE",  # npm, pnpm (and Yarn 1, which reads npm's configuration)
    "YARN_HTTPS_CA_FILE_PATH",  # Yarn 2+
    "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH",  # gRPC's C core: grpcio, grpc-node's native, C++, Ruby
    "DENO_CERT",
    "CARGO_HTTP_CAINFO",
)
LOOPBACK = ("localhost", "127.0.0.1", "::1")


def split_proxy(proxy: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` as (host without brackets, port); ValueError otherwise."""
    host, sep, port = proxy.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--proxy {proxy!r}: expected HOST:PORT")
    return host.removeprefix("[").removesuffix("]"), int(port)


def java_options(proxy: str, trust_store: str) -> str:
    """``JAVA_TOOL_OPTIONS`` for a JVM: the PKCS#12 trust store (``surrogate ca bundle --format
    pkcs12``; no password), the proxy for ``http`` and ``https`` (JDK networking properties),
    loopback direct, and Basic allowed again for CONNECT (the JDK disables it there by default).
    The JDK takes no proxy credential from properties: a JVM program gives the claim's token
    with a ``java.net.Authenticator`` (HttpURLConnection, java.net.http), as it would for any
    authenticating proxy; the token is never put into this variable, which every JVM prints
    on start-up ("Picked up JAVA_TOOL_OPTIONS")."""
    host, port = split_proxy(proxy)
    direct = "|".join(f"[{h}]" if ":" in h else h for h in LOOPBACK)
    return " ".join(
        [
            f"-Djavax.net.ssl.trustStore={trust_store}",
            "-Djavax.net.ssl.trustStoreType=PKCS12",
            f"-Dhttps.proxyHost={host}",
            f"-Dhttps.proxyPort={port}",
            f"-Dhttp.proxyHost={host}",
            f"-Dhttp.proxyPort={port}",
            f"-Dhttp.nonProxyHosts={direct}",
            "-Djdk.http.auth.tunneling.disabledSchemes=",
        ]
    )


def sandbox_env(claim: Claim, token: str, proxy: str, bundle: str, trust_store: str) -> dict[str, str]:
    """The variables for ``claim``. ``proxy`` is HOST:PORT as the sandbox reaches the proxy;
    ``bundle`` the path of the PEM trust bundle inside the sandbox, ``trust_store`` that of the
    PKCS#12 one. Raises ValueError for a ``proxy`` that is not HOST:PORT."""
    url = f"http://{quote(claim.id, safe='')}:{quote(token, safe='')}@{proxy}"
    no_proxy = ",".join(LOOPBACK)
    env = {
        "HTTP_PROXY": url,
        "HTTPS_PROXY": url,
        "http_proxy": url,
        "https_proxy": url,
        "NO_PROXY": no_proxy,
        "no_proxy": no_proxy,
        "NODE_USE_ENV_PROXY": "1",
        "YARN_HTTP_PROXY": url,  # Yarn 2+ reads no proxy variable of its own accord
        "YARN_HTTPS_PROXY": url,
    }
    env.update({name: bundle for name in TRUST_VARS})
    env["JAVA_TOOL_OPTIONS"] = java_options(proxy, trust_store)
    for c in claim.credentials:
        env[f"SURROGATE_PLACEHOLDER_{_NAME.sub('_', c.name.upper()).strip('_')}"] = c.placeholder
    return env


def trust_store_beside(bundle: str | None) -> str | None:
    """The PKCS#12 trust store's path in the sandbox when only the PEM bundle's was given: the
    same path with ``.p12`` for its suffix (``/etc/ssl/surrogate.pem`` → ``/etc/ssl/surrogate.p12``;
    copy ``surrogate ca bundle --format pkcs12`` there); None without a bundle path."""
    if bundle is None:
        return None
    head, dot, suffix = bundle.rpartition(".")
    return f"{head}.p12" if dot and "/" not in suffix else f"{bundle}.p12"


def notes(bundle: str) -> list[str]:
    """What a runtime needs that no variable gives it, one line each (printed as comments)."""
    return [
        f"wget reads https_proxy but no CA variable: add 'ca_certificate = {bundle}' to a wgetrc "
        f"(~/.wgetrc, or the file WGETRC names), or run wget --ca-certificate={bundle}",
        "JVM: JAVA_TOOL_OPTIONS sets the trust store and the proxy; the proxy token is given by "
        "the program (java.net.Authenticator), the JDK reads none from properties",
    ]


def render(env: dict[str, str], fmt: str, comments: list[str] | None = None) -> str:
    """``shell``: ``export K='v'`` lines; ``dotenv``: ``K="v"`` lines; each preceded by the
    ``comments`` as ``# `` lines (both formats, and docker's and systemd's env files, skip them).
    Raises ValueError for another format."""
    if fmt not in ("shell", "dotenv"):
        raise ValueError(f"unknown format {fmt!r}; use shell or dotenv")
    head = "".join(f"# {line}\n" for line in comments or [])
    if fmt == "shell":
        return head + "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
    return head + "".join(f'{k}="{v}"\n' for k, v in env.items())
