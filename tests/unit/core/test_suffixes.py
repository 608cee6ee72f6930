"""proxy.core.suffixes: which host names look safe and are not, one row per reason (issue 13 class 9)."""

from __future__ import annotations

import pytest

from proxy.core.hosts import HostPattern, canonical_host
from proxy.core.suffixes import confusable, internal, wildcard_risk
from proxy.rules.loader import credential_host_risk


@pytest.mark.parametrize(
    ("suffix", "says"),
    [
        ("com", "com is a public suffix"),
        ("co.uk", "co.uk is a public suffix"),
        ("herokuapp.com", "herokuapp.com is a public suffix"),  # PSL private section
        ("googleapis.com", "googleapis.com is a public suffix"),
        ("githubusercontent.com", "is a public suffix"),
        ("on.aws", "*.on.aws covers"),  # lambda-url.<region>.on.aws beneath it
        ("amazonaws.com", "*.amazonaws.com covers"),
        ("s3.amazonaws.com", "is a public suffix"),
        ("nosuchtld", "is a public suffix"),  # unknown top-level domains count as public
        ("github.com", None),
        ("example.com", None),
        ("api.github.com", None),
        ("app.herokuapp.com", None),  # one tenant's own names
        ("example.test", None),
    ],
)
def test_which_wildcards_span_owners(suffix: str, says: str | None) -> None:
    got = wildcard_risk(suffix)
    assert (got is None) if says is None else (got is not None and says in got)


@pytest.mark.parametrize(
    ("host", "says"),
    [
        ("аpi.github.com", "mixes scripts: Cyrillic, Latin"),
        ("gіthub.com", "mixes scripts"),
        ("раураl.com", "mixes scripts"),
        ("аррӏе.com", "look Latin"),
        ("сосо.example", "look Latin"),
        ("api.github.com", None),
        ("bücher.de", None),  # Latin with a diacritic: one script
        ("例え.jp", None),  # Han with Hiragana: allowed together (UTS #39 highly restrictive)
        ("пример.рф", None),  # Cyrillic, not every letter a Latin look-alike; the TLD is not judged
        # hostile review (r1): one script (Latin), every non-ASCII letter an ASCII look-alike
        ("\u0261oogle.com", "reads as google"),  # LATIN SMALL LETTER SCRIPT G
        ("\u0251pple.com", "reads as apple"),  # LATIN SMALL LETTER ALPHA
        ("l\u0131nkedin.com", "reads as linkedin"),  # LATIN SMALL LETTER DOTLESS I
        ("api.\u0261ithub.com", "reads as github"),
        ("caf\u00e9.fr", None),  # a diacritic is not an ASCII look-alike
        ("m\u00fcnchen.de", None),
        ("\u0131\u015f\u0131k.com.tr", None),  # Turkish: not every non-ASCII letter a look-alike
    ],
)
def test_which_idn_labels_are_confusable(host: str, says: str | None) -> None:
    got = confusable(canonical_host(host))
    assert (got is None) if says is None else (got is not None and says in got)


@pytest.mark.parametrize(
    ("host", "says"),
    [
        ("10.0.0.5", "IP address"),
        ("::1", "IP address"),
        ("127.1", "IP address"),  # canonicalised to 127.0.0.1
        ("localhost", "single-label"),
        ("intranet", "single-label"),
        ("vault.internal", "internal name"),
        ("nas.local", "internal name"),
        ("printer.home.arpa", "internal name"),
        ("git.corp", "internal name"),
        ("api.github.com", None),
        ("api.test", None),  # RFC 6761 test names: not reported
        ("www.example", None),
    ],
)
def test_which_names_are_internal(host: str, says: str | None) -> None:
    got = internal(canonical_host(host))
    assert (got is None) if says is None else (got is not None and says in got)


@pytest.mark.parametrize(
    ("pattern", "risky"),
    [("*.com", True), ("*.on.aws", True), ("аpi.github.com", True), ("*.github.com", False), ("*", True)],
)
def test_credential_host_risk(pattern: str, risky: bool) -> None:
    assert (credential_host_risk(HostPattern.parse(pattern)) is not None) is risky
