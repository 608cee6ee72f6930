"""hooks: answer a hook route's request with an operator command, never contacting the upstream.

After policy allowed a request, a route of the claim's pool (:mod:`proxy.core.hooks`) that matches
its canonical host, method and path takes it: ``requestheaders`` marks it (so stream leaves its
body to be read whole, at most :data:`proxy.core.hooks.MAX_BODY` bytes, declared), and ``request``
runs the command with the request as JSON on stdin, before substitution: the command sees the
placeholders the sandbox sent, never a secret. Its environment holds only ``PATH``, ``HOME`` and
``LANG`` (the proxy's own environment may hold ``env:`` secrets). The response it prints is
scrubbed like an upstream's (a host-side CLI may print a real token) and sent; a timeout is a
504 ``hook_timeout``, any other failure a 502 ``hook_failed``.

Hook commands running at once are bounded, for the whole node (every worker: the counts are in
:mod:`proxy.store.counters`), before a process is started: per pool by its ``limits.hook_processes``
(all the pool's claims together; past it ``429 hook_pool_limit``), and for the node by
``--hook-processes`` (past it ``503 hook_node_limit``), both with ``Retry-After: 1``. A request
past a bound is refused at once rather than queued: a queue would hold the sandbox's connection
for as long as the commands ahead of it run. A slot is held from just before the process starts
until it has exited and been reaped (a timeout kills its process group first). When the proxy
stops, the commands still running are killed (their process groups), so none outlives the slot
counted for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

from mitmproxy import addonmanager, ctx, exceptions, http

from addons import facts
from proxy.core import hooks
from proxy.core.decide import Action, Decision, Reason, deny
from proxy.core.limits import DEFAULT_NODE_HOOK_PROCESSES, Limits
from proxy.core.scrub import Scrubber
from proxy.engine.state import State
from proxy.store.live import live_values

_ENV = ("PATH", "HOME", "LANG")
_HEAD = "surrogate.hooks.head"
_NODE_KEY = "hooks\0node"
_RETRY = {"Retry-After": "1"}


def _pool_key(pool: str) -> str:
    return f"hooks\0pool\0{pool}"


def _refuse(flow: http.HTTPFlow, reason: Reason, message: str, status: int) -> None:
    facts.refuse(flow, deny(reason, message, status=status))


class Hooks:
    def __init__(self, state: State) -> None:
        self.state = state
        self.live: set[int] = set()  # process groups of the commands running now

    def done(self) -> None:
        """The proxy stops: its commands stop too (they run in their own sessions, so no signal
        to the proxy reaches them), or they would outlive the slots counted for them."""
        for group in self.live:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)

    def load(self, loader: addonmanager.Loader) -> None:
        loader.add_option(
            "surrogate_hook_processes",
            int,
            DEFAULT_NODE_HOOK_PROCESSES,
            "Hook-route commands running at once on the node (every pool and worker together).",
        )

    def configure(self, updated: set[str]) -> None:
        if "surrogate_hook_processes" in updated:
            bound = ctx.options.surrogate_hook_processes
            if bound < 1:
                raise exceptions.OptionsError(f"surrogate_hook_processes {bound} must be at least 1")
            self.state.metrics.hook_processes_limit.labels("*").set(bound)

    @facts.fail_closed
    def requestheaders(self, flow: http.HTTPFlow) -> None:
        claim = flow.metadata.get(facts.CLAIM)
        host = flow.metadata.get(facts.HOST)
        if flow.response or flow.error or claim is None or host is None:
            return
        pool = self.state.policy.pools.get(claim.pool)
        path = flow.metadata.get(facts.PATH) or flow.request.path  # the canonical identity (policy)
        also = flow.metadata.get(facts.METHODS, frozenset())  # override headers, _method (policy)
        route = hooks.find(pool.hooks, host, flow.request.method, path, also) if pool else None
        if route is None:
            return
        flow.metadata[facts.HOOK] = route
        # the head as the sandbox sent it, whatever a later addon does to the flow's headers
        flow.metadata[_HEAD] = [(k, v) for k, v in flow.request.headers.items(multi=True)]
        # mitmproxy reads an undeclared body up to stream_large_bodies and then streams it to the
        # upstream: a hook request must declare its body, so that it is read here, whole, or refused.
        length = flow.request.headers.get("content-length")
        declared = length is not None and length.isascii() and length.isdigit()
        undeclared = not declared and (
            "transfer-encoding" in flow.request.headers
            if flow.request.http_version.startswith("HTTP/1")
            else flow.request.method in ("POST", "PUT", "PATCH")  # HTTP/2: no framing header to tell
        )
        if undeclared or (declared and int(length or 0) > hooks.MAX_BODY):
            _refuse(
                flow,
                Reason.HOOK_FAILED,
                f"hook route {route.id} takes a request body of at most {hooks.MAX_BODY} bytes, "
                "with its Content-Length declared",
                413,
            )

    async def request(self, flow: http.HTTPFlow) -> None:
        route = flow.metadata.get(facts.HOOK)
        if route is None or flow.response or flow.error:
            return
        try:
            await self._answer(flow, route)
        except Exception as e:  # fail closed: never let the request through to the upstream
            facts.log.error("hooks.request failed with %s; request %s refused", type(e).__name__,
                            flow.metadata.get(facts.REQUEST_ID, flow.id))  # fmt: skip
            _refuse(flow, Reason.HOOK_FAILED, f"hook route {route.id} could not be run", 502)

    async def _answer(self, flow: http.HTTPFlow, route: hooks.HookRoute) -> None:
        claim = flow.metadata[facts.CLAIM]
        pool = self.state.policy.pools.get(claim.pool)
        bound = (pool.limits if pool is not None else Limits()).hook_processes
        node = ctx.options.surrogate_hook_processes
        metrics = self.state.metrics
        metrics.hook_processes_limit.labels(claim.pool).set(bound)
        keys = [_pool_key(claim.pool), _NODE_KEY]
        full = self.state.counters.acquire([(keys[0], bound), (keys[1], node)])
        if full == 0:
            metrics.limit_refusals.labels("hook_pool").inc()
            message = (
                f"hook route {route.id}: pool {claim.pool!r} already runs {bound} hook commands, "
                "the most it allows at once; retry after the Retry-After seconds"
            )
            facts.refuse(flow, deny(Reason.HOOK_POOL_LIMIT, message, 429), _RETRY)
            return
        if full == 1:
            metrics.limit_refusals.labels("hook_node").inc()
            message = (
                f"hook route {route.id}: this proxy already runs {node} hook commands, the most it "
                "allows at once; retry after the Retry-After seconds"
            )
            facts.refuse(flow, deny(Reason.HOOK_NODE_LIMIT, message, 503), _RETRY)
            return
        metrics.hook_processes.inc()
        try:
            await self._spawn(flow, route)
        finally:
            metrics.hook_processes.dec()
            self.state.counters.release(keys)

    async def _spawn(self, flow: http.HTTPFlow, route: hooks.HookRoute) -> None:
        req = flow.request
        stdin = hooks.request_json(
            req.method, req.scheme, flow.metadata[facts.HOST], req.port, req.path, req.http_version,
            flow.metadata[_HEAD], req.raw_content or b"",
        )  # fmt: skip
        env = {k: os.environ[k] for k in _ENV if k in os.environ}
        try:
            proc = await asyncio.create_subprocess_exec(
                *route.command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # its own process group: a timeout kills its children too
            )
        except OSError as e:
            _refuse(
                flow, Reason.HOOK_FAILED, f"hook route {route.id}: command cannot start ({e.strerror})", 502
            )
            return
        self.live.add(proc.pid)
        try:
            await self._finish(flow, route, proc, stdin)
        finally:
            self.live.discard(proc.pid)

    async def _finish(
        self, flow: http.HTTPFlow, route: hooks.HookRoute, proc: asyncio.subprocess.Process, stdin: bytes
    ) -> None:
        try:
            out = await asyncio.wait_for(self._run(proc, stdin), route.timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            _refuse(
                flow, Reason.HOOK_TIMEOUT, f"hook route {route.id}: command ran past {route.timeout:g} s", 504
            )
            return
        except BaseException:  # cancelled, or a pipe error: its slot is given back, so it must end
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await asyncio.shield(proc.wait())
            raise
        if proc.returncode != 0:
            _refuse(flow, Reason.HOOK_FAILED, f"hook route {route.id}: command exited {proc.returncode}", 502)
            return
        try:
            answer = hooks.parse_response(out)
        except hooks.HookOutputError as e:
            _refuse(flow, Reason.HOOK_FAILED, f"hook route {route.id}: {e}", 502)
            return
        claim = flow.metadata[facts.CLAIM]
        now = time.time()
        scrubber = Scrubber(
            [
                (s.reveal().encode(), c.placeholder.encode())
                for c in claim.credentials
                for s in live_values(c, now)
            ]
        )
        headers = [(k, scrubber.scrub(v)) for k, v in answer.headers]
        request_id = flow.metadata.get(facts.REQUEST_ID, flow.id)
        flow.response = http.Response.make(answer.status, scrubber.scrub(answer.body), headers)
        flow.response.headers[facts.REQUEST_ID_HEADER] = request_id
        allowed = flow.metadata.get(facts.DECISION)
        flow.metadata[facts.DECISION] = Decision(
            Action.ALLOW, Reason.HOOK_ANSWERED, f"answered by hook route {route.id}",
            allowed.rule if allowed else None, answer.status,
        )  # fmt: skip

    @staticmethod
    async def _run(proc: asyncio.subprocess.Process, stdin: bytes) -> bytes:
        assert proc.stdin is not None and proc.stdout is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # it need not read stdin
            proc.stdin.write(stdin)
            await proc.stdin.drain()
            proc.stdin.close()
        out = bytearray()
        while chunk := await proc.stdout.read(65536):
            out += chunk
            if len(out) > hooks.MAX_OUTPUT:  # parse_response says so
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                break
        await proc.wait()
        return bytes(out)
