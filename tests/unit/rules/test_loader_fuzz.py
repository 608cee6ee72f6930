"""Fuzzing the rules loader (issue 5): whatever the file holds, :func:`proxy.rules.loader.load_rules`
returns a Policy or raises RulesError: never another exception, never a secret in a message.

Three generators, each bounded so the module runs in seconds: arbitrary YAML-able documents,
structured rule dicts shaped like the schema with values of random types, and byte-level
mutations (flips, insertions, deletions, truncations) of a valid document.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.core import placeholders
from proxy.core.errors import RulesError
from proxy.core.policy import Policy
from proxy.rules.loader import load_rules

SECRET = "FUZZsecretValue0f9a8b7c6d5e4f3a2b1c"  # what the value sources hold: never in a message
PH = placeholders.generate()
SEED = f"""\
version: 1
pools:
  p:
    allow_cidrs: [10.0.0.0/8]
    egress:
      - host: api.test
        ports: [443, 8443]
        methods: [GET, POST]
        paths: ["/v1"]
      - host: "*.example.test"
        intercept: false
claims:
  - id: c
    pool: p
    proxy_token: file:token
    sources: [10.1.0.0/16]
    credentials:
      - name: k
        value: file:secret
        placeholder: {PH}
        hosts: [api.test]
        inject:
          set_header: X-Key
          format: "Bearer {{value}}"
"""
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    # one directory for every example (hypothesis re-runs a test body many times per fixture)
    with tempfile.TemporaryDirectory(prefix="rules-fuzz-") as d:
        path = Path(d)
        (path / "secret").write_text(SECRET + "\n")
        (path / "token").write_text(SECRET + "tok\n")
        yield path


def _load(workdir: Path, text: str | bytes) -> None:
    path = workdir / "rules.yaml"
    path.write_bytes(text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text)
    try:
        policy = load_rules(path)
    except RulesError as e:
        assert e.problems, "a RulesError names at least one problem"
        assert SECRET not in str(e)
        assert all(p.file == str(path) for p in e.problems)
        return
    assert isinstance(policy, Policy)
    assert SECRET not in repr(policy)


def test_the_seed_document_loads(workdir: Path) -> None:
    _load(workdir, SEED)
    assert load_rules(workdir / "rules.yaml").claims


_scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=40)
_documents = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=25,
)


@FUZZ
@given(_documents)
def test_any_yaml_document(workdir: Path, doc: Any) -> None:
    _load(workdir, yaml.safe_dump(doc, allow_unicode=True))


# Values of the right type most of the time, of any type some of the time.
def _or_junk(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(strategy, strategy, strategy, _documents)


_hosts = st.sampled_from(
    ["api.test", "*.example.test", "*", "bücher.test", "127.1", "a..b", "*.", "x" * 300, ""]
)
_rule = st.fixed_dictionaries(
    {"host": _or_junk(_hosts)},
    optional={
        "ports": _or_junk(st.lists(st.integers(-5, 70000), max_size=3)),
        "methods": _or_junk(st.lists(st.sampled_from(["GET", "get", "P O", "TRACE", ""]), max_size=3)),
        "paths": _or_junk(st.lists(st.sampled_from(["/", "/v1", "v1", ""]), max_size=2)),
        "intercept": _or_junk(st.booleans()),
        "report": _or_junk(st.booleans()),
    },
)
_credential = st.fixed_dictionaries(
    {
        "name": _or_junk(st.sampled_from(["k", "k2", ""])),
        "value": _or_junk(
            st.sampled_from(["file:secret", "env:NOPE_NOT_SET", "file:missing", SECRET, "file:"])
        ),
        "placeholder": _or_junk(st.sampled_from([PH, placeholders.generate(), "surr_short", PH + "x"])),
        "hosts": _or_junk(st.lists(_hosts, max_size=3)),
    },
    optional={
        "inject": _or_junk(
            st.fixed_dictionaries(
                {"set_header": st.sampled_from(["X-Key", "Host", "Proxy-Foo", ""])},
                optional={"format": st.sampled_from(["Bearer {value}", "no value", "{value}{value}"])},
            )
        )
    },
)
_claim = st.fixed_dictionaries(
    {
        "id": _or_junk(st.sampled_from(["c", "c2", ""])),
        "pool": _or_junk(st.sampled_from(["p", "q", "missing"])),
        "proxy_token": _or_junk(st.sampled_from(["file:token", "env:NOPE_NOT_SET", SECRET])),
    },
    optional={
        "credentials": _or_junk(st.lists(_credential, max_size=3)),
        "sources": _or_junk(
            st.lists(st.sampled_from(["10.0.0.0/8", "::1/128", "300.0.0.0/8", "x"]), max_size=2)
        ),
    },
)
_pool = st.fixed_dictionaries(
    {},
    optional={
        "egress": _or_junk(st.lists(_rule, max_size=4)),
        "allow_cidrs": _or_junk(st.lists(st.sampled_from(["127.0.0.0/8", "10.0.0.1/8", "fd00::/8", "x"]))),
        "allow_reroute": _or_junk(st.booleans()),
        "report": _or_junk(st.booleans()),
    },
)
_rules_doc = st.fixed_dictionaries(
    {"version": _or_junk(st.just(1)), "pools": _or_junk(st.dictionaries(st.sampled_from(["p", "q"]), _pool))},
    optional={"claims": _or_junk(st.lists(_claim, max_size=3))},
)


@FUZZ
@given(_rules_doc)
def test_structured_random_rules(workdir: Path, doc: dict[str, Any]) -> None:
    _load(workdir, yaml.safe_dump(doc, allow_unicode=True, sort_keys=False))


_mutation = st.tuples(
    st.sampled_from(["flip", "insert", "delete", "truncate"]),
    st.integers(0, len(SEED)),
    st.binary(min_size=1, max_size=8),
)


@FUZZ
@given(st.lists(_mutation, min_size=1, max_size=6))
def test_mutated_valid_documents(workdir: Path, mutations: list[tuple[str, int, bytes]]) -> None:
    data = bytearray(SEED.encode())
    for kind, at, junk in mutations:
        at = min(at, len(data))
        if kind == "flip" and at < len(data):
            data[at] ^= junk[0] or 1
        elif kind == "insert":
            data[at:at] = junk
        elif kind == "delete":
            del data[at : at + len(junk)]
        elif kind == "truncate":
            del data[at:]
    _load(workdir, bytes(data))
