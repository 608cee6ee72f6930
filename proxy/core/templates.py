"""Placeholder templates: placeholders shaped like a provider's own tokens, for SDKs and CLIs that
check a token's format before sending it (issue 15, "Format-valid placeholders").

Pure (no I/O). A template is a fixed prefix and a fixed number of characters of one alphabet.
A placeholder minted from it (:func:`mint`) is ``prefix`` + random characters + 6 characters of
surrogate's checksum (BLAKE2b-64 of everything before them, written in the template's own
alphabet: :func:`checksum_in`), so a forged one is still detected
(:mod:`proxy.core.forgery`). Where the provider has a checksum of its own, it stays valid:
GitHub's tokens end in 6 base62 characters (``0-9A-Za-z``, zero-padded) of the CRC32 of the
characters between the prefix and them, and a minted GitHub placeholder puts surrogate's checksum
just before that one.

Shipped templates (:data:`SHIPPED`), each with its source. Only shapes are copied, never a real
token; every shipped alphabet is a subset of ASCII letters and digits, so a placeholder needs no
escaping in a header, a URL, JSON or a form and ends where a run of letters and digits ends.

The scanner (:mod:`proxy.core.placeholders`) recognises these shapes and ``surr_`` in one compiled
alternation built once at import: its cost grows with the number of shipped templates
(bounded by :data:`MAX_TEMPLATES`), never with the number of credentials. Inline templates in a
rules file are not offered (decision): a shape the scanner does not know would have to be
compiled per rules load in every worker; a new provider shape is a one-line addition here.
"""

from __future__ import annotations

import binascii
import hashlib
import secrets
import string
from dataclasses import dataclass

BASE62 = string.ascii_letters + string.digits  # surrogate's own order (placeholders.checksum)
_GH62 = string.digits + string.ascii_uppercase + string.ascii_lowercase  # GitHub's base62 order
UPPER36 = string.ascii_uppercase + string.digits
CHECKSUM_LENGTH = 6
MAX_TEMPLATES = 32  # bound on the scanner's alternation


@dataclass(frozen=True)
class Template:
    """``prefix`` + ``length`` characters of ``alphabet``; ``github_crc32``: the last 6 are
    GitHub's CRC32 checksum; ``source``: where the shape is documented."""

    name: str
    prefix: str
    length: int
    alphabet: str
    source: str
    github_crc32: bool = False

    @property
    def total(self) -> int:
        return len(self.prefix) + self.length

    def describe(self) -> str:
        """``ghp_ + 36 of [A-Za-z0-9]`` (no value involved)."""
        cls = "[A-Z0-9]" if self.alphabet == UPPER36 else "[A-Za-z0-9]"
        return f"{self.prefix} + {self.length} of {cls}"


_GH = "https://github.blog/engineering/platform-security/behind-githubs-new-authentication-token-formats/"
_GH_PAT = "https://github.blog/security/application-security/introducing-fine-grained-personal-access-tokens-for-github/"
SHIPPED: dict[str, Template] = {
    t.name: t
    for t in (
        Template(
            "anthropic", "sk-ant-api03-", 95, BASE62,
            "Anthropic Console API keys (sk-ant-api03- prefix, as the Console shows them; the "
            "length is the observed one, the SDK checks no format)",
        ),
        Template(
            "openai", "sk-proj-", 156, BASE62,
            "OpenAI project API keys (https://platform.openai.com/docs/api-reference/authentication; "
            "prefix and observed length)",
        ),
        Template(
            "openai_legacy", "sk-", 48, BASE62,
            "OpenAI user API keys before project keys (sk- + 48, observed)",
        ),
        Template("github_classic", "ghp_", 36, BASE62, _GH, github_crc32=True),
        Template("github_oauth", "gho_", 36, BASE62, _GH, github_crc32=True),
        Template("github_user_to_server", "ghu_", 36, BASE62, _GH, github_crc32=True),
        Template("github_server_to_server", "ghs_", 36, BASE62, _GH, github_crc32=True),
        Template("github_refresh", "ghr_", 36, BASE62, _GH, github_crc32=True),
        Template(
            "github_fine_grained", "github_pat_", 82, BASE62,
            _GH_PAT + " (github_pat_ + 82; minted ones hold no inner '_')",
        ),
        Template(
            "slack_bot", "xoxb-", 50, BASE62,
            "https://api.slack.com/authentication/token-types (xoxb- prefix; minted ones hold "
            "no inner '-')",
        ),
        Template(
            "aws_access_key_id", "AKIA", 16, UPPER36,
            "https://docs.aws.amazon.com/IAM/latest/UserGuide/"
            "reference_identifiers.html#identifiers-unique-ids "
            "(AKIA = long-term access key id; 20 characters)",
        ),
        Template(
            "stripe_test", "sk_test_", 99, BASE62,
            "https://docs.stripe.com/keys (secret keys sk_test_/sk_live_; observed length)",
        ),
        Template("stripe_live", "sk_live_", 99, BASE62, "https://docs.stripe.com/keys"),
    )
}
assert len(SHIPPED) <= MAX_TEMPLATES  # noqa: S101 - an import-time bound on the scanner


def _github_crc32(body: str) -> str:
    n = binascii.crc32(body.encode("ascii"))
    out = []
    for _ in range(CHECKSUM_LENGTH):
        n, d = divmod(n, 62)
        out.append(_GH62[d])
    return "".join(reversed(out))


def checksum_in(stem: str, alphabet: str) -> str:
    """``CHECKSUM_LENGTH`` characters of ``alphabet``: BLAKE2b-64 of ``stem`` modulo
    len(alphabet)**6, most significant first."""
    digest = hashlib.blake2b(stem.encode("ascii"), digest_size=8).digest()
    n = int.from_bytes(digest, "big") % len(alphabet) ** CHECKSUM_LENGTH
    out = []
    for _ in range(CHECKSUM_LENGTH):
        n, d = divmod(n, len(alphabet))
        out.append(alphabet[d])
    return "".join(reversed(out))


def github_checksum_ok(text: str, template: Template) -> bool:
    """True when ``text`` (of ``template``'s shape) ends in a valid GitHub CRC32 checksum."""
    body = text[len(template.prefix) :]
    return _github_crc32(body[:-CHECKSUM_LENGTH]) == body[-CHECKSUM_LENGTH:]


def checksum_span(template: Template) -> tuple[int, int]:
    """Where surrogate's checksum stands in a placeholder of ``template`` (start, end)."""
    end = template.total - (CHECKSUM_LENGTH if template.github_crc32 else 0)
    return end - CHECKSUM_LENGTH, end


def get(name: str) -> Template:
    """The shipped template ``name``. Raises KeyError naming the known ones."""
    try:
        return SHIPPED[name]
    except KeyError:
        raise KeyError(f"unknown placeholder template {name!r}; known: {', '.join(SHIPPED)}") from None


def mint(template: Template) -> str:
    """A fresh placeholder of ``template``: random, then surrogate's checksum (then GitHub's)."""
    start, _ = checksum_span(template)
    stem = template.prefix + "".join(
        secrets.choice(template.alphabet) for _ in range(start - len(template.prefix))
    )
    text = stem + checksum_in(stem, template.alphabet)
    if template.github_crc32:
        text += _github_crc32(text[len(template.prefix) :])
    return text
