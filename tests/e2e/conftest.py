"""End-to-end fixtures: one real upstream (HTTPS, test CA) and one real proxy process per module.

The credential values are canaries (tests/canary.py): distinctive random strings that must reach
the upstream and appear nowhere else. When the module's proxy stops, every artifact it wrote
(audit file, stderr) and every byte the tests' clients received (``received``) is checked for
them; at the end of the session every file the suite wrote is (tests/conftest.py).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import canary
import pytest
from _env import env_rules
from harness import Env
from world import Stage

NAMES = ["api.test", "other.test", "denied.test", "opaque.test"]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with Stage(tmp_path_factory.mktemp("e2e")) as st:
        secret, secret2 = st.secret("gh"), st.secret("gh2", tag="ghtwo")
        injected = canary.make("inj")
        st.watch(injected)
        token, token2 = (
            st.token(secrets.token_urlsafe(16), "token1"),
            st.token(secrets.token_urlsafe(16), "token2"),
        )
        upstream = st.upstream(NAMES, git_password=secret)
        proxy = st.proxy(env_rules(upstream.port), NAMES, env={"E2E_INJECTED_SECRET": injected})
        e = Env(
            upstream,
            st.ca.ca_pem,
            proxy,
            token,
            token2,
            secret,
            injected,
            secret2,
            st.tmp / "secret-gh",
            ca=st.ca,
        )
        e.received = st.received  # Invariant 1: no canary in what the sandbox read or the proxy wrote
        yield e
        st.watch(*e.more_canaries)  # values a test rotated in are checked too
