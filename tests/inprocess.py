"""``surrogate ARGS`` through :func:`proxy.cli.main.main` in the test's own process.

A ``python -m proxy`` start imports mitmproxy and the whole CLI (about 2 s of CPU on the suite's
2-core machine); a command that only prints (``transparent-rules``) or is one row of a table of
control-API answers gives the same text, exit status and stderr through the same parser, handler
and error path in-process, for milliseconds. The process path (``__main__``'s ``SystemExit``)
stays covered wherever a test still runs the command as a process.
"""

from __future__ import annotations

import contextlib
import io
import subprocess


def surrogate(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    """The command's exit status, stdout and stderr, shaped as :func:`subprocess.run`'s answer;
    an argparse refusal (``SystemExit``) is its status. ``check``: raise on a non-zero status."""
    from proxy.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    done = subprocess.CompletedProcess(["surrogate", *args], code, out.getvalue(), err.getvalue())
    if check:
        done.check_returncode()
    return done
