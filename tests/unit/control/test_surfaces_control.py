"""Surfaces and on_misplaced through the control path: the API validates and returns them, the
store keeps them (and migrates a version-1 file without losing a row), the registry builds
credentials that carry them."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx
import pytest

from proxy.cli import main as cli
from proxy.control import client
from proxy.control.service import Control
from proxy.core.policy import DEFAULT_SURFACES, Misplaced, Surface
from proxy.store.keyring import KeyRing
from proxy.store.sqlite import SCHEMA_VERSION, Store
from unit.control.world import SECRET, claim, cred, problem


async def test_put_with_surfaces_reaches_the_proxy_credential(
    api: httpx.AsyncClient, control: Control
) -> None:
    await claim(api)
    body = {"hosts": ["api.test"], "value": SECRET, "surfaces": ["query", "body"], "on_misplaced": "block"}
    r = await cred(api, body)
    assert r.status_code == 201, r.text
    assert (r.json()["surfaces"], r.json()["on_misplaced"]) == (["query", "body"], "block")
    control.registry.refresh()
    c = control.registry.claim("c1")
    assert c is not None
    (credential,) = c.credentials
    assert credential.surfaces == frozenset({Surface.QUERY, Surface.BODY})
    assert credential.on_misplaced is Misplaced.BLOCK


async def test_defaults_when_not_given(api: httpx.AsyncClient) -> None:
    await claim(api)
    r = await cred(api)
    assert (r.json()["surfaces"], r.json()["on_misplaced"]) == (["header", "basic"], "carry")


async def test_patch_changes_and_null_resets(api: httpx.AsyncClient) -> None:
    await claim(api)
    await cred(api)
    r = await api.patch(
        "/v1/claims/c1/credentials/gh", json={"surfaces": ["userinfo"], "on_misplaced": "terminate"}
    )
    assert r.status_code == 200, r.text
    assert (r.json()["surfaces"], r.json()["on_misplaced"], r.json()["version"]) == (
        ["userinfo"],
        "terminate",
        2,
    )
    r = await api.patch("/v1/claims/c1/credentials/gh", json={"surfaces": None, "on_misplaced": None})
    assert (r.json()["surfaces"], r.json()["on_misplaced"]) == (["header", "basic"], "carry")


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"surfaces": ["cookie"]}, id="unknown-surface"),
        pytest.param({"on_misplaced": "drop"}, id="unknown-action"),
        pytest.param({"surfaces": "query"}, id="not-a-list"),
    ],
)
async def test_bad_values_are_422_naming_the_field(api: httpx.AsyncClient, body: dict[str, object]) -> None:
    await claim(api)
    r = await cred(api, {"hosts": ["api.test"], "value": SECRET, **body})
    err = problem(r, 422, "invalid_request")
    assert err["field"] is not None and err["field"].split(".")[0] in body
    assert SECRET not in r.text


def test_a_version_1_store_is_migrated_keeping_every_row(tmp_path: Path) -> None:
    ring = KeyRing.load_or_create(tmp_path / "store.key")
    with Store.open(tmp_path / "store.sqlite3", ring) as s:
        s.create_claim("c1", "p")
        s.put_credential(
            "c1", "gh", value=b"v1", hosts=["api.test"], placeholder="surr_MigratePlaceholder000001"
        )
    # Make it the version-1 file an older surrogate wrote: without the columns of versions 2 and later.
    db = sqlite3.connect(tmp_path / "store.sqlite3", isolation_level=None)
    for column in ("basic_parts", "headers", "requests_used", "max_requests", "surfaces", "on_misplaced"):
        db.execute(f"ALTER TABLE credentials DROP COLUMN {column}")
    db.execute("ALTER TABLE claims DROP COLUMN interface")
    db.execute("PRAGMA user_version = 1")
    db.close()
    with Store.open(tmp_path / "store.sqlite3", ring) as s:
        (r,) = s.list_credentials("c1")
        assert (r.name, r.hosts, r.placeholder, r.version) == (
            "gh",
            ("api.test",),
            "surr_MigratePlaceholder000001",
            1,
        )
        assert (r.surfaces, r.on_misplaced) == (None, None)  # the defaults: header, basic; carry
        assert s.secret("c1", "gh") == (b"v1", 1)
        s.patch_credential("c1", "gh", surfaces=["body"])
        assert s.get_credential("c1", "gh").surfaces == ("body",)  # type: ignore[union-attr]
    db = sqlite3.connect(tmp_path / "store.sqlite3")
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.close()
    assert {Surface.HEADER, Surface.BASIC} == DEFAULT_SURFACES


def test_cli_sends_surfaces_and_on_misplaced() -> None:
    args = cli._parser().parse_args(
        ["creds", "patch", "c1", "k", "--surface", "query", "--surface", "body",
         "--on-misplaced", "block", "--state-dir", "/nonexistent"]
    )  # fmt: skip
    method, url, body, _ = client._request(args)
    assert (method, url) == ("PATCH", "/v1/claims/c1/credentials/k")
    assert body == {"surfaces": ["query", "body"], "on_misplaced": "block"}


def test_cli_sends_slots() -> None:
    args = cli._parser().parse_args(
        ["creds", "patch", "c1", "k", "--host", "api.test", "--slot-header", "X-Api-Key",
         "--slot-header", "Cookie", "--basic-part", "user", "--state-dir", "/nonexistent"]
    )  # fmt: skip
    _, _, body, _ = client._request(args)
    assert body == {"hosts": ["api.test"], "headers": ["X-Api-Key", "Cookie"], "basic_parts": ["user"]}
