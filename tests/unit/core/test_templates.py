"""proxy.core.templates: provider-shaped placeholders, recognised by the one scanner
(proxy.core.placeholders), carrying surrogate's checksum (and GitHub's CRC32 where GitHub has one);
streamed uploads and scrubbed responses handle them across read boundaries; forged ones are
refused and real-looking unregistered tokens stay inert."""

from __future__ import annotations

import ast
import base64
import re
import secrets
import string
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import audit
from proxy.core import bodies, forgery, placeholders, spellings, templates
from proxy.core.scrub import Scrubber

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = list(templates.SHIPPED.values())
IDS = [t.name for t in SHIPPED]
_GH62 = string.digits + string.ascii_uppercase + string.ascii_lowercase


def github_crc(body30: str) -> str:
    """GitHub's checksum, written independently of the module: CRC32 of the 30 characters after
    the prefix, base62 in 0-9A-Za-z order, zero-padded to 6 (GitHub's token-format post)."""
    n, out = zlib.crc32(body30.encode()), ""
    while n:
        n, d = divmod(n, 62)
        out = _GH62[d] + out
    return out.rjust(6, "0")


def other_char(c: str, alphabet: str) -> str:
    return alphabet[(alphabet.index(c) + 1) % len(alphabet)]


# -- every shipped template: minted, recognised, checksums valid ------------------------------


@pytest.mark.parametrize("t", SHIPPED, ids=IDS)
def test_a_minted_placeholder_is_of_its_template_and_recognised_by_the_one_scanner(
    t: templates.Template,
) -> None:
    ph = templates.mint(t)
    assert ph.startswith(t.prefix) and len(ph) == t.total
    assert set(ph[len(t.prefix) :]) <= set(t.alphabet)
    assert placeholders.is_placeholder(ph)
    assert placeholders.template_of(ph) is t
    assert placeholders.has_valid_checksum(ph)
    assert placeholders.describe(ph).startswith(f"template {t.name} ")
    # found whole wherever it stands: a header value, JSON, a query, the end of a body
    for text in (f"Bearer {ph}", f'{{"k":"{ph}"}}', f"/x?key={ph}&a=1", ph):
        assert [m.group() for m in placeholders.find(text.encode())] == [ph.encode()]


GITHUB = [t for t in SHIPPED if t.github_crc32]


@pytest.mark.parametrize("t", GITHUB, ids=[t.name for t in GITHUB])
def test_a_minted_github_placeholder_keeps_githubs_crc32_valid(t: templates.Template) -> None:
    for _ in range(20):
        ph = templates.mint(t)
        body = ph[len(t.prefix) :]
        assert len(body) == 36
        assert github_crc(body[:30]) == body[30:]
        assert templates.github_checksum_ok(ph, t)


@pytest.mark.parametrize("t", SHIPPED, ids=IDS)
def test_one_character_changed_is_no_longer_surrogates(t: templates.Template) -> None:
    """Every single-character change after the prefix breaks a checksum (surrogate's, or
    GitHub's for its CRC characters): registered nowhere, the string is then inert."""
    ph = templates.mint(t)
    for i in range(len(t.prefix), t.total):
        changed = ph[:i] + other_char(ph[i], t.alphabet) + ph[i + 1 :]
        assert placeholders.is_placeholder(changed), i  # still the shape...
        assert not placeholders.has_valid_checksum(changed), i  # ...but not one surrogate minted
        assert forgery.find_forged([(b"X-Key", changed.encode())], b"/", set()) == [], i


@pytest.mark.parametrize("t", SHIPPED, ids=IDS)
def test_near_shapes_are_not_placeholders(t: templates.Template) -> None:
    ph = templates.mint(t)
    for near in (ph[:-1], ph[:-1] + "-", ph + "A", ph + "0"):
        assert placeholders.template_of(near) is None, near
        assert not placeholders.has_valid_checksum(near), near
        assert ph.encode() not in [m.group() for m in placeholders.find(near.encode())]


def test_an_unregistered_real_looking_github_token_is_inert() -> None:
    """A random ``ghp_`` with GitHub's valid CRC32 (a real token's shape) has no surrogate
    checksum: no forgery, nothing to swap; it goes upstream as sent."""
    t = templates.SHIPPED["github_classic"]
    for _ in range(50):
        body = "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(30))
        token = "ghp_" + body + github_crc(body)
        assert placeholders.is_placeholder(token) and placeholders.template_of(token) is t
        assert templates.github_checksum_ok(token, t)
        assert not placeholders.has_valid_checksum(token)
        fields = [(b"Authorization", f"token {token}".encode())]
        assert forgery.find_forged(fields, f"/q?t={token}".encode(), set()) == []


