"""A node's name: which surrogate process of a fleet wrote an audit event or serves a ``/metrics``.

``surrogate run --node NAME`` (and ``surrogate control --node NAME``) name the node; the default
is the machine's host name. Every audit event carries it as ``node`` (:mod:`proxy.audit`), and
``/metrics`` says it once, as ``surrogate_node_info{node="NAME"} 1`` (the Prometheus "info"
idiom: a label on every series would multiply them, and a scraper adds its own target labels).

Decided: a name is a short label, 1 to 63 characters of ASCII letters, digits, ``.``, ``_`` and
``-``, beginning and ending with a letter or digit. That holds every host name label (RFC 1123
§2.1) and the node names Kubernetes clouds give (``ip-10-0-1-23.ec2.internal``,
``aks-pool1-12345678-vmss000000``; a DaemonSet passes ``spec.nodeName``), and keeps the name safe
in a JSON line, a Prometheus label and a log line without quoting. A longer host name has to be
named with ``--node``; nothing is truncated or rewritten, so two nodes never end up sharing a
name by accident.
"""

from __future__ import annotations

import re

MAX_LENGTH = 63
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")


def node_name(text: str) -> str:
    """``text`` itself when it is a valid node name; raises ValueError with a sentence that says
    what a node name may hold (the value is quoted with ``repr``: control characters escaped)."""
    if _NAME.fullmatch(text) is None:
        raise ValueError(
            f"{text!r} is not a node name: use 1 to {MAX_LENGTH} ASCII letters, digits, '.', '_' "
            "or '-', beginning and ending with a letter or digit"
        )
    return text
