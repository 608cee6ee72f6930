"""The engine: mitmproxy embedded, and what runs the process.

:mod:`proxy.engine.master` builds the Master with surrogate's addon chain (``addons/``) and the
control listener; :mod:`proxy.engine.dispatch` its cached event dispatch;
:mod:`proxy.engine.workers` the ``--workers N`` supervisor; :mod:`proxy.engine.hardening` the
process hardening done before any secret is read; :mod:`proxy.engine.state` the state the addons
share; :mod:`proxy.engine.hostaddrs` and :mod:`proxy.engine.sockets` what the kernel says about
this host's addresses and sockets. May import every layer below (and ``addons``).

``from proxy.engine import run`` and the other names of the flat ``proxy.engine`` module of
earlier releases still work (forwarded to :mod:`proxy.engine.master`).
"""

from proxy._moved import forward

__getattr__ = forward("proxy.engine.master")
