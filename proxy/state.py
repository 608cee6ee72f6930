"""The proxy's live state, shared by the addons: the policy in force and the address pins.

One object, replaced field by field (never mutated in place), so a reload swaps ``policy`` in one
assignment and the very next request sees it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from proxy.policy import Policy


@dataclass(slots=True)
class State:
    policy: Policy
    pins: dict[str, str] = field(default_factory=dict)  # canonical host -> IP, like curl --resolve
