"""The shape of a rules file (``version: 1``): pydantic models at the edge, strict and closed
(an unknown key is an error, never ignored). The fields are documented in ``rules/README.md``;
:mod:`proxy.rules.loader` turns a validated model into a :class:`proxy.core.policy.Policy`.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from proxy.core import approvals, hooks
from proxy.core.limits import (
    DEFAULT_APPROVALS,
    DEFAULT_BURST,
    DEFAULT_CONNECTIONS,
    DEFAULT_HOOK_PROCESSES,
    DEFAULT_RATE,
)
from proxy.core.limits import DEFAULT_WEBSOCKET_MESSAGE as DEFAULT_WS_MESSAGE
from proxy.core.policy import DEFAULT_SURFACES, Misplaced

TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # RFC 9110 §5.6.2 token
# value sources: a wrong type is said without the value
SECRET_FIELDS = ("value", "proxy_token", "refresh_token")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ApproveModel(_Model):
    """``approve`` of an egress rule (proxy.core.approvals.Ask)."""

    methods: list[str] = Field(default_factory=list)
    paths: list[str] = Field(default_factory=lambda: ["/"])
    timeout: float = approvals.DEFAULT_TIMEOUT
    scopes: list[str] = Field(default_factory=lambda: list(approvals.SCOPES))


class RuleModel(_Model):
    host: str
    ports: list[int] = Field(default_factory=lambda: [443])
    methods: list[str] = Field(default_factory=list)
    paths: list[str] = Field(default_factory=lambda: ["/"])
    intercept: bool = True
    report: bool = False
    scheme: Literal["https", "http"] = "https"
    approve: ApproveModel | None = None


class HookModel(_Model):
    host: str
    methods: list[str] = Field(default_factory=list)
    paths: list[str] = Field(default_factory=lambda: ["/"])
    command: list[str]
    timeout: float = hooks.DEFAULT_TIMEOUT


class LimitsModel(_Model):
    connections: int = DEFAULT_CONNECTIONS
    requests_per_second: float = DEFAULT_RATE
    burst: int = DEFAULT_BURST
    hook_processes: int = DEFAULT_HOOK_PROCESSES
    websocket_message_bytes: int = DEFAULT_WS_MESSAGE
    approvals: int = DEFAULT_APPROVALS


class PoolModel(_Model):
    egress: list[RuleModel] = Field(default_factory=list)
    hooks: list[HookModel] = Field(default_factory=list)
    allow_reroute: bool = False
    allow_cidrs: list[str] = Field(default_factory=list)
    report: bool = False
    limits: LimitsModel = Field(default_factory=LimitsModel)
    unsafe_any_host: bool = False  # allow a '*' egress rule although the pool's claims hold credentials


class InjectModel(_Model):
    set_header: str
    format: str = "Bearer {value}"


class MintModel(_Model):
    """``mint`` of a credential of kind ``oauth_client`` (proxy.core.mint)."""

    token_url: str
    client_id: str
    grant: str = "client_credentials"
    client_auth: str | None = None  # default: secret_basic, or private_key_jwt when a JWT is signed
    scopes: list[str] = Field(default_factory=list)
    audience: str | None = None
    subject: str | None = None
    algorithm: str = "RS256"
    refresh_token: str | None = None  # a value source (env:/file:): grant refresh_token
    margin: float = 30.0


class SignModel(_Model):
    """``sign`` of a credential of kind ``hmac`` (proxy.core.hmacsign)."""

    algorithm: str = "hmac-sha256"
    parts: list[str] = Field(default_factory=lambda: ["timestamp", "method", "path", "query", "body"])
    separator: str = ""
    encoding: str = "hex"
    header: str = "X-Signature"
    format: str = "{signature}"
    timestamp_header: str = "X-Timestamp"
    max_body: int = 1024 * 1024


class AwsSigV4Model(_Model):
    secret_placeholder: str
    session_token_placeholder: str | None = None
    regions: list[str] = Field(min_length=1)
    services: list[str] = Field(min_length=1)


class CredentialModel(_Model):
    name: str
    value: str
    placeholder: str
    hosts: list[str] = Field(min_length=1)
    inject: InjectModel | None = None
    max_requests: int | None = None
    surfaces: list[str] = Field(default_factory=lambda: [str(x) for x in DEFAULT_SURFACES])
    headers: list[str] | None = None  # header slots (proxy.core.slots); None: DEFAULT_HEADERS
    basic_parts: list[str] | None = None  # Basic slots (proxy.core.slots); None: the password
    on_misplaced: str = Misplaced.CARRY.value
    kind: str = "static"  # static (the value is sent), oauth_client, hmac, aws_sigv4 (proxy.rules.kinds)
    mint: MintModel | None = None
    sign: SignModel | None = None  # kind hmac
    aws_sigv4: AwsSigV4Model | None = None  # kind aws_sigv4: value is JSON (proxy.core.sigv4.real_keys)


class ClaimModel(_Model):
    id: str
    pool: str
    proxy_token: str
    sources: list[str] = Field(default_factory=list)
    interface: str | None = None  # transparent mode: the interface (veth, bridge port) it arrives on
    credentials: list[CredentialModel] = Field(default_factory=list)


class ApprovalsModel(_Model):
    """Top-level ``approvals``: the notification command (proxy.core.approvals.Notify)."""

    notify: list[str]
    timeout: float = approvals.NOTIFY_DEFAULT_TIMEOUT


class RulesModel(_Model):
    version: Literal[1]
    pools: dict[str, PoolModel]
    claims: list[ClaimModel] = Field(default_factory=list)
    approvals: ApprovalsModel | None = None
