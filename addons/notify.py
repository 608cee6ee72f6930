"""notify: tell an operator's command about each new pending approval (issue 16).

The rules file's top-level ``approvals.notify`` (:class:`proxy.core.approvals.Notify`) is run
once per approval that starts pending (``addons/approve.py`` calls :meth:`Notifier.send` right
after writing it to the store), as a hook route's command is: no shell, its own process group,
an environment of only ``PATH``, ``HOME`` and ``LANG`` (the proxy's own may hold ``env:``
secrets), stdout and stderr discarded. Its stdin is one JSON document (:func:`document`):

    {"event": "approval_asked", "id", "request_id", "claim", "pool", "method", "host", "port",
     "path", "credentials": [names], "preview", "rule", "scopes": [...], "created_at",
     "expires_at"}

Only what the approvals API shows: credential NAMES, the redacted preview; never a value.

It never decides anything and never holds a request up: it runs in a task of its own, after the
approval is in the store and whatever it does. At most :data:`MAX_RUNNING` run at once per
proxy process; past that a notification waits, at most :data:`MAX_WAITING` of them, and past
that one is dropped. Each is audited ``approval_notified`` {approval, request_id, outcome: sent |
failed | dropped, reason}; a failure (cannot start, a non-zero exit, killed at its ``timeout``,
dropped) is also logged as a warning. When the proxy stops, the commands still running are
killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from typing import Any

from addons import facts
from proxy import audit
from proxy.core.approvals import Notify
from proxy.store.base import ApprovalRecord

MAX_RUNNING = 4
MAX_WAITING = 256
_ENV = ("PATH", "HOME", "LANG")


def document(record: ApprovalRecord) -> bytes:
    """The JSON document the command reads (module docstring)."""
    doc: dict[str, Any] = {
        "event": "approval_asked", "id": record.id, "request_id": record.request_id,
        "claim": record.claim_id, "pool": record.pool, "method": record.method, "host": record.host,
        "port": record.port, "path": record.path, "credentials": list(record.credentials),
        "preview": record.preview, "rule": record.rule, "scopes": list(record.scopes),
        "created_at": record.created_at, "expires_at": record.expires_at,
    }  # fmt: skip
    return json.dumps(doc).encode() + b"\n"


class Notifier:
    def __init__(self) -> None:
        self.waiting = 0
        self.slots: asyncio.Semaphore | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.live: set[int] = set()  # process groups of the commands running now

    def send(self, record: ApprovalRecord, notify: Notify | None) -> None:
        """Start telling ``notify``'s command about ``record`` (returns at once)."""
        if notify is None:
            return
        if self.waiting >= MAX_WAITING:
            _said(record, "dropped", f"{MAX_WAITING} notifications already wait for a free slot")
            return
        task = asyncio.get_running_loop().create_task(self._queued(record, notify))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def done(self) -> None:
        for group in self.live:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)

    async def _queued(self, record: ApprovalRecord, notify: Notify) -> None:
        if self.slots is None:
            self.slots = asyncio.Semaphore(MAX_RUNNING)
        self.waiting += 1
        try:
            await self.slots.acquire()
        finally:
            self.waiting -= 1
        try:
            outcome, reason = await self._run(record, notify)
        except Exception as e:  # noqa: BLE001 - a notification's failure is only ever reported
            outcome, reason = "failed", f"{type(e).__name__}"
        finally:
            self.slots.release()
        _said(record, outcome, reason)

    async def _run(self, record: ApprovalRecord, notify: Notify) -> tuple[str, str | None]:
        env = {k: os.environ[k] for k in _ENV if k in os.environ}
        try:
            proc = await asyncio.create_subprocess_exec(
                *notify.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL, env=env, start_new_session=True,
            )  # fmt: skip
        except OSError as e:
            return "failed", f"cannot start ({e.strerror})"
        self.live.add(proc.pid)
        try:
            await asyncio.wait_for(self._feed(proc, document(record)), notify.timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            return "failed", f"ran past its timeout of {notify.timeout:g} s"
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await asyncio.shield(proc.wait())
            raise
        finally:
            self.live.discard(proc.pid)
        return ("sent", None) if proc.returncode == 0 else ("failed", f"exited {proc.returncode}")

    @staticmethod
    async def _feed(proc: asyncio.subprocess.Process, stdin: bytes) -> None:
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # it need not read it all
            proc.stdin.write(stdin)
            await proc.stdin.drain()
            proc.stdin.close()
        await proc.wait()


def _said(record: ApprovalRecord, outcome: str, reason: str | None) -> None:
    audit.logger().info("approval_notified", approval=record.id, request_id=record.request_id,
                        claim=record.claim_id, outcome=outcome, reason=reason)  # fmt: skip
    if outcome != "sent":
        facts.log.warning("approval %s: notification command %s: %s", record.id, outcome, reason)
