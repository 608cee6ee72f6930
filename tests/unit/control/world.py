"""What the control API unit tests share: the canary value, the rules file, and helpers that
create a claim, put a credential and check an error body (never the value in it)."""

from __future__ import annotations

from typing import Any

import httpx

SECRET = "CANARYapi-value-7f3e9c"
RULES = """\
version: 1
pools:
  p:
    egress:
      - host: api.test
      - host: "*.github.test"
      - host: opaque.test
        intercept: false
  wide:
    egress:
      - host: api.test
      - host: "*"
  wide-ok:
    unsafe_any_host: true
    egress:
      - host: api.test
      - host: "*"
claims:
  - id: static
    pool: p
    proxy_token: file:tok
"""


async def claim(api: httpx.AsyncClient, cid: str = "c1") -> dict[str, Any]:
    r = await api.post("/v1/claims", json={"id": cid, "pool": "p"})
    assert r.status_code == 201, r.text
    return r.json()


async def cred(
    api: httpx.AsyncClient,
    body: dict[str, Any] | None = None,
    cid: str = "c1",
    name: str = "gh",
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    body = body if body is not None else {"hosts": ["api.test"], "value": SECRET}
    return await api.put(f"/v1/claims/{cid}/credentials/{name}", json=body, headers=headers or {})


def problem(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["error"] == code and body["message"], body
    assert SECRET not in r.text
    return body
