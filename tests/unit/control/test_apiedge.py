"""The TCP listener's Host check with the names of ``surrogate control --control-name``
(proxy.control.apiedge): a name given is answered with the listener's port only, any other name
still gets 403 (DNS rebinding), one row per case."""

from __future__ import annotations

import pytest

from proxy.control.apiedge import allowed_authorities, foreign_authority

NAMES = ("surrogate-control.surrogate.svc", "surrogate-control.surrogate.svc.cluster.local")
LISTEN = ("0.0.0.0", 9090)


@pytest.mark.parametrize(
    ("host", "origin", "ok"),
    [
        ("surrogate-control.surrogate.svc:9090", None, True),
        ("surrogate-control.surrogate.svc.cluster.local:9090", None, True),
        ("Surrogate-Control.Surrogate.SVC:9090", None, True),
        ("surrogate-control.surrogate.svc:9091", None, False),
        ("surrogate-control.surrogate.svc", None, False),
        ("evil.example:9090", None, False),
        ("surrogate-control.surrogate.svc.evil.example:9090", None, False),
        ("surrogate-control.surrogate:9090", None, False),
        (None, None, False),
        ("surrogate-control.surrogate.svc:9090", "http://evil.example:9090", False),
        ("localhost:9090", None, True),
    ],
    ids=[
        "the-service-name",
        "its-cluster-local-name",
        "any-case",
        "another-port",
        "no-port",
        "another-name",
        "a-suffix-of-the-name",
        "a-prefix-of-the-name",
        "no-host",
        "a-foreign-origin",
        "localhost-as-before",
    ],
)
def test_the_named_listener_answers_only_its_names(host: str | None, origin: str | None, ok: bool) -> None:
    allowed = allowed_authorities(*LISTEN, NAMES)
    assert (foreign_authority(host, origin, allowed) is None) is ok


def test_without_names_a_listener_answers_only_its_own_address() -> None:
    assert allowed_authorities("127.0.0.1", 9090) == {"127.0.0.1:9090", "localhost:9090"}
    assert allowed_authorities("127.0.0.1", 9090, ("a.test",)) == {
        "127.0.0.1:9090",
        "localhost:9090",
        "a.test:9090",
    }
