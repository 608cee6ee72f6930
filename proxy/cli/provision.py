"""``surrogate env``: what a sandbox needs to use the proxy, for the common runtimes.

The variables: ``HTTP_PROXY``/``HTTPS_PROXY`` (and lower-case forms, which curl, Go and Python
read) with the claim's proxy credential; ``NO_PROXY`` for loopback; the trust bundle for each
runtime that carries its own (``SSL_CERT_FILE`` for OpenSSL and Python, ``REQUESTS_CA_BUNDLE``,
``CURL_CA_BUNDLE``, ``NODE_EXTRA_CA_CERTS``, ``GIT_SSL_CAINFO``, ``PIP_CERT``, ``AWS_CA_BUNDLE``);
``NODE_USE_ENV_PROXY=1`` (Node 22.21+ and 24+ honour the proxy variables in fetch and https
with it; Node 20 does not); and one ``SURROGATE_PLACEHOLDER_<NAME>`` per credential. Printed as
shell ``export`` lines or as a ``.env`` file. The proxy credential is the sandbox's own (it is
useless outside the proxy); no real secret is ever printed.
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
)


def sandbox_env(claim: Claim, token: str, proxy: str, bundle: str) -> dict[str, str]:
    """The variables for ``claim``. ``proxy`` is HOST:PORT as the sandbox reaches the proxy;
    ``bundle`` the path of the trust bundle inside the sandbox."""
    url = f"http://{quote(claim.id, safe='')}:{quote(token, safe='')}@{proxy}"
    env = {
        "HTTP_PROXY": url,
        "HTTPS_PROXY": url,
        "http_proxy": url,
        "https_proxy": url,
        "NO_PROXY": "localhost,127.0.0.1,::1",
        "no_proxy": "localhost,127.0.0.1,::1",
        "NODE_USE_ENV_PROXY": "1",
    }
    env.update({name: bundle for name in TRUST_VARS})
    for c in claim.credentials:
        env[f"SURROGATE_PLACEHOLDER_{_NAME.sub('_', c.name.upper()).strip('_')}"] = c.placeholder
    return env


def render(env: dict[str, str], fmt: str) -> str:
    """``shell``: ``export K='v'`` lines; ``dotenv``: ``K="v"`` lines."""
    if fmt == "shell":
        return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
    if fmt == "dotenv":
        return "".join(f'{k}="{v}"\n' for k, v in env.items())
    raise ValueError(f"unknown format {fmt!r}; use shell or dotenv")
