"""``/readyz`` (proxy.control.ready) in process: a real app over a real store (temp SQLite and key
file); 200 only when listening and the store answers, else 503 with the reason. ``/healthz``
stays liveness."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from proxy.control.api import make_app
from proxy.control.ready import Readiness
from proxy.control.service import Control
from proxy.rules.loader import load_rules
from proxy.store.keyring import KeyRing
from proxy.store.registry import Registry
from proxy.store.sqlite import Store

RULES = "version: 1\npools:\n  p:\n    egress:\n      - host: api.test\n"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(tmp_path / "store.sqlite3", KeyRing.load_or_create(tmp_path / "store.key"))
    yield s
    s.close()


@pytest.fixture
def control(tmp_path: Path, store: Store) -> Control:
    (tmp_path / "rules.yaml").write_text(RULES)
    return Control(Registry(load_rules(tmp_path / "rules.yaml"), store), store)


def client(control: Control, readiness: Readiness, token: str | None = None) -> httpx.AsyncClient:
    listen = ("127.0.0.1", 9090) if token else None
    app = make_app(control, token, listen, readiness)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:9090")


@pytest.fixture
async def ready(control: Control, store: Store) -> AsyncIterator[tuple[httpx.AsyncClient, Readiness]]:
    readiness = Readiness(store, "node-a", listening=False)
    async with client(control, readiness) as api:
        yield api, readiness


async def test_ready_once_listening_with_the_stores_version(
    ready: tuple[httpx.AsyncClient, Readiness], store: Store
) -> None:
    api, readiness = ready
    readiness.listening = True
    r = await api.get("/readyz")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body == {"ready": True, "node": "node-a", "store_version": body["store_version"]}
    assert isinstance(body["store_version"], int)
    store.create_claim("c1", "p")
    after = (await api.get("/readyz")).json()["store_version"]
    assert after != body["store_version"]  # a write moves it


@pytest.mark.parametrize(
    ("state", "reason"),
    [("starting", "starting"), ("stopping", "stopping"), ("store_closed", "store_unreachable")],
)
async def test_not_ready_is_503_with_the_reason(
    ready: tuple[httpx.AsyncClient, Readiness], store: Store, state: str, reason: str
) -> None:
    api, readiness = ready
    readiness.listening = state != "starting"
    readiness.stopping = state == "stopping"
    if state == "store_closed":
        store.close()
    r = await api.get("/readyz")
    assert r.status_code == 503, r.text
    body = r.json()
    assert body["ready"] is False and body["reason"] == reason and body["node"] == "node-a"
    assert set(body) == {"ready", "node", "reason", "message"}
    assert "store.sqlite3" not in body["message"] and str(Path.cwd()) not in body["message"]


async def test_healthz_stays_liveness_while_not_ready(ready: tuple[httpx.AsyncClient, Readiness]) -> None:
    api, _ = ready
    assert (await api.get("/readyz")).status_code == 503
    r = await api.get("/healthz")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


async def test_the_probes_need_no_operator_token_but_everything_else_does(
    control: Control, store: Store
) -> None:
    async with client(control, Readiness(store, "node-a"), token="operator-token-0123456789") as api:
        assert (await api.get("/readyz")).status_code == 200
        assert (await api.get("/healthz")).status_code == 200
        assert (await api.get("/metrics")).status_code == 401
        assert (await api.get("/v1/claims")).status_code == 401
        # the Host check (DNS rebinding) still holds for the probes
        foreign = await api.get("/readyz", headers={"Host": "evil.example:9090"})
        assert foreign.status_code == 403


async def test_readyz_is_in_the_openapi_document_with_both_answers(control: Control, store: Store) -> None:
    async with client(control, Readiness(store, "node-a")) as api:
        doc = (await api.get("/openapi.json")).json()
    answers = doc["paths"]["/readyz"]["get"]["responses"]
    assert {"200", "503"} <= set(answers)
