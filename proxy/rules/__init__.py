"""Rules files: the operators' YAML, loaded into the core's policy model.

:mod:`proxy.rules.loader` reads and validates a rules file (every problem with its file, line,
field and what would be right), from its parts: :mod:`~proxy.rules.models` (the YAML's shape),
:mod:`~proxy.rules.marks` (where each problem is), :mod:`~proxy.rules.pools` and
:mod:`~proxy.rules.claims` (the builders), :mod:`~proxy.rules.risks` (risky hosts, warnings);
:mod:`proxy.rules.sources` reads the ``env:``/``file:`` value
sources a rules file names. May import: :mod:`proxy.core`.

``from proxy.rules import load`` and the other names of the flat ``proxy.rules`` module of
earlier releases still work (forwarded to :mod:`proxy.rules.loader`).
"""

from proxy._moved import forward

__getattr__ = forward("proxy.rules.loader")
