"""Checks of a control-plane write against the rules in force, before the store sees it: the
hosts a credential may go to (covered by an intercepting egress rule of the claim's pool, not a
risky wildcard, not shadowed by an opaque rule), its value, injection, placeholder, name and
OAuth token endpoint. Pure over the policy: no store, no HTTP.

Every refusal is a :class:`ControlError` with an HTTP status, a reason code and a sentence naming
the field and what would be right; never a value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from proxy.core import placeholders, slots, templates
from proxy.core.errors import HostError, SecretUnavailable, SurrogateError
from proxy.core.hosts import HostPattern
from proxy.core.oauth import OAuthSpec, endpoint_bound
from proxy.core.policy import Pool
from proxy.core.secrets import checked_value
from proxy.rules.loader import credential_host_risk, opaque_shadow
from proxy.store.base import CredentialRecord

MAX_VALUE_BYTES = 16 * 1024
ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # RFC 9110 §5.6.2


class ControlError(SurrogateError):
    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field


@dataclass(frozen=True, slots=True)
class Coverage:
    host: str
    rule: str
    header: str


def coverage(
    pool: Pool,
    hosts: list[str],
    inject_header: str | None,
    headers: list[str] | tuple[str, ...] | None = None,
) -> list[Coverage]:
    """For each host pattern, the intercepting rule of ``pool`` that covers it, and the headers
    the secret travels in (the injection's, else the header slots ``headers``; None: the default).

    Raises ControlError(422) naming the first host that does not parse or is not covered.
    """
    wide = pool.any_host_rule()
    if wide is not None:
        raise ControlError(
            422,
            "any_host_pool",
            f"pool {pool.name!r} allows any host ({wide.label()}); credentials are refused there unless "
            "the rules file sets 'unsafe_any_host: true' on the pool",
            "hosts",
        )
    out = []
    for i, raw in enumerate(hosts):
        try:
            pattern = HostPattern.parse(raw)
        except HostError as e:
            raise ControlError(422, "invalid_host", str(e), f"hosts[{i}]") from None
        if (why := credential_host_risk(pattern)) is not None:
            raise ControlError(
                422, "risky_host", f"host {pattern}: {why}; list the exact hosts", f"hosts[{i}]"
            )
        rule = next(
            (r for r in pool.egress if r.intercept and r.scheme == "https" and r.host.covers(pattern)), None
        )
        if rule is None:
            raise ControlError(
                422,
                "host_not_covered",
                f"host {pattern} is not covered by an intercepting egress rule of pool "
                f"{pool.name!r}; add one to the rules file or remove the host",
                f"hosts[{i}]",
            )
        shadow = opaque_shadow(pool, pattern)
        if shadow is not None:
            raise ControlError(
                422,
                "host_not_covered",
                f"host {pattern} would be tunnelled opaque by the earlier rule {shadow.label()} "
                "(intercept: false), so the credential could never apply",
                f"hosts[{i}]",
            )
        slot = slots.display(
            slots.DEFAULT_HEADERS if headers is None else frozenset(h.lower() for h in headers)
        )
        header = inject_header or f"the placeholder's header, one of: {slot}"
        out.append(Coverage(str(pattern), rule.label(), header))
    return out


def check_value(value: str) -> bytes:
    raw = value.encode("utf-8")
    if len(raw) > MAX_VALUE_BYTES:
        raise ControlError(422, "invalid_value", f"value is longer than {MAX_VALUE_BYTES} bytes", "value")
    try:
        checked_value(value + "\n", "the request")  # +"\n": keep a value's own trailing newline
    except SecretUnavailable as e:
        raise ControlError(
            422, "invalid_value", str(e).replace("credential value", "value"), "value"
        ) from None
    return raw


def check_inject(header: str | None, fmt: str | None) -> None:
    if header is None:
        if fmt is not None:
            raise ControlError(422, "invalid_inject", "inject.format needs inject.set_header", "inject")
        return
    low = header.lower()
    if not _TOKEN.match(header) or low == "host" or low.startswith("proxy-"):
        raise ControlError(
            422, "invalid_inject", f"{header!r} is not a header surrogate may set", "inject.set_header"
        )
    if fmt is not None and ("{value}" not in fmt or any(ord(c) < 32 or ord(c) == 127 for c in fmt)):
        raise ControlError(
            422, "invalid_inject", "format must contain '{value}' and no control characters", "inject.format"
        )


def check_endpoint(pool: Pool, spec: OAuthSpec, hosts: list[str]) -> None:
    """The token endpoint's host must be one of the credential's hosts (issue 13: else a host the
    pool merely allows could hand out tokens the store would then send to the credential's real
    hosts) and covered by an intercepting rule. Raises ControlError(422)."""
    if not endpoint_bound(spec, [HostPattern.parse(h) for h in hosts]):
        raise ControlError(
            422,
            "oauth_host_not_bound",
            f"oauth.token_endpoint.host {spec.host} is not one of the credential's hosts; add it to "
            "hosts or name the endpoint of one of them",
            "oauth.token_endpoint.host",
        )
    try:
        coverage(pool, [spec.host], None)
    except ControlError as e:
        raise ControlError(e.status, e.code, e.message, "oauth.token_endpoint.host") from None


def check_name(name: str) -> None:
    if not ID.match(name):
        raise ControlError(
            422, "invalid_name", "credential name must be 1-63 letters, digits, '.', '_' or '-'", "name"
        )


def templated(name: str | None, placeholder: str | None, old: CredentialRecord | None) -> str | None:
    """The placeholder a PUT stores given its ``placeholder_template`` ``name``: ``placeholder``
    when given (it must fit the template), the old one when it already has the template's shape,
    else a fresh one minted of it (None: the store's default). Raises ControlError 422
    ``invalid_placeholder_template`` / ``invalid_placeholder``."""
    if name is None:
        return placeholder
    try:
        template = templates.get(name)
    except KeyError as e:
        raise ControlError(422, "invalid_placeholder_template", e.args[0], "placeholder_template") from None
    if placeholder is not None:
        if placeholders.template_of(placeholder) is not template:
            raise ControlError(
                422, "invalid_placeholder",
                f"placeholder is not of template {name!r} ({template.describe()})", "placeholder",
            )
        return placeholder
    if old is not None and placeholders.template_of(old.placeholder) is template:
        return None  # kept: a PUT that repeats itself does not change the sandbox's placeholder
    return templates.mint(template)


def check_placeholder(placeholder: str | None) -> None:
    if placeholder is not None and not placeholders.is_placeholder(placeholder):
        raise ControlError(
            422,
            "invalid_placeholder",
            f"placeholder must be {placeholders.FORMATS}, e.g. {placeholders.generate()}",
            "placeholder",
        )
