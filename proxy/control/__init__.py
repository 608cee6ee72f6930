"""The control plane: how a broker changes credentials and claims at run time.

:mod:`proxy.control.service` validates a write against the rules in force, applies it to the
store and audits it (no HTTP); :mod:`proxy.control.api` is the HTTP API over it (FastAPI, on a
unix socket or loopback with an operator token), :mod:`proxy.control.apiedge` its pure edge
checks, :mod:`proxy.control.ready` the node's readiness (``/readyz``), :mod:`proxy.control.client`
the client the CLI uses. May import: :mod:`proxy.core`,
:mod:`proxy.rules`, :mod:`proxy.store`, :mod:`proxy.audit`, :mod:`proxy.metrics`.

``from proxy.control import ControlPlane`` and the other names of the flat ``proxy.control``
module of earlier releases still work (forwarded to :mod:`proxy.control.service`).
"""

from proxy._moved import forward

__getattr__ = forward("proxy.control.service")
