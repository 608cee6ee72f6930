"""surrogate below its addons, one package a layer; a layer imports only the layers under it.

========================  ==================================================================
``proxy.core``            pure: hosts, paths, placeholders, the policy model, decisions,
                          substitution, scrubbing, bodies, limits (no I/O, no mitmproxy, no
                          clock: the clock is passed in)
``proxy.audit``,          the audit event writer (structlog JSON lines) and the Prometheus
``proxy.metrics``         registry: over the core only
``proxy.rules``           rules files: the YAML loader and its messages, ``env:``/``file:``
                          value sources
``proxy.store``           what the node keeps: the credential store (SQLite), its keys, the
                          registry of store-backed claims, live values, node-wide counters
``proxy.control``         the control plane: write logic, the HTTP API, its client
``proxy.engine``          the embedded mitmproxy master, event dispatch, workers, process
                          hardening, the state the addons share (with ``addons/`` beside it)
``proxy.cli``             the ``surrogate`` command: argument parsing, ``rules explain``,
                          ``audit why``, ``env``
========================  ==================================================================

``tests/unit/test_layers.py`` holds the order (and that nothing imports in a circle).
The flat module paths of earlier releases (``proxy.rules``, ``proxy.hosts``, ...) still import,
through :mod:`proxy._moved`.
"""

from proxy import _moved

_moved.install()
