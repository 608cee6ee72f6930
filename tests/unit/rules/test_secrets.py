"""proxy.core.secrets: a Secret hides its value; value sources read env vars and files, checked."""

from __future__ import annotations

import copy
import os
import pickle
from pathlib import Path

import pytest

from proxy.core.errors import SecretUnavailable
from proxy.core.secrets import Secret
from proxy.rules.sources import ValueSource

VALUE = "ghp_canaryValue0123456789"


# --- Secret ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "show",
    [repr, str, lambda s: f"{s}", lambda s: f"{s!r}", format],
    ids=["repr", "str", "format", "format-repr", "builtin-format"],
)
def test_secret_is_redacted_when_shown(show: object) -> None:
    shown = show(Secret(VALUE))  # type: ignore[operator]
    assert VALUE not in shown
    assert shown == "Secret(<redacted>)"


def test_secret_repr_is_redacted_inside_containers() -> None:
    assert VALUE not in repr({"k": [Secret(VALUE)]})


def test_secret_reveal_returns_the_value() -> None:
    assert Secret(VALUE).reveal() == VALUE


def test_secret_equality_and_hash_follow_the_value() -> None:
    assert Secret(VALUE) == Secret(VALUE)
    assert Secret(VALUE) != Secret("other")
    assert Secret(VALUE) != VALUE
    assert len({Secret(VALUE), Secret(VALUE)}) == 1


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_secret_is_not_picklable(protocol: int) -> None:
    with pytest.raises(TypeError, match="not picklable"):
        pickle.dumps(Secret(VALUE), protocol=protocol)


def test_secret_cannot_be_copied_through_the_pickle_protocol() -> None:
    with pytest.raises(TypeError):
        copy.deepcopy(Secret(VALUE))


def test_secret_has_no_instance_dict() -> None:
    assert not hasattr(Secret(VALUE), "__dict__")


# --- ValueSource.parse ----------------------------------------------------------------------


def test_value_source_parse_env(tmp_path: Path) -> None:
    src = ValueSource.parse("env:MY_TOKEN", tmp_path)
    assert (src.kind, src.ref, src.version) == ("env", "MY_TOKEN", 0)
    assert src.describe() == "env:MY_TOKEN"


def test_value_source_parse_file_is_relative_to_base_dir(tmp_path: Path) -> None:
    src = ValueSource.parse("file:sub/../token", tmp_path)
    assert src.kind == "file"
    assert src.ref == str((tmp_path / "token").resolve())
    assert src.describe() == f"file:{src.ref}"


def test_value_source_parse_absolute_file_ignores_base_dir(tmp_path: Path) -> None:
    target = tmp_path / "abs-token"
    assert ValueSource.parse(f"file:{target}", Path("/nonexistent")).ref == str(target.resolve())


BAD_SPECS = [
    ("ghp_realsecret123", "literal-value"),
    ("env:", "env-without-name"),
    ("file:", "file-without-path"),
    ("ENV:TOKEN", "kind-is-case-sensitive"),
    ("vault:secret/x", "unknown-kind"),
    ("", "empty"),
]


