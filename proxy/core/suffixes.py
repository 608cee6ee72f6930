"""Host names that look safe and are not (issue 13): public and shared-tenant suffixes,
confusable IDN labels, IP literals and internal names. Pure lookups over bundled data.

**Public and shared-tenant suffixes** come from the Public Suffix List, through the maintained
``publicsuffixlist`` package and the snapshot it bundles (both sections: ICANN, such as ``com``
and ``co.uk``, and private, where a company lets strangers register names: ``herokuapp.com``,
``googleapis.com``, ``lambda-url.<region>.on.aws``). A wildcard ``*.S`` spans owners when S is
a public suffix (``*.com``, ``*.herokuapp.com``, ``*.googleapis.com``) or when a public suffix
lies beneath S (``*.on.aws`` covers ``lambda-url.us-east-1.on.aws``, whose names are anyone's
Lambda functions): :func:`wildcard_risk`. ``googleapis.com`` is in the list's private section
(Google lists it there); had it not been, ``*.googleapis.com`` would still span Google's
services, which a credential for one of them should not: list the API hosts one by one.

**Confusable labels** (UTS #39 §5.2 and §4): an IDN label mixing scripts beyond the "highly
restrictive" sets (one script; Latin with Han and Hiragana/Katakana, Bopomofo or Hangul), or
written wholly in another script with every letter a homoglyph of a Latin one (Cyrillic
``аррӏе``), or in Latin alone with every non-ASCII letter a homoglyph of an ASCII one
(``ɡoogle``: U+0261), using the ``confusable-homoglyphs`` package's Unicode data:
:func:`confusable`.

**IP literals and internal names** (:func:`internal`): an address, a single-label name, a name
under a top-level domain the ICANN section does not hold (``.internal``, ``.local``, ``.lan``,
``.corp``, ``localhost``), or under ``home.arpa`` (RFC 8375). Names under ``test`` and
``example`` (RFC 6761 §6.2, §6.5), the names of test set-ups, are not reported.
"""

from __future__ import annotations

import functools
import ipaddress

import idna
from confusable_homoglyphs import categories, confusables  # type: ignore[import-untyped]
from publicsuffixlist import PSLFILE, PublicSuffixList, encode_idn

_PSL = PublicSuffixList()  # both sections; an unknown top-level domain counts as public
_ICANN = PublicSuffixList(only_icann=True, accept_unknown=False)
_TEST_TLDS = frozenset({"test", "example"})  # RFC 6761
_SPECIAL = ("home.arpa",)  # RFC 8375: a home network's names, under an ICANN TLD


def _names_above_a_suffix() -> dict[str, str]:
    """Every name with a public suffix strictly beneath it → one such suffix (the snapshot's
    rules, wildcards and exceptions reduced to the names they sit under)."""
    above: dict[str, str] = {}
    with open(PSLFILE, encoding="utf-8") as f:
        for line in f:
            rule = line.strip().split(" ")[0].lower()
            if not rule or rule.startswith(("//", "!")):
                continue
            rule = rule.removeprefix("*.")
            try:
                rule = encode_idn(rule) if not rule.isascii() else rule
            except UnicodeError:
                continue
            labels = rule.split(".")
            for i in range(1, len(labels)):
                above.setdefault(".".join(labels[i:]), rule)
    return above


_ABOVE = _names_above_a_suffix()


@functools.lru_cache(maxsize=1024)
def wildcard_risk(suffix: str) -> str | None:
    """For ``*.suffix`` (canonical): why its names may belong to different owners, or None."""
    if _PSL.is_public(suffix) or _PSL.privatesuffix(suffix) is None:
        return f"{suffix} is a public suffix (Public Suffix List): names under it belong to different owners"
    below = _ABOVE.get(suffix)
    if below is not None:
        return (
            f"*.{suffix} covers {below}, a public suffix (Public Suffix List): names there belong "
            "to different owners"
        )
    return None


# UTS #39 §5.2 "highly restrictive": one script, or Latin with one of these CJK sets
_CJK_SETS = (
    frozenset({"LATIN", "HAN", "HIRAGANA", "KATAKANA"}),
    frozenset({"LATIN", "HAN", "BOPOMOFO"}),
    frozenset({"LATIN", "HAN", "HANGUL"}),
)


@functools.lru_cache(maxsize=1024)
def confusable(host: str) -> str | None:
    """For a canonical (A-label) host: why one of its labels may pass for another name, or None.
    The labels of its public suffix (``рф``, chosen by ICANN or the suffix's owner) are not
    judged, only the ones an owner chose."""
    labels = host.split(".")
    suffix = _PSL.publicsuffix(host) or ""
    owned = labels[: len(labels) - (suffix.count(".") + 1 if suffix else 0)]
    for label in owned:
        if not label.startswith("xn--"):
            continue
        try:
            text = idna.decode(label)
        except idna.IDNAError:
            return f"label {label} is not a valid IDN"
        scripts = set(categories.unique_aliases(text)) - {"COMMON", "INHERITED"}
        if len(scripts) > 1 and not any(scripts <= s for s in _CJK_SETS):
            return f"label {label} ({text}) mixes scripts: {', '.join(sorted(s.title() for s in scripts))}"
        if scripts and scripts != {"LATIN"}:
            found = confusables.is_confusable(text, greedy=True, preferred_aliases=["latin"]) or []
            alike = {f["character"] for f in found}
            letters = {c for c in text if categories.alias(c) not in ("COMMON", "INHERITED")}
            if letters and letters <= alike:
                return f"label {label} ({text}) is written wholly in letters that look Latin"
        elif (ascii_name := _reads_as_ascii(text)) is not None:
            return (
                f"label {label} ({text}) reads as {ascii_name}: its non-ASCII letters look Latin "
                "(ASCII) but are other letters"
            )
    return None


def _reads_as_ascii(text: str) -> str | None:
    """For a one-script Latin label: the ASCII name it passes for when every non-ASCII letter
    in it is a homoglyph of one ASCII letter (UTS #39 §4 confusables: ``ɡ`` U+0261 for ``g``,
    ``ɑ`` U+0251 for ``a``, dotless ``ı`` for ``i``), else None. A letter with a diacritic
    (``ü``, ``é``) has no ASCII homoglyph, so ``münchen`` is not one."""
    out = []
    for c in text:
        if c.isascii() or categories.alias(c) in ("COMMON", "INHERITED"):
            out.append(c)
            continue
        found = confusables.is_confusable(c, greedy=True) or []
        glyphs = [h["c"] for f in found for h in f["homoglyphs"]]
        ascii_alike = [g for g in glyphs if len(g) == 1 and g.isascii()]
        if not ascii_alike:
            return None
        out.append(ascii_alike[0].lower())
    name = "".join(out)
    return None if name == text else name


def internal(host: str) -> str | None:
    """For a canonical host (or a wildcard's suffix): why it is not a public DNS name, or None."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return f"{host} is an IP address: which server answers there can change, and no name is checked"
    tld = host.rsplit(".", 1)[-1]
    if tld in _TEST_TLDS:
        return None
    if "." not in host:
        return f"{host} is a single-label name: it resolves only on a local network"
    if any(host == s or host.endswith("." + s) for s in _SPECIAL) or _ICANN.publicsuffix(host) is None:
        return f"{host} is an internal name (not under a public top-level domain)"
    return None
