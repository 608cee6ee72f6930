"""A node's name (proxy.core.node): a short label, or a clear error; one row per kind of name."""

from __future__ import annotations

import pytest

from proxy.core.node import MAX_LENGTH, node_name

GOOD = [
    ("vm", "a host name"),
    ("n1", "letters and digits"),
    ("A", "one character"),
    ("node-a", "a dash inside"),
    ("ip-10-0-1-23.ec2.internal", "an EKS node name (dots)"),
    ("aks-pool1-12345678-vmss000000", "an AKS node name"),
    ("gke-c-default-pool-1a2b3c4d-x9z8", "a GKE node name"),
    ("under_score", "an underscore inside"),
    ("x" * MAX_LENGTH, "the longest"),
]

BAD = [
    ("", "empty"),
    ("x" * (MAX_LENGTH + 1), "one past the longest"),
    ("-a", "leading dash"),
    ("a-", "trailing dash"),
    (".a", "leading dot"),
    ("a.", "trailing dot"),
    ("_a", "leading underscore"),
    ("node a", "a space"),
    ("node/a", "a slash"),
    ("node:a", "a colon"),
    ('node"a', "a quote (JSON, Prometheus label)"),
    ("node\na", "a line feed inside"),
    ("nodea\n", "a trailing line feed"),
    ("node\ta", "a tab"),
    ("nöde", "a non-ASCII letter"),
    ("node\u0430", "a Cyrillic look-alike"),
    ("node{a}", "braces"),
    ("node\x00", "NUL"),
]


@pytest.mark.parametrize("name", [g[0] for g in GOOD], ids=[g[1] for g in GOOD])
def test_a_short_label_is_a_node_name(name: str) -> None:
    assert node_name(name) == name


@pytest.mark.parametrize("name", [b[0] for b in BAD], ids=[b[1] for b in BAD])
def test_anything_else_is_refused_with_a_sentence_saying_what_a_name_may_hold(name: str) -> None:
    with pytest.raises(ValueError, match="is not a node name: use 1 to 63 ASCII letters") as e:
        node_name(name)
    assert repr(name) in str(e.value)  # quoted with repr: control characters escaped
    assert "\n" not in str(e.value) and "\x00" not in str(e.value)
