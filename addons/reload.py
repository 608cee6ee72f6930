"""reload: new rules without a restart, on SIGHUP or when the rules file changes.

The file is validated exactly as ``surrogate rules check`` does; a valid file replaces the
policy in one assignment (open tunnels get it from their next request), an invalid one is
rejected with the same messages and the rules in force stay. Either way one audit event
(``"event": "reload"``) records the outcome. The file is polled every ``POLL_SECONDS`` (size,
mtime and inode), which also catches an editor's write-and-rename.

A changed file is applied only once it is *stable*: unchanged (same inode, size and mtime) for
``SETTLE_SECONDS``, counted from its mtime or from when the watcher first saw the change, and not
changed while it was read. A file written in several parts (``open``/``write``/``write``, a
``cat >>``, a slow copy) is thus never applied half-written as long as its parts come less than
``SETTLE_SECONDS`` apart: a prefix can be a valid rules file that allows more than the whole
(a rule cut after its ``ports:`` has no ``methods`` or ``paths``). Operators should still replace
the file atomically (write a temporary file in the same directory, then rename it over the rules
file; editors, ``install`` and Kubernetes ConfigMap volumes do), which the settle time cannot make
unsafe. SIGHUP is the operator saying the file is complete: it is loaded at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

from proxy import audit
from proxy.core.errors import RulesError
from proxy.engine.state import State
from proxy.rules.loader import load_rules

POLL_SECONDS = 0.5
SETTLE_SECONDS = 3.0  # a changed file must stay unchanged this long before it is applied
log = logging.getLogger("surrogate")


Stamp = tuple[int, int, int]  # inode, mtime (ns), size


def _stamp(path: Path) -> Stamp | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def settled(stamp: Stamp, seen_at: float, now_wall: float, now_mono: float, settle: float) -> bool:
    """True when a file whose stamp has not changed since ``seen_at`` (monotonic seconds) has been
    stable for ``settle`` seconds: by its mtime against the wall clock ``now_wall``, or (a clock
    or an mtime that cannot be trusted, such as one in the future) by the watcher's own
    observation since ``seen_at``."""
    return now_wall - stamp[1] / 1e9 >= settle or now_mono - seen_at >= settle


class Reload:
    def __init__(self, state: State, rules: Path, settle: float = SETTLE_SECONDS) -> None:
        self.state = state
        self.rules = rules
        self.settle = settle
        self._stamp = _stamp(rules)  # the stamp of the file last loaded (or found at start)
        self._pending: tuple[Stamp, float] | None = None  # a changed stamp and when it was first seen
        self._task: asyncio.Task[None] | None = None

    def running(self) -> None:
        self._task = asyncio.create_task(self._watch())

    def done(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(POLL_SECONDS)
            self.poll()

    def poll(self) -> None:
        """One look at the file: load it when it changed and has settled (see the module doc)."""
        stamp = _stamp(self.rules)
        if stamp is None or stamp == self._stamp:
            self._pending = None
            return
        now = time.monotonic()
        if self._pending is None or self._pending[0] != stamp:
            self._pending = (stamp, now)  # changed again: its settle time starts over
        if not settled(stamp, self._pending[1], time.time(), now, self.settle):
            return
        self.reload("file_change", settled_stamp=stamp)

    def _read_whole(self, before: Stamp | None) -> bool:
        """After a load: True when the file did not change while it was read (and remember its
        stamp as the one judged); else forget the stamp, so the watcher judges it again."""
        whole = before is not None and _stamp(self.rules) == before
        self._stamp, self._pending = (before, None) if whole else (None, None)
        return whole

    def reload(self, trigger: str, settled_stamp: Stamp | None = None) -> bool:
        """Load the rules file again; True when the new rules are in force. With the
        ``settled_stamp`` the watcher judged stable, a file whose stamp is no longer that, before
        or after it is read, is not judged (it is being written): the watcher sees the new stamp
        and waits for it to settle. SIGHUP applies what it read."""
        before = _stamp(self.rules)
        if settled_stamp is not None and before != settled_stamp:
            self._pending = None
            return False
        try:
            policy = load_rules(self.rules)
        except RulesError as e:
            if not self._read_whole(before) and settled_stamp is not None:
                return False
            problems = [str(p) for p in e.problems]
            self.state.metrics.reloads.labels("rejected").inc()
            log.error("rules reload rejected, the previous rules stay in force:\n%s", "\n".join(problems))
            audit.logger().info(
                "reload",
                **{
                    audit.OUTCOME: "rejected",
                    audit.FILE: str(self.rules),
                    audit.TRIGGER: trigger,
                    audit.PROBLEMS: problems,
                },
            )
            return False
        if not self._read_whole(before) and settled_stamp is not None:
            return False
        self.state.registry.replace_policy(policy)
        self.state.metrics.reloads.labels("applied").inc()
        audit.logger().info(
            "reload",
            **{
                audit.OUTCOME: "applied",
                audit.FILE: str(self.rules),
                audit.TRIGGER: trigger,
                audit.PROBLEMS: [],
            },
        )
        return True
