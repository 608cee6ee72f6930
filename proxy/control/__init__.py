"""The control plane: how a broker changes credentials and claims at run time.

:mod:`proxy.control.service` applies a write to the store and audits it (no HTTP), after
:mod:`proxy.control.checks` validated it against the rules in force; :mod:`proxy.control.api`
assembles the HTTP API over it (FastAPI, on a unix socket or loopback with an operator token:
listener guard, body limit, error shapes), :mod:`proxy.control.routes` holds its routes,
:mod:`proxy.control.models` its request and response bodies, :mod:`proxy.control.apiedge` its
pure edge checks, :mod:`proxy.control.kinds` the blocks of credential kinds (aws_sigv4,
oauth_client, hmac), :mod:`proxy.control.ready` the node's readiness (``/readyz``), and
:mod:`proxy.control.client` is the client the CLI uses. May import: :mod:`proxy.core`,
:mod:`proxy.rules`, :mod:`proxy.store`, :mod:`proxy.audit`, :mod:`proxy.metrics`.

``from proxy.control import ControlPlane`` and the other names of the flat ``proxy.control``
module of earlier releases still work (forwarded to :mod:`proxy.control.service`).
"""

from proxy._moved import forward

__getattr__ = forward("proxy.control.service", "proxy.control.checks")
