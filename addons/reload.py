"""reload: new rules without a restart, on SIGHUP or when the rules file changes.

The file is validated exactly as ``surrogate rules check`` does; a valid file replaces the
policy in one assignment (open tunnels get it from their next request), an invalid one is
rejected with the same messages and the rules in force stay. Either way one audit event
(``"event": "reload"``) records the outcome. The file is polled every ``POLL_SECONDS`` (size,
mtime and inode), which also catches an editor's write-and-rename.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from proxy import audit
from proxy.errors import RulesError
from proxy.rules import load_rules
from proxy.state import State

POLL_SECONDS = 1.0
log = logging.getLogger("surrogate")


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class Reload:
    def __init__(self, state: State, rules: Path) -> None:
        self.state = state
        self.rules = rules
        self._stamp = _stamp(rules)
        self._task: asyncio.Task[None] | None = None

    def running(self) -> None:
        self._task = asyncio.create_task(self._watch())

    def done(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(POLL_SECONDS)
            stamp = _stamp(self.rules)
            if stamp is not None and stamp != self._stamp:
                self._stamp = stamp
                self.reload("file_change")

    def reload(self, trigger: str) -> bool:
        """Load the rules file again; True when the new rules are in force."""
        try:
            policy = load_rules(self.rules)
        except RulesError as e:
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
