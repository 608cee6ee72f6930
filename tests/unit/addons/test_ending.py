"""addons/ending.py: how a flow ended, one table for the audit event and the metrics (issue 18
items 6 and 7). mitmproxy's own test flows; the messages are mitmproxy 12.3's."""

from __future__ import annotations

import pytest
from mitmproxy import flow as mflow
from mitmproxy import http
from mitmproxy.connection import ConnectionState
from mitmproxy.test import tflow

from addons import ending, facts
from proxy.core.decide import Action, Decision, Reason, deny
from proxy.core.hosts import HostPattern
from proxy.core.policy import EgressRule

RULE = EgressRule("p.egress[0]", HostPattern.parse("api.test"), frozenset({443}), frozenset(), ("/",), True)
ALLOW = Decision(Action.ALLOW, Reason.ALLOWED, "allowed by p.egress[0] api.test", RULE)


def _flow(
    msg: str | None,
    content_type: str = "text/event-stream",
    sent: list[bytes] | None = None,
    client_open: bool = True,
    response: bool = True,
) -> http.HTTPFlow:
    f = tflow.tflow(resp=response)
    f.metadata[facts.DECISION] = ALLOW
    f.metadata[facts.ALLOWED_BY] = RULE
    if f.response is not None:
        f.response.headers["content-type"] = content_type
        f.response.stream = lambda chunk: chunk
        ending.watch(f)
        assert callable(f.response.stream)
        for chunk in sent or []:
            f.response.stream(chunk)
    if msg is not None:
        f.error = mflow.Error(msg)
    if not client_open:
        f.client_conn.state = ConnectionState.CLOSED
    return f


GONE = "Client disconnected."
ENDED, SERVED = (Action.ALLOW, Reason.ALLOWED), (Action.ALLOW, Reason.CLIENT_CLOSED)
CUT, UPSTREAM = (Action.ERROR, Reason.CLIENT_CLOSED), (Action.ERROR, Reason.UPSTREAM_ERROR)
CASES = [
    # (id, flow, action, reason)
    ("ended-normally", _flow(None, sent=[b"data: a\n\n"]), *ENDED),
    ("h1-after-last-event", _flow(GONE, sent=[b"data: a\n\n", b"data: [DONE]\n\n"]), *SERVED),
    ("crlf-event-end", _flow(GONE, sent=[b"data: a\r\n\r\n"]), *SERVED),
    ("cr-event-end", _flow(GONE, sent=[b"data: a\r\r"]), *SERVED),
    ("event-end-split-over-reads", _flow(GONE, sent=[b"data: a\n", b"\n"]), *SERVED),
    ("nothing-forwarded-yet", _flow(GONE, sent=[]), *SERVED),
    ("h2-stream-reset", _flow("stream reset by client (CANCEL)", sent=[b"data: a\n\n"]), *SERVED),
    ("h2-goaway", _flow("HTTP/2 connection closed: <ConnectionTerminated>", sent=[b"data: a\n\n"],
                        client_open=False), *SERVED),
    ("ndjson-line-end", _flow(GONE, "application/x-ndjson", [b'{"a": 1}\n']), *SERVED),
    ("mid-event", _flow(GONE, sent=[b"data: a\n\ndata: b"]), *CUT),
    ("one-newline-is-not-an-event-end", _flow(GONE, sent=[b"data: a\n"]), *CUT),
    ("not-a-stream", _flow(GONE, "application/json", [b'{"a": 1}\n']), *CUT),
    ("before-the-head", _flow(GONE, response=False), *CUT),
    ("upstream-closed", _flow("HTTP/1 protocol error: peer closed connection without sending complete "
                              "message body (incomplete chunked read)", sent=[b"data: a\n\n"]), *UPSTREAM),
    ("upstream-h2-closed", _flow("peer closed connection", sent=[b"data: a\n\n"]), *UPSTREAM),
    ("killed-by-surrogate", _flow(mflow.Error.KILLED_MESSAGE, sent=[b"data: a\n\n"], client_open=False),
     *UPSTREAM),
]  # fmt: skip


@pytest.mark.parametrize(("f", "action", "reason"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_how_a_flow_ended(f: http.HTTPFlow, action: Action, reason: Reason) -> None:
    decision = ending.decision(f)
    assert decision is not None
    assert (decision.action, decision.reason, decision.rule) == (action, reason, RULE)


def test_a_refusal_keeps_the_rule_that_allowed_the_request() -> None:
    f = tflow.tflow()
    f.metadata[facts.DECISION] = ALLOW
    f.metadata[facts.ALLOWED_BY] = RULE
    facts.refuse(f, deny(Reason.UNRESOLVABLE, "cannot resolve api.test", status=502))
    decision = ending.decision(f)
    assert decision is not None and (decision.reason, decision.rule) == (Reason.UNRESOLVABLE, RULE)


def test_no_rule_is_invented_where_none_allowed() -> None:
    f = tflow.tflow()
    facts.refuse(f, deny(Reason.NO_RULE, "no rule"))
    decision = ending.decision(f)
    assert decision is not None and decision.rule is None


def test_a_refusal_before_the_request_was_sent_uses_no_credential() -> None:
    f = tflow.tflow()
    f.metadata[facts.USED] = {"k": 1}
    facts.refuse(f, deny(Reason.UNRESOLVABLE, "cannot resolve api.test", status=502))
    assert ending.used(f) == {}


def test_a_refusal_of_the_response_keeps_the_credentials_that_left() -> None:
    f = tflow.tflow(resp=True)
    f.metadata[facts.USED] = {"k": 1}
    facts.refuse(f, deny(Reason.INTERNAL_ERROR, "failed", status=400))  # e.g. a failed response check
    assert ending.used(f) == {"k": 1}


def test_an_upstream_failure_before_its_tls_uses_no_credential() -> None:
    f = tflow.tflow(err=True)
    f.request.scheme = "https"
    f.server_conn.timestamp_tls_setup = None
    f.metadata[facts.USED] = {"k": 1}
    assert ending.used(f) == {}
    f.server_conn.timestamp_tls_setup = 1.0
    assert ending.used(f) == {"k": 1}
