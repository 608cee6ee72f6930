"""proxy.control.apiedge: the authorities (Host) a TCP control listener answers, with and without
the names of ``surrogate control --control-name``: a name given is answered with the listener's
port only, any other name still gets 403 (DNS rebinding), one row per case."""

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


@pytest.mark.parametrize(
    ("listen", "host", "ok"),
    [
        (("::1", 9), "[::1]:9", True),
        (("::1", 9), "localhost:9", True),
        (("::1", 9), "127.0.0.1:9", False),
        (("localhost", 9), "127.0.0.1:9", True),
        (("localhost", 9), "[::1]:9", True),
        (("localhost", 9), "evil.test:9", False),
    ],
)
def test_the_authorities_a_listener_answers(listen: tuple[str, int], host: str, ok: bool) -> None:
    assert (foreign_authority(host, None, allowed_authorities(*listen)) is None) is ok


def test_a_name_that_is_an_ipv6_address_is_answered_in_its_host_header_spelling() -> None:
    """Review r-audit: ``--control-name ::1`` (canonical, unbracketed) gave the authority
    ``::1:9090``, which no Host header spells (RFC 3986 §3.2.2: ``[::1]:9090``)."""
    allowed = allowed_authorities("0.0.0.0", 9090, ("fd00::5", "svc.test"))
    assert foreign_authority("[fd00::5]:9090", None, allowed) is None
    assert foreign_authority("fd00::5:9090", None, allowed) == "Host"
