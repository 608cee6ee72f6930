"""The embedded engine: a mitmproxy Master holding only surrogate's addon chain.

Options set here, and why:
- ``connection_strategy=lazy``: no upstream TCP/TLS until a request (or opaque tunnel data)
  has been allowed, so a denied CONNECT never touches the upstream.
- ``ssl_verify_upstream_trusted_ca``: the system roots plus ``--upstream-ca`` files; upstream TLS
  is always verified (``ssl_insecure`` stays off: a secret leaves only over verified TLS).
- ``confdir``: ``<state dir>/ca``, where the proxy's CA lives.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mitmproxy import options
from mitmproxy.master import Master

import addons
from certs import ca
from proxy.state import State


@dataclass(slots=True)
class RunConfig:
    state: State
    state_dir: Path
    listen_host: str = "127.0.0.1"
    listen_port: int = 8080
    upstream_cas: list[Path] = field(default_factory=list)


def build_master(config: RunConfig, on_ready: Callable[[], None] | None = None) -> Master:
    """Create the Master (call inside a running event loop)."""
    ca.ensure_ca(config.state_dir)
    bundle = ca.write_upstream_bundle(config.state_dir, config.upstream_cas)
    opts = options.Options()
    master = Master(opts, with_termlog=False)
    chain = addons.chain(config.state)
    if on_ready is not None:
        chain.append(_Ready(on_ready))
    master.addons.add(*chain)
    opts.update(
        mode=["regular"],
        listen_host=config.listen_host,
        listen_port=config.listen_port,
        connection_strategy="lazy",
        confdir=str(ca.ca_dir(config.state_dir)),
        ssl_verify_upstream_trusted_ca=str(bundle),
        ssl_insecure=False,
        http3=False,
    )
    return master


class _Ready:
    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback

    def running(self) -> None:
        self.callback()


async def serve(config: RunConfig, on_ready: Callable[[], None] | None = None) -> None:
    """Run the proxy until SIGINT or SIGTERM."""
    _log_to_stderr()
    master = build_master(config, on_ready)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, master.shutdown)
    await master.run()


def _log_to_stderr() -> None:
    # mitmproxy logs through `logging`; warnings and errors go to stderr as plain lines. Header
    # values are never logged at these levels.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
