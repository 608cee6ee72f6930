"""The ``surrogate`` command (also ``python -m proxy``).

:mod:`proxy.cli.main` parses the arguments and runs a command; :mod:`proxy.cli.explain` answers
``rules explain`` and :mod:`proxy.cli.why` ``audit why``, both from the pieces in
:mod:`proxy.cli.dryrun`; :mod:`proxy.cli.provision` prints ``surrogate env``. May import every
layer.

``proxy.cli:main`` (the entry point of earlier releases) still works (forwarded to
:mod:`proxy.cli.main`).
"""

from proxy._moved import forward

__getattr__ = forward("proxy.cli.main")
