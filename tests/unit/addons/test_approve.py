"""addons/approve.py's preview: the held request's head with everything the response scrubber
would scrub taken out (review r-approve): a plain secret, and an aws_sigv4 credential's real
access key id, secret key and session token each back to its placeholder, not only the JSON
value they are sealed in."""

from __future__ import annotations

import json
import time
from pathlib import Path

import canary
from mitmproxy.test import tflow

from addons.approve import _preview
from proxy.rules.loader import load_rules

RULES = """version: 1
pools:
  p:
    egress:
      - host: api.test
claims:
  - id: c1
    pool: p
    proxy_token: file:token
    credentials:
      - name: api
        value: file:api
        placeholder: surr_PreviewApiPlaceholder001
        hosts: [api.test]
      - name: aws
        kind: aws_sigv4
        value: file:aws.json
        placeholder: surr_PreviewAwsKeyId00000001
        hosts: [api.test]
        aws_sigv4:
          secret_placeholder: surr_PreviewAwsSecret0000001
          session_token_placeholder: surr_PreviewAwsToken00000001
          regions: ["*"]
          services: ["*"]
"""


def test_the_preview_holds_no_value_the_scrubber_would_scrub(tmp_path: Path) -> None:
    api, key_id, secret, token = (canary.make(t) for t in ("PVAPI", "PVKEY", "PVSEC", "PVTOK"))
    canary.source(tmp_path / "api", api).write_text(api)
    keys = json.dumps({"access_key_id": key_id, "secret_access_key": secret, "session_token": token})
    canary.source(tmp_path / "aws.json", keys).write_text(keys)
    (tmp_path / "token").write_text("tok-preview")
    (tmp_path / "rules.yaml").write_text(RULES)
    claim = load_rules(tmp_path / "rules.yaml").claims["c1"]
    flow = tflow.tflow()
    flow.request.headers["X-Echo"] = f"{api} {key_id} {secret} {token}"
    flow.request.path = f"/v1/x?k={key_id}"
    shown = _preview(flow, claim, time.time())
    canary.assert_absent({"preview": shown.encode()}, [api, key_id, secret, token])
    assert "surr_PreviewApiPlaceholder001" in shown and "surr_PreviewAwsSecret0000001" in shown
    assert "surr_PreviewAwsKeyId00000001" in shown and "surr_PreviewAwsToken00000001" in shown
