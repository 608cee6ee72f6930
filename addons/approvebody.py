"""approvebody: resume a request held once its body was read (issue 16, addons/approve.py).

A request whose body is read for its preview is held in ``request``, after its body was read.
Until then no later addon saw it (approve answered it in ``requestheaders``, so each passed it
by, and mitmproxy read its body instead of streaming it: no upstream connection). Approved,
:func:`after` gives it to them as if it had just arrived: every addon after approve in the chain
runs its ``requestheaders`` now (substitute swaps the head and sets its body stream, sign and
sigv4 mark a body they read whole, resolve pins the address, ...), in chain order, stopping at
the first that answers or kills it. The body stream they set up (substitute's swap, wrapped by
stream's count) is then run over the whole body at once, as mitmproxy would have run it over the
reads, and its output becomes the body sent; the head's framing is what substitute made it (a
length that may change is sent chunked). A refusal the body stream found kills the flow, so no
byte of it leaves (the audit event says why). The ``request`` hooks of the later addons run
after this, as for any request.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mitmproxy import ctx, http
from mitmproxy.proxy.layers.http._hooks import HttpRequestHeadersHook

from addons import facts


async def after(approve: Any, flow: http.HTTPFlow) -> None:
    """Run the ``requestheaders`` hooks of the addons after ``approve`` on ``flow``, then its body
    stream over its whole body (module docstring)."""
    manager = ctx.master.addons
    chain = list(manager.chain)
    event = HttpRequestHeadersHook(flow)
    for addon in chain[chain.index(approve) + 1 :]:
        if flow.response or flow.error:
            return
        await manager.invoke_addon(addon, event)
    if flow.response or flow.error:
        return
    req = flow.request
    stream, req.stream = req.stream, False
    if not callable(stream):
        return
    body = _joined(stream(req.raw_content or b"")) + _joined(stream(b""))
    decision = flow.metadata.get(facts.DECISION)
    if decision is None or not decision.allowed:
        flow.kill()
        return
    req.data.content = body


def _joined(out: bytes | Iterable[bytes]) -> bytes:
    return out if isinstance(out, bytes) else b"".join(out)
