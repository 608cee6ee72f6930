"""``surrogate creds put --kind K --kind-file F`` (proxy/control/client.py): the request body
carries the kind and its block; a missing value or block, or a block that is not a JSON object,
is refused before anything is sent, naming the file and never its content."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.cli.main import _parser
from proxy.control.client import _request

SECRET = "CANARYclient-kind-secret-91c2"


def _args(tmp_path: Path, *extra: str) -> list[str]:
    return ["creds", "put", "c1", "k", "--host", "api.test", *extra, "--state-dir", str(tmp_path)]


@pytest.mark.parametrize(
    ("kind", "block"), [("aws_sigv4", "aws_sigv4"), ("oauth_client", "mint"), ("hmac", "sign")]
)
def test_a_kind_and_its_block_go_into_the_put(tmp_path: Path, kind: str, block: str) -> None:
    (tmp_path / "block.json").write_text(json.dumps({"x": SECRET}))
    (tmp_path / "value").write_text(SECRET + "\n")
    value = [] if kind == "aws_sigv4" else ["--value-file", str(tmp_path / "value")]
    ns = _parser().parse_args(
        _args(tmp_path, "--kind", kind, "--kind-file", str(tmp_path / "block.json"), *value)
    )
    method, url, body, _ = _request(ns)
    assert (method, url) == ("PUT", "/v1/claims/c1/credentials/k")
    assert body is not None and body["kind"] == kind and body[block] == {"x": SECRET}
    assert ("value" in body) == (kind != "aws_sigv4")


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ([], "needs --value-file"),
        (["--kind", "oauth_client", "--value-file", "{v}"], "needs --kind-file"),
        (["--kind", "hmac", "--value-file", "{v}", "--kind-file", "{bad}"], "is not a JSON object"),
        # a newcomer's block was dropped without a word when --kind was left out
        (["--value-file", "{v}", "--kind-file", "{bad}"], "give --kind"),
    ],
    ids=["static-without-value", "kind-without-block", "block-not-json", "block-without-kind"],
)
def test_a_put_missing_its_parts_is_refused_before_sending(
    tmp_path: Path, extra: list[str], says: str
) -> None:
    (tmp_path / "v").write_text(SECRET)
    (tmp_path / "bad").write_text(f"[{SECRET!r}")
    argv = [a.format(v=tmp_path / "v", bad=tmp_path / "bad") for a in extra]
    with pytest.raises(SystemExit) as e:
        _request(_parser().parse_args(_args(tmp_path, *argv)))
    assert says in str(e.value.code) and SECRET not in str(e.value.code)
