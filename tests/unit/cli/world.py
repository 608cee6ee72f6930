"""The rules file, claims and secrets both dry-run test modules use (test_explain, test_why)."""

from __future__ import annotations

import argparse
from typing import Any

P_GH = "surr_UnitGithubPlaceholder0001"
P_INJ = "surr_UnitInjectedPlaceholder02"
P_OTHER = "surr_UnitOtherClaimPlaceholder3"
SECRETS = {
    "secret-gh": "ghs_UNITSECRETgithub0123456789",
    "secret-inj": "inj_UNITSECRETinjected987654",
    "secret-other": "oth_UNITSECRETotherclaim5555",
    "token": "tok_UNITSECRETproxytoken4444",
}
STORE_SECRET = "sto_UNITSECRETstorevalue3333"
RULES = """\
    version: 1
    pools:
      p:
        egress:
          - host: api.test
            methods: [GET, POST]
            paths: [/repos, /user]
          - host: other.test
          - host: opaque.test
            intercept: false
          - host: api.test
            ports: [80]
            scheme: http
          - host: "*.test"
            intercept: false
    claims:
      - id: c1
        pool: p
        proxy_token: file:token
        credentials:
          - name: gh
            value: file:secret-gh
            placeholder: surr_UnitGithubPlaceholder0001
            hosts: [api.test]
          - name: inj
            value: file:secret-inj
            placeholder: surr_UnitInjectedPlaceholder02
            hosts: [api.test]
            inject: {set_header: X-Injected, format: "Token {value}"}
      - id: c2
        pool: p
        proxy_token: file:token
        credentials:
          - name: other
            value: file:secret-other
            placeholder: surr_UnitOtherClaimPlaceholder3
            hosts: [api.test]
"""


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        for value in (*SECRETS.values(), STORE_SECRET):
            assert value not in text


def ns(**kw: Any) -> argparse.Namespace:
    return argparse.Namespace(**{"state_dir": None, "json": False, "header": [], **kw})