def test_a_surrogate_checksum_without_githubs_crc_is_not_surrogates() -> None:
    """Every minted GitHub placeholder has both checksums: one with only surrogate's is forged by
    hand and is inert."""
    t = templates.SHIPPED["github_classic"]
    ph = templates.mint(t)
    bad = ph[:-6] + ("000000" if ph[-6:] != "000000" else "000001")
    assert not placeholders.has_valid_checksum(bad)


# -- forged template placeholders -------------------------------------------------------------


def _forged(t: templates.Template) -> str:
    """A string of ``t``'s shape with valid checksums that nobody registered."""
    return templates.mint(t)


FORGED_PLACES = [
    (lambda p: ([(b"Authorization", f"Bearer {p}".encode())], b"/"), ["header Authorization"], "bearer"),
    (lambda p: ([(b"x-api-key", p.encode())], b"/"), ["header x-api-key"], "api-key"),
    (
        lambda p: ([(b"Authorization", b"Basic " + base64.b64encode(f"x:{p}".encode()))], b"/"),
        ["header Authorization"],
        "basic",
    ),
    (lambda p: ([], f"/v1?key={p}".encode()), ["request target"], "query"),
    (
        lambda p: ([], "/v1?key={}".format(p.replace("_", "%5F").replace("-", "%2D")).encode()),
        ["request target"],
        "percent-encoded",
    ),
    (lambda p: ([(b"X-Trace", base64.b64encode(b"k:" + p.encode()))], b"/"), ["header X-Trace"], "base64"),
    (lambda p: ([(p.encode(), b"1")], b"/"), ["a header name"], "header-name"),
]


@pytest.mark.parametrize("t", SHIPPED, ids=IDS)
@pytest.mark.parametrize(
    ("build", "places"), [r[:2] for r in FORGED_PLACES], ids=[r[2] for r in FORGED_PLACES]
)
def test_a_forged_template_placeholder_is_found_where_substitution_looks(
    t: templates.Template, build: object, places: list[str]
) -> None:
    forged, mine = _forged(t), templates.mint(t)
    fields, target = build(forged)  # type: ignore[operator]
    assert forgery.find_forged(fields, target, {mine.encode()}) == places
    # the same place holding the claim's own placeholder is not forged
    fields, target = build(mine)  # type: ignore[operator]
    assert forgery.find_forged(fields, target, {mine.encode()}) == []


@pytest.mark.parametrize("t", SHIPPED, ids=IDS)
def test_the_spellings_scan_finds_a_registered_template_placeholder(t: templates.Template) -> None:
    ph = templates.mint(t).encode()
    for spelled in (base64.b64encode(b"u:" + ph), base64.urlsafe_b64encode(ph), ph.replace(b"_", b"%5F")):
        assert spellings.hidden(spelled, {ph}) == [ph], spelled


# -- streaming: a template placeholder split across two reads ---------------------------------


def _swap_in_two(body: bytes, cut: int, table: dict[bytes, bytes]) -> bytes:
    s = bodies.Swapper(table.get)
    return s.feed(body[:cut]) + s.feed(body[cut:]) + s.finish()


def test_the_hold_back_covers_the_longest_template() -> None:
    assert max(t.total for t in SHIPPED) <= bodies.HOLD


@pytest.mark.parametrize("t", SHIPPED, ids=IDS)
def test_an_upload_split_anywhere_in_a_template_placeholder_is_swapped_exactly(t: templates.Template) -> None:
    ph = templates.mint(t).encode()
    secret = b"<real-" + t.name.encode() + b"-secret>"
    body = b'{"note":"' + t.prefix.encode() + b'short","key":"' + ph + b'","tail":"' + b"z" * 40 + b'"}'
    expected = body.replace(ph, secret)
    assert expected != body
    for cut in range(len(body) + 1):
        assert _swap_in_two(body, cut, {ph: secret}) == expected, cut


@pytest.mark.parametrize("t", SHIPPED, ids=IDS)
def test_a_response_split_anywhere_in_a_secret_is_scrubbed_to_the_template_placeholder(
    t: templates.Template,
) -> None:
    ph = templates.mint(t).encode()
    secret = b"real-secret-" + t.name.encode() + b"-0123456789abcdef"
    body = b'{"echo":"' + secret + b'","len":' + str(len(secret)).encode() + b"}"
    expected = body.replace(secret, ph)
    for cut in range(len(body) + 1):
        s = Scrubber([(secret, ph)])
        assert s.feed(body[:cut]) + s.feed(body[cut:]) + s.finish() == expected, cut


# -- the audit hides template placeholders like surr_ ones -------------------------------------


@pytest.mark.parametrize("t", SHIPPED, ids=IDS)
def test_the_audit_hides_a_template_placeholder_in_a_sandbox_chosen_field(t: templates.Template) -> None:
    ph = templates.mint(t)
    fields: dict[str, object] = {audit.HOST: f"{ph.lower()}.example", audit.MESSAGE: f"bad {ph}"}
    audit.hide_placeholders(fields)
    assert ph.lower() not in str(fields[audit.HOST]) and ph not in str(fields[audit.MESSAGE])


