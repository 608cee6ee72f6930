"""addons/policy.py: the canonical authority written into the request the upstream receives
(review r-h2auth). mitmproxy's ``Request.host`` setter writes an IPv6 literal into the Host field
and ``:authority`` without brackets (``::1:8443``), a name an upstream may read as another
address or not at all (RFC 9110 §7.2 and RFC 3986 §3.2.2: ``[::1]:8443``)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from mitmproxy import http
from mitmproxy.test import tflow

from addons import facts
from addons.policy import Policy
from proxy.rules.loader import load_rules

RULES = """version: 1
pools:
  p:
    egress:
      - host: "2001:db8::5"
        ports: [8443]
      - host: api.test
        ports: [443, 8443]
claims:
  - id: c1
    pool: p
    proxy_token: file:token
"""


def _policy(tmp_path: Path) -> tuple[Policy, object]:
    (tmp_path / "token").write_text("tok-policy")
    (tmp_path / "rules.yaml").write_text(RULES)
    rules = load_rules(tmp_path / "rules.yaml")
    return Policy(SimpleNamespace(policy=rules)), rules.claims["c1"]  # type: ignore[arg-type]


# (tunnel host, port, the Host / :authority as sent, HTTP/2?, what the upstream must get)
CASES = [
    ("2001:db8::5", 8443, "[2001:db8::5]:8443", False, "[2001:db8::5]:8443"),
    ("2001:db8::5", 8443, "[2001:DB8:0::5]:8443", False, "[2001:db8::5]:8443"),
    ("2001:db8::5", 8443, "[2001:DB8:0::5]:8443", True, "[2001:db8::5]:8443"),
    ("api.test", 8443, "API.test.:8443", False, "api.test:8443"),
    ("api.test", 8443, "API.test.:8443", True, "api.test:8443"),
    ("api.test", 443, "api.test:443", True, "api.test:443"),  # already canonical: kept
]


@pytest.mark.parametrize(("host", "port", "sent", "h2", "want"), CASES)
def test_the_upstream_gets_the_canonical_authority_bracketed(
    tmp_path: Path, host: str, port: int, sent: str, h2: bool, want: str
) -> None:
    policy, claim = _policy(tmp_path)
    flow = tflow.tflow()
    flow.client_conn.sni = None
    req = flow.request
    req.data.http_version = b"HTTP/2.0" if h2 else b"HTTP/1.1"
    req.data.host, req.data.port, req.data.scheme = host, port, b"https"
    req.data.path = b"/x"
    if h2:
        req.data.authority = sent.encode()
        req.headers = http.Headers()
    else:
        req.headers = http.Headers(Host=sent)
    flow.metadata[facts.CLAIM] = claim
    flow.metadata[facts.AUTHORITY] = (host, port)
    policy.requestheaders(flow)
    assert flow.metadata[facts.DECISION].allowed, flow.metadata[facts.DECISION]
    if h2:
        assert req.data.authority == want.encode() and "Host" not in req.headers
    else:
        assert req.headers.get_all("Host") == [want]
    assert req.host == host
