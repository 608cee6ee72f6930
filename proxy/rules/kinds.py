"""Credential kinds beyond a static value (issue 15): ``oauth_client`` (proxy.core.mint) and
``hmac`` (proxy.core.hmacsign).

:func:`minting` checks a credential's ``kind`` and ``mint`` fields and builds its
:class:`proxy.core.mint.Minting`; problems are recorded at their field. The token endpoint's host
must be one of the credential's hosts (so covered by an intercepting egress rule of its pool):
the token request is a request that carries the credential's secret, and it goes only where the
secret is bound.
"""

from __future__ import annotations

from collections.abc import Callable

from proxy.core import hmacsign, mint
from proxy.core.hosts import HostPattern
from proxy.core.policy import Injection
from proxy.core.secrets import Secret
from proxy.rules.marks import Loc, Marks
from proxy.rules.models import TOKEN, CredentialModel, SignModel
from proxy.rules.sources import ValueSource

KINDS = ("static", "oauth_client", "hmac", "aws_sigv4")
DEFAULT_INJECT = Injection("Authorization", "Bearer {value}")


def minting(
    km: CredentialModel,
    hosts: list[HostPattern],
    source: ValueSource | None,
    read_source: Callable[[str, Loc], ValueSource | None],
    loc: Loc,
    marks: Marks,
    read: bool,
) -> mint.Minting | None:
    """The credential's minting (kind ``oauth_client``), or None (kind ``static``, or a problem)."""
    if km.kind not in KINDS:
        marks.add(loc + ("kind",), f"unknown kind {km.kind!r}; expected one of: {', '.join(KINDS)}")
        return None
    if km.kind != "oauth_client":
        if km.mint is not None:
            marks.add(loc + ("mint",), "mint is for kind oauth_client; add kind: oauth_client")
        return None
    m = km.mint
    if m is None:
        marks.add(loc + ("mint",), "kind oauth_client needs mint (token_url, client_id, grant)")
        return None
    before = len(marks.problems)
    try:
        url = mint.TokenURL.parse(m.token_url)
    except ValueError as e:
        marks.add(loc + ("mint", "token_url"), str(e))
        return None
    if not any(p.matches(url.host) for p in hosts):
        marks.add(
            loc + ("mint", "token_url"),
            f"token endpoint host {url.host} is not one of the credential's hosts; add it to hosts "
            "(the client secret goes only to hosts the credential is bound to)",
        )
    signs = m.grant == "jwt_bearer" or m.client_auth == "private_key_jwt"
    spec = mint.MintSpec(
        url,
        m.client_id,
        m.grant,
        m.client_auth or ("private_key_jwt" if signs else "secret_basic"),
        tuple(m.scopes),
        m.audience,
        m.subject,
        m.algorithm,
        m.margin,
    )
    for name, why in mint.problems(spec):
        marks.add(loc + ("mint", name), why)
    refresh = None
    if spec.grant == "refresh_token":
        if m.refresh_token is None:
            marks.add(
                loc + ("mint", "refresh_token"), "grant refresh_token needs refresh_token (env: or file:)"
            )
        else:
            refresh = read_source(m.refresh_token, loc + ("mint", "refresh_token"))
    elif m.refresh_token is not None:
        marks.add(loc + ("mint", "refresh_token"), "refresh_token is only for grant refresh_token")
    problem = (
        _key_problem(source.current()[0], spec.algorithm) if spec.signs_jwt and source and read else None
    )
    if problem is not None:
        marks.add(loc + ("value",), problem)
    if source is None or len(marks.problems) != before:
        return None
    return mint.Minting(spec, source, refresh)


def _key_problem(value: Secret, algorithm: str) -> str | None:
    """None when ``value`` is a PEM private key usable with ``algorithm``; else why (never the value)."""
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        load_pem_private_key(value.reveal().replace("\\n", "\n").encode(), password=None)
    except (ValueError, TypeError):
        return f"value must be a PEM private key (unencrypted) for {algorithm} JWT assertions"
    return None


def signing(km: CredentialModel, loc: Loc, marks: Marks) -> hmacsign.SignSpec | None:
    """The credential's HMAC signing (kind ``hmac``), or None (another kind, or a problem)."""
    if km.kind != "hmac":
        if km.sign is not None:
            marks.add(loc + ("sign",), "sign is for kind hmac; add kind: hmac")
        return None
    if km.inject is not None:
        marks.add(loc + ("inject",), "kind hmac sets its own headers (sign.header); remove inject")
    s = km.sign
    if s is None:
        s = SignModel()
    spec = hmacsign.SignSpec(
        s.algorithm,
        tuple(s.parts),
        s.separator,
        s.encoding,
        s.header,
        s.format,
        s.timestamp_header,
        s.max_body,
    )
    for name, why in hmacsign.problems(spec):
        marks.add(loc + ("sign", name), why)
    for name in ("header", "timestamp_header"):
        value = getattr(spec, name)
        if (
            not TOKEN.match(value)
            or value.lower() in ("host", "content-length")
            or value.lower().startswith("proxy-")
        ):
            marks.add(loc + ("sign", name), f"{value!r} is not a header surrogate may set")
    return spec
