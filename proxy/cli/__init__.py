"""The ``surrogate`` command (also ``python -m proxy``).

:mod:`proxy.cli.main` parses the arguments and runs a command, found in its group's module:
:mod:`proxy.cli.serve` (``run``, ``control``, the start-up banner), :mod:`proxy.cli.sandbox`
(``env``, ``ca``, ``transparent-rules``), :mod:`proxy.cli.offline` (``rules check|explain``,
``audit why|verify``), :mod:`proxy.cli.admin` (``keys``, ``demo``); :mod:`proxy.cli.options`
holds the option types they share. :mod:`proxy.cli.explain` answers ``rules explain`` and
:mod:`proxy.cli.why` ``audit why``, both from the pieces in :mod:`proxy.cli.dryrun`;
:mod:`proxy.cli.verify` checks the audit's hash chain; :mod:`proxy.cli.provision` renders
``surrogate env``. May import every layer.

``proxy.cli:main`` (the entry point of earlier releases) still works (forwarded to
:mod:`proxy.cli.main`).
"""

from proxy._moved import forward

__getattr__ = forward("proxy.cli.main")
