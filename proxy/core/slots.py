"""Substitution slots: the headers, and the parts of Basic credentials, a credential is swapped in.

Pure (no I/O). A credential's ``header`` surface swaps a placeholder only inside the headers it
names (``headers:``); one that names none gets :data:`DEFAULT_HEADERS`, the headers that carry
credentials in practice, not every header. A placeholder in any other header (``Origin``,
``Referer``, ``Cookie``, ``X-Request-Id``, ``Sec-WebSocket-Protocol``, ...) is then *misplaced*:
carried inert or refused as the credential's ``on_misplaced`` says, never swapped, because hosts
reflect such headers back (CORS answers, logs, error pages, WebSocket handshakes).

The default headers, and who uses them:

==============================  =============================================================
``Authorization``               RFC 9110 §11.6.2: ``Bearer`` (RFC 6750 §2.1; OpenAI, GitHub,
                                Slack, Stripe, Hugging Face, ...), ``token`` (GitHub), and
                                Basic (its own ``basic`` surface)
``X-Api-Key``                   Anthropic, AWS API Gateway, and many others
``Api-Key``                     Azure OpenAI (``api-key``), Pinecone
``X-Goog-Api-Key``              Google APIs (Gemini, Maps, ...)
``Private-Token``               GitLab personal, project and group access tokens
``X-Auth-Token``                OpenStack (Keystone tokens), Rackspace and others
``Ocp-Apim-Subscription-Key``   Azure AI services and Azure API Management
==============================  =============================================================

Any other header is named on the credential (``headers: [Authorization, DD-API-KEY]``); naming
``Cookie`` (for a session-cookie API) is allowed but then deliberate.

Basic credentials (RFC 7617 §2: ``user-id ":" password``, the user-id holds no colon) are swapped
in the *password* by default (``basic_parts: [password]``): git and curl send a token as the
password of ``https://x:TOKEN@host``. The user name often reaches logs and is echoed back, so it is
swapped only when the credential says ``basic_parts: [user]`` (or both; GitHub also accepts
``TOKEN:x-oauth-basic``, Stripe ``sk_...:``). Decoded credentials without a colon are all user-id.
"""

from __future__ import annotations

import re
from enum import StrEnum

_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # RFC 9110 §5.6.2 token


class BasicPart(StrEnum):
    """A part of decoded Basic credentials (RFC 7617 §2)."""

    USER = "user"
    PASSWORD = "password"  # noqa: S105 - the name of a part, not a password


DEFAULT_HEADER_NAMES = (
    "Authorization",
    "X-Api-Key",
    "Api-Key",
    "X-Goog-Api-Key",
    "Private-Token",
    "X-Auth-Token",
    "Ocp-Apim-Subscription-Key",
)
DEFAULT_HEADERS = frozenset(h.lower() for h in DEFAULT_HEADER_NAMES)
DEFAULT_BASIC_PARTS = frozenset({BasicPart.PASSWORD})
BASIC_PARTS = (BasicPart.USER, BasicPart.PASSWORD)

# Headers hosts commonly reflect (CORS answers, logs, error pages, WebSocket handshakes): naming
# one as a slot is allowed, and `rules check` warns.
REFLECTED = frozenset(
    {"origin", "referer", "cookie", "x-request-id", "sec-websocket-protocol", "user-agent", "x-forwarded-for"}
)
# Framing and routing headers: a secret there changes how the request is read, not who it is.
_NEVER = frozenset({"host", "content-length", "transfer-encoding", "connection", "te", "upgrade"})


def header_problem(name: object) -> str | None:
    """Why ``name`` cannot be a substitution slot (None: it can). Slots are HTTP field names
    (RFC 9110 §5.1, a token), not ``Host``, ``Proxy-*`` (never forwarded) or framing headers."""
    if not isinstance(name, str) or not _TOKEN.match(name):
        return f"{name!r} is not an HTTP header name"
    low = name.lower()
    if low in _NEVER or low.startswith("proxy-"):
        return f"{name!r} is not a header a secret may be swapped into"
    return None


def normalise_headers(names: list[str] | tuple[str, ...]) -> frozenset[str]:
    """The lower-cased slot set of ``names``; raises ValueError naming the first bad name."""
    for name in names:
        if (why := header_problem(name)) is not None:
            raise ValueError(why)
    return frozenset(n.lower() for n in names)


def basic_parts(names: list[str] | tuple[str, ...]) -> frozenset[BasicPart]:
    """The parts named; raises ValueError naming the first unknown one."""
    for name in names:
        if name not in set(BasicPart):
            raise ValueError(f"unknown Basic part {name!r}; expected some of: user, password")
    return frozenset(BasicPart(n) for n in names)


def split_basic(decoded: bytes) -> tuple[bytes, bytes | None]:
    """``(user-id, password)`` of decoded Basic credentials; password None without a colon."""
    user, sep, password = decoded.partition(b":")
    return user, (password if sep else None)


def display(headers: frozenset[str]) -> str:
    """The slot set as a sorted, comma-separated list of names (defaults in their usual case)."""
    canon = {h.lower(): h for h in DEFAULT_HEADER_NAMES}
    return ", ".join(sorted(canon.get(h, h) for h in headers)) or "none"
