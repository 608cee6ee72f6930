"""The rules file of the e2e ``env`` fixture (conftest.py), for tests that reload it changed.

Pool ``p``: api.test, other.test and opaque.test (pass-through) on the upstream's port, plain
http:// to api.test:80. Claim ``c1`` (token file ``token1``): credential ``gh`` (file
``secret-gh``) and ``inj`` (env ``E2E_INJECTED_SECRET``, injected as ``X-Injected``), both bound
to api.test. Claim ``c2`` (``token2``): ``gh2`` (file ``secret-gh2``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from world import claim, credential, egress, rules


def env_rules(port: int, more_ports: Sequence[int] = (), hooks: Sequence[dict[str, Any]] = ()) -> str:
    """The rules text; ``more_ports``: allowed beside ``port`` on each of its rules; ``hooks``:
    pool ``p``'s hook routes."""
    ports = [port, *more_ports]
    return rules(
        [
            egress("api.test", ports=ports),
            egress("other.test", ports=ports),
            egress("opaque.test", ports=ports, intercept=False),
            egress("api.test", 80, scheme="http"),
        ],
        pool_extra={"hooks": list(hooks)} if hooks else None,
        claims=[
            claim(
                "c1",
                [
                    credential("gh", "surr_E2eGithubPlaceholder0001", ["api.test"]),
                    credential(
                        "inj",
                        "surr_E2eInjectedPlaceholder03",
                        ["api.test"],
                        value="env:E2E_INJECTED_SECRET",
                        inject={"set_header": "X-Injected", "format": "Token {value}"},
                    ),
                ],
                token="file:token1",
            ),
            claim(
                "c2", [credential("gh2", "surr_E2eOtherClaimPlaceholder2", ["api.test"])], token="file:token2"
            ),
        ],
    )
