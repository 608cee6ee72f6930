"""Process hardening against leaks of secrets held in memory.

A core dump would write the process's memory, decrypted secrets included, to disk, and a
dumpable process lets any other process of the same user attach a debugger or read
``/proc/<pid>/mem``. :func:`harden` turns both off at start, before any secret is read:

- ``RLIMIT_CORE`` soft and hard limits set to 0 (POSIX ``setrlimit``): no core file, and the
  process cannot raise the limit again;
- on Linux, ``prctl(PR_SET_DUMPABLE, 0)`` (prctl(2)): no core dump even through a
  ``core_pattern`` pipe, no ptrace attach by non-root processes of the same user, and
  ``/proc/<pid>/`` files owned by root.

Neither needs privileges. A failure is reported as a returned sentence, not raised: a proxy that
cannot harden itself (e.g. a seccomp profile refusing prctl) still runs, and says so on stderr.
"""

from __future__ import annotations

import ctypes
import resource
import sys

PR_SET_DUMPABLE = 4  # <linux/prctl.h>
PR_GET_DUMPABLE = 3


def _prctl(option: int, arg: int = 0) -> int:
    libc = ctypes.CDLL(None, use_errno=True)  # the running interpreter's own libc
    result = int(libc.prctl(option, arg, 0, 0, 0))
    if result < 0:
        raise OSError(ctypes.get_errno(), "prctl failed")
    return result


def harden() -> list[str]:
    """Disable core dumps (and, on Linux, mark the process non-dumpable).

    Returns a list of sentences describing what could not be done (empty when all went well).
    """
    problems: list[str] = []
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (OSError, ValueError) as e:
        problems.append(f"cannot disable core dumps (setrlimit RLIMIT_CORE): {e}")
    if sys.platform.startswith("linux"):
        try:
            _prctl(PR_SET_DUMPABLE, 0)
        except OSError as e:
            problems.append(f"cannot mark the process non-dumpable (prctl PR_SET_DUMPABLE): {e}")
    return problems


def dumpable() -> bool | None:
    """Whether this process is dumpable (Linux); None where that cannot be asked."""
    if not sys.platform.startswith("linux"):
        return None
    return _prctl(PR_GET_DUMPABLE) != 0