@pytest.mark.parametrize("spec", [r[0] for r in BAD_SPECS], ids=[r[1] for r in BAD_SPECS])
def test_value_source_parse_refuses_what_is_not_env_or_file(spec: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'env:NAME' or 'file:PATH'"):
        ValueSource.parse(spec, tmp_path)


def test_value_source_parse_does_not_echo_a_literal_secret(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as info:
        ValueSource.parse("ghp_realsecret123", tmp_path)
    assert "ghp_realsecret123" not in str(info.value)


def test_value_source_repr_shows_no_value(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text(VALUE)
    src = ValueSource.parse("file:tok", tmp_path)
    src.current()
    assert VALUE not in repr(src)


# --- env sources ----------------------------------------------------------------------------


def test_env_source_reads_the_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SURROGATE_TEST_TOKEN", VALUE)
    secret, version = ValueSource.parse("env:SURROGATE_TEST_TOKEN", tmp_path).current()
    assert (secret.reveal(), version) == (VALUE, 1)


def test_env_source_is_read_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SURROGATE_TEST_TOKEN", VALUE)
    src = ValueSource.parse("env:SURROGATE_TEST_TOKEN", tmp_path)
    src.current()
    monkeypatch.setenv("SURROGATE_TEST_TOKEN", "changed-later")
    secret, version = src.current()
    assert (secret.reveal(), version) == (VALUE, 1)


def test_env_source_unset_names_the_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SURROGATE_TEST_UNSET_VAR_X", raising=False)
    with pytest.raises(SecretUnavailable, match="SURROGATE_TEST_UNSET_VAR_X is not set"):
        ValueSource.parse("env:SURROGATE_TEST_UNSET_VAR_X", tmp_path).current()


def test_env_source_refuses_control_characters_without_showing_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SURROGATE_TEST_TOKEN", "abc\r\nX-Evil: 1")
    with pytest.raises(SecretUnavailable) as info:
        ValueSource.parse("env:SURROGATE_TEST_TOKEN", tmp_path).current()
    assert "env:SURROGATE_TEST_TOKEN" in str(info.value)
    assert "X-Evil" not in str(info.value)


# --- file sources ---------------------------------------------------------------------------

READ = [
    (VALUE, VALUE, "as-is"),
    (VALUE + "\n", VALUE, "trailing-newline-dropped"),
    (VALUE + "\r\n", VALUE, "trailing-crlf-dropped"),
    ("  spaced value  ", "  spaced value  ", "spaces-kept"),
    ("ünïcode-tökén", "ünïcode-tökén", "utf8"),
]


@pytest.mark.parametrize(("content", "expected"), [r[:2] for r in READ], ids=[r[2] for r in READ])
def test_file_source_reads_the_value(content: str, expected: str, tmp_path: Path) -> None:
    (tmp_path / "tok").write_bytes(content.encode())
    secret, version = ValueSource.parse("file:tok", tmp_path).current()
    assert (secret.reveal(), version) == (expected, 1)


REFUSED = [
    (b"", "is empty", "empty"),
    (b"\n", "is empty", "only-newline"),
    (b"abc\r\nX-Evil: 1", "control character", "crlf-header-injection"),
    (b"abc\nX-Evil: 1\n", "control character", "inner-lf"),
    (b"abc\n\n", "control character", "only-one-trailing-newline-dropped"),
    (b"abc\x00def", "control character", "nul"),
    (b"abc\tdef", "control character", "tab"),
    (b"abc\x7fdef", "control character", "del"),
    (b"abc\rdef", "control character", "lone-cr"),
    (b"\xff\xfeabc", "not UTF-8", "not-utf8"),
]


@pytest.mark.parametrize(("content", "fragment"), [r[:2] for r in REFUSED], ids=[r[2] for r in REFUSED])
def test_file_source_refuses_bad_values_naming_the_source_never_the_value(
    content: bytes, fragment: str, tmp_path: Path
) -> None:
    (tmp_path / "tok").write_bytes(content)
    src = ValueSource.parse("file:tok", tmp_path)
    with pytest.raises(SecretUnavailable, match=fragment) as info:
        src.current()
    message = str(info.value)
    assert src.describe() in message
    for part in (b"abc", b"def", b"X-Evil"):
        if part in content:
            assert part.decode() not in message


def test_file_source_missing_file_names_the_path(tmp_path: Path) -> None:
    src = ValueSource.parse("file:nope", tmp_path)
    with pytest.raises(SecretUnavailable, match="cannot read") as info:
        src.current()
    assert str(tmp_path / "nope") in str(info.value)


def test_file_source_deleted_after_read_is_unavailable_not_cached(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text(VALUE)
    src = ValueSource.parse("file:tok", tmp_path)
    src.current()
    (tmp_path / "tok").unlink()
    with pytest.raises(SecretUnavailable):
        src.current()


def _rewrite(path: Path, content: str) -> None:
    """Replace ``path`` like a rotation does (``mv new PATH``): new inode, new mtime."""
    new = path.with_name(path.name + ".new")
    new.write_text(content)
    os.replace(new, path)


def test_file_source_version_grows_when_the_content_changes(tmp_path: Path) -> None:
    tok = tmp_path / "tok"
    tok.write_text("first-value")
    src = ValueSource.parse("file:tok", tmp_path)
    assert (src.current()[0].reveal(), src.current()[1]) == ("first-value", 1)
    _rewrite(tok, "the-second-longer-value")
    secret, version = src.current()
    assert (secret.reveal(), version) == ("the-second-longer-value", 2)


def test_file_source_version_grows_on_in_place_rewrite(tmp_path: Path) -> None:
    tok = tmp_path / "tok"
    tok.write_text("first-value")
    src = ValueSource.parse("file:tok", tmp_path)
    src.current()
    tok.write_text("rewritten-in-place-longer")
    assert src.current() == (Secret("rewritten-in-place-longer"), 2)


def test_file_source_version_stays_when_the_same_value_is_rewritten(tmp_path: Path) -> None:
    tok = tmp_path / "tok"
    tok.write_text("same-value")
    src = ValueSource.parse("file:tok", tmp_path)
    src.current()
    _rewrite(tok, "same-value\n")  # different stamp (size, inode), same value once read
    assert src.current() == (Secret("same-value"), 1)


def test_file_source_recovers_after_a_refused_rewrite(tmp_path: Path) -> None:
    tok = tmp_path / "tok"
    tok.write_text("good-one")
    src = ValueSource.parse("file:tok", tmp_path)
    src.current()
    _rewrite(tok, "")
    with pytest.raises(SecretUnavailable):
        src.current()
    _rewrite(tok, "good-two-longer")
    assert src.current() == (Secret("good-two-longer"), 2)
