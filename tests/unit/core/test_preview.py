"""The held request's preview (proxy.core.preview): what it shows of the body, one row per case,
never a secret (scrubbed before anything is decided), and cut at the store's bound."""

from __future__ import annotations

import pytest

from proxy.core import preview
from proxy.core.scrub import Scrubber

SECRET = b"CANARYpreview0123456789abcdef"
PH = "surr_PreviewPlaceholder000001"
SCRUB = Scrubber([(SECRET, PH.encode())]).scrub
LINE = "POST /v1/send HTTP/1.1"


@pytest.mark.parametrize(
    ("fields", "body", "undeclared", "tail"),
    [
        ([("Content-Length", "13")], b'{"to": "ops"}', False, '\n\n{"to": "ops"}'),
        ([("Content-Length", "4")], b"a\tb\n", False, "\n\na\tb\n"),
        ([("Content-Length", "3")], b"\x00\x01\x02", False, "\n\n[body: 3 bytes, not text]"),
        ([("Content-Length", "2")], b"\xff\xfe", False, "\n\n[body: 2 bytes, not text]"),
        ([("Content-Length", "1")], b"\x1b", False, "\n\n[body: 1 bytes, not text]"),
        ([("Content-Length", "5"), ("Content-Encoding", "GZIP")], b"\x1f\x8b\x08\x00\x00", False,
         "\n\n[body: 5 bytes, content-encoding gzip]"),
        ([("Content-Length", "1048576")], None, False, "\n\n[body not read: 1048576 bytes]"),
        ([("Transfer-Encoding", "chunked")], None, True, "\n\n[body not read: length not declared]"),
        ([], None, True, "\n\n[body not read: length not declared]"),  # HTTP/2 without a length
        ([], None, False, ""),  # no body
        ([("Content-Length", "0")], None, False, ""),
        ([("Content-Length", "0")], b"", False, ""),
    ],
    ids=["json", "tabs-newlines", "nul", "not-utf8", "escape-char", "gzip", "not-read", "chunked",
         "h2-undeclared", "none", "zero", "empty"],
)  # fmt: skip
def test_the_body_is_shown_or_described(
    fields: list[tuple[str, str]], body: bytes | None, undeclared: bool, tail: str
) -> None:
    got = preview.preview(LINE, fields, body, SCRUB, undeclared=undeclared)
    head = "\n".join([LINE, *(f"{k}: {v}" for k, v in fields)])
    assert got == head + tail


@pytest.mark.parametrize(
    "body",
    [
        b'{"key": "' + SECRET + b'"}',
        b"token=" + SECRET.replace(b"0", b"%30"),  # percent-escaped
        b'{"k": "' + SECRET[:5] + b"\\u0059" + SECRET[6:] + b'"}',  # the Y of CANARY as \u0059
    ],
    ids=["raw", "percent", "json-escape"],
)
def test_a_secret_in_the_head_or_body_becomes_its_placeholder(body: bytes) -> None:
    fields = [("Authorization", f"Bearer {SECRET.decode()}"), ("Content-Length", str(len(body)))]
    got = preview.preview(LINE, fields, body, SCRUB)
    assert SECRET.decode() not in got and f"Bearer {PH}" in got and PH in got.split("\n\n", 1)[1]


def test_a_secret_that_is_not_text_is_still_not_shown() -> None:
    body = b"\x00" + SECRET
    got = preview.preview(LINE, [("Content-Length", str(len(body)))], body, SCRUB)
    assert got.endswith(f"[body: {len(body)} bytes, not text]") and SECRET.decode() not in got


def test_a_long_preview_is_cut_at_the_store_bound() -> None:
    body = b"a" * preview.BODY_BOUND
    got = preview.preview(LINE, [("X-Long", "b" * 10_000), ("Content-Length", str(len(body)))], body, SCRUB)
    assert len(got) == preview.MAX_PREVIEW and got.endswith("\n[… cut]")


@pytest.mark.parametrize(
    ("length", "reads"),
    [("1", True), ("65536", True), ("65537", False), ("0", False), (None, False), ("-1", False),
     ("1e3", False), (" 5", False), ("٣", False)],
)  # fmt: skip
def test_only_a_declared_length_within_the_bound_is_read(length: str | None, reads: bool) -> None:
    assert preview.reads_body(length) is reads