# -- ONE recogniser ---------------------------------------------------------------------------

_OWNERS = {ROOT / "proxy" / "core" / "placeholders.py", ROOT / "proxy" / "core" / "templates.py"}
# a regex quantifier of a placeholder's run: surr_'s 16..64, or a template's fixed length
_LENGTHS = "|".join(sorted({str(t.length) for t in SHIPPED}))
_RUN = re.compile(r"\{16,(?:64)?\}|\{(?:" + _LENGTHS + r")\}")
# (file, constant): why it is no recogniser
_NOT_RECOGNISERS = {
    ("proxy/cli/admin.py", "ghp_demo"): "the demo's fake GitHub secret value, not a placeholder",
    ("proxy/control/approvalroutes.py", "^[A-Za-z0-9_-]{16,64}$"): "approval ids",
    ("proxy/control/ui.py", "^[A-Za-z0-9_-]{16,64}$"): "approval ids",
    ("proxy/control/kinds.py", "^[A-Za-z0-9_-]{16,200}$"): "the same bound, for aws_sigv4 placeholders",
    ("proxy/control/models.py", "^[A-Za-z0-9_-]{16,200}$"): (
        "a length and alphabet bound for pydantic; the shape is checked by check_placeholder"
    ),
}


def _constants(tree: ast.AST) -> list[tuple[int, str]]:
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
            if id(node) in docstrings:
                continue
            text = node.value if isinstance(node.value, str) else node.value.decode("latin-1")
            out.append((node.lineno, text))
    return out


def test_there_is_one_placeholder_recogniser() -> None:
    """No module of proxy/ or addons/ but proxy.core.placeholders (and the template table it
    compiles) holds a placeholder prefix or a placeholder-run quantifier in code: every
    recogniser goes through placeholders.find / PATTERN / is_placeholder / LIKE / PREFIXES."""
    prefixes = placeholders.PREFIXES
    offenders = []
    files = sorted([*(ROOT / "proxy").rglob("*.py"), *(ROOT / "addons").rglob("*.py")])
    assert len(files) > 50
    for path in files:
        if path in _OWNERS:
            continue
        for line, text in _constants(ast.parse(path.read_text(), str(path))):
            hit = [p for p in prefixes if p in text] or ([text] if _RUN.search(text) else [])
            if hit and (str(path.relative_to(ROOT)), text) not in _NOT_RECOGNISERS:
                offenders.append(f"{path.relative_to(ROOT)}:{line}: {hit[0]!r}")
    assert offenders == []


def test_the_scanner_is_one_alternation_bounded_by_the_templates() -> None:
    """One compiled pattern holds surr_ and every template shape; it is built from the shipped
    table (at most MAX_TEMPLATES shapes), never from credentials."""
    assert len(SHIPPED) <= templates.MAX_TEMPLATES
    assert placeholders.PATTERN.pattern.count("|") == len(SHIPPED)
    assert placeholders.PATTERN_BYTES.pattern == placeholders.PATTERN.pattern.encode()
    assert set(placeholders.PREFIXES) == {"surr_", *(t.prefix for t in SHIPPED)}


# -- find() is PATTERN_BYTES.finditer, family by family ----------------------------------------

_PIECES = [
    *(t.prefix.encode() for t in SHIPPED),
    b"surr_",
    b"sk",
    b"gh",
    b"AKIA",
    b"-",
    b"_",
    b" ",
    b"A" * 14,
    b"z9" * 8,
    b"Q" * 30,
    b"B1" * 24,
    b"7" * 36,
]


def _matches(ms: list[re.Match[bytes]]) -> list[tuple[int, int]]:
    return [m.span() for m in ms]


@given(
    st.lists(
        st.one_of(
            st.sampled_from(_PIECES),
            st.sampled_from(SHIPPED).map(lambda t: templates.mint(t).encode()),
            st.binary(max_size=8),
        ),
        max_size=30,
    )
)
@settings(max_examples=400, deadline=None)
def test_find_is_exactly_the_one_patterns_matches(pieces: list[bytes]) -> None:
    value = b"".join(pieces)
    assert _matches(placeholders.find(value)) == _matches(list(placeholders.PATTERN_BYTES.finditer(value)))


def test_find_looks_again_inside_a_match_another_family_cut_short() -> None:
    """``surr_…sk`` ends where ``sk-`` begins: the first ``sk-`` run is cut by the surr_ match,
    and a second ``sk-`` starting inside that run is the next match (as PATTERN_BYTES finds)."""
    value = b"surr_" + b"A" * 14 + b"sk-" + b"B" * 46 + b"sk-" + b"C" * 48 + b" "
    want = _matches(list(placeholders.PATTERN_BYTES.finditer(value)))
    assert len(want) == 2
    assert _matches(placeholders.find(value)) == want
