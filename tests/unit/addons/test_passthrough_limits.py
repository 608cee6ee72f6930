"""A transparent pass-through over its claim's limits (review r3): addons/limits.py refuses its
upstream connection with a server error, and addons/audit.py audits the tunnel with the limit's
reason, not as an upstream failure."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from mitmproxy.test import tflow

from addons import facts
from addons.audit import _passthrough_event
from addons.limits import REFUSED_CONNECTIONS, REFUSED_RATE
from proxy.core.decide import Action, Decision, Reason


@pytest.mark.parametrize(
    ("error", "reason", "action"),
    [
        (f"{REFUSED_CONNECTIONS}: claim 'c' already holds 2", Reason.TOO_MANY_CONNECTIONS, Action.DENY),
        (f"{REFUSED_RATE}: claim 'c' is over 1 requests per second", Reason.RATE_LIMITED, Action.DENY),
        ("refused: special: 10.0.0.1 is private", Reason.SPECIAL_ADDRESS, Action.ERROR),
        ("connection refused", Reason.UPSTREAM_ERROR, Action.ERROR),
    ],
    ids=["connections", "rate", "special", "upstream"],
)
def test_a_pass_through_refused_for_a_limit_is_audited_with_that_limit(
    error: str, reason: Reason, action: Action
) -> None:
    allowed = Decision(Action.ALLOW, Reason.ALLOWED, "allowed", None)
    passing = facts.Passthrough(SimpleNamespace(id="c", pool="p"), "opaque.test", 443, allowed, time.time())
    event = _passthrough_event(tflow.tclient_conn(), passing, error)
    assert (event["decision"], event["reason"]) == (action.value, reason.value)
