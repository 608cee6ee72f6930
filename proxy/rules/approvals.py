"""The rules file's top-level ``approvals`` section (issue 16): the notification command.

``approvals: {notify: [PROGRAM, ARG...], timeout: SECONDS}``: the program (a path; a relative
one is taken from the rules file's folder; no shell) must be an executable file now, as a hook
route's; ``timeout`` is more than 0 and at most :data:`proxy.core.approvals.NOTIFY_MAX_TIMEOUT`
seconds (default 5). Problems are recorded at ``approvals.notify[0]``, ``approvals.timeout``.
"""

from __future__ import annotations

import os
from pathlib import Path

from proxy.core.approvals import NOTIFY_MAX_TIMEOUT, Notify
from proxy.rules.marks import Loc, Marks
from proxy.rules.models import ApprovalsModel


def build_notify(am: ApprovalsModel, loc: Loc, base_dir: Path, marks: Marks) -> Notify | None:
    """The checked notification command, or None (its problems recorded in ``marks``)."""
    n = len(marks.problems)
    if not 0 < am.timeout <= NOTIFY_MAX_TIMEOUT:
        marks.add(
            loc + ("timeout",),
            f"timeout {am.timeout} must be more than 0 and at most {NOTIFY_MAX_TIMEOUT:g} seconds",
        )
    program = ""
    if not am.notify or not am.notify[0]:
        marks.add(loc + ("notify",), "notify must be a non-empty list: the program, then its arguments")
    else:
        program = str(base_dir / os.path.expanduser(am.notify[0]))
        if not (os.path.isfile(program) and os.access(program, os.X_OK)):
            marks.add(
                loc + ("notify", 0),
                f"program {program!r} is not an executable file (give a path; commands run without a shell)",
            )
    if len(marks.problems) > n:
        return None
    return Notify((program, *am.notify[1:]), float(am.timeout))
