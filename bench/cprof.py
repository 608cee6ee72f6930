"""Run ``surrogate run`` under cProfile (issue 19): SIGUSR1 starts profiling, SIGUSR2 stops it
and writes ``OUTDIR/prof-N.pstats``.

Bench-only (py-spy is not installed here). ``python bench/cprof.py OUTDIR run ARGS…``; read a
dump with ``python bench/cprof.py --show FILE [N]``: the top N functions by inclusive time,
then those in surrogate's own code (addons/, proxy/). cProfile slows Python calls down (about
2× here), which inflates code with many small calls: compare shares, not times.
"""

from __future__ import annotations

import cProfile
import itertools
import pstats
import signal
import sys
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _serve(out: Path, argv: list[str]) -> int:
    from proxy.cli.main import main

    out.mkdir(parents=True, exist_ok=True)
    counter = itertools.count()
    prof = cProfile.Profile()

    def start(_sig: int, _frame: FrameType | None) -> None:
        prof.enable()

    def stop(_sig: int, _frame: FrameType | None) -> None:
        prof.disable()
        prof.dump_stats(str(out / f"prof-{next(counter)}.pstats"))
        prof.clear()

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    return main(argv)


def _show(path: Path, n: int) -> None:
    st = pstats.Stats(str(path))
    stats = st.stats  # type: ignore[attr-defined]
    total = max(ct for _cc, _nc, _tt, ct, _callers in stats.values())
    rows = sorted(stats.items(), key=lambda kv: kv[1][3], reverse=True)

    def line(key: tuple[str, int, str], v: tuple[int, int, float, float, object]) -> str:
        file, lineno, name = key
        where = Path(file)
        short = where.relative_to(ROOT) if where.is_relative_to(ROOT) else "/".join(where.parts[-2:])
        return (
            f"  {v[3] / total:6.1%} incl  {v[2] / total:6.1%} self  {v[1]:>9,} calls  {short}:{lineno} {name}"
        )

    print(f"top {n} by inclusive time (100% = the longest-running frame, {total:.2f} s)")
    for key, v in rows[:n]:
        print(line(key, v))
    print(f"surrogate's own code (addons/, proxy/), top {n}")
    ours = [
        (k, v)
        for k, v in rows
        if Path(k[0]).is_relative_to(ROOT) and Path(k[0]).parts[len(ROOT.parts)] in ("addons", "proxy")
    ]
    for key, v in ours[:n]:
        print(line(key, v))


if __name__ == "__main__":
    if sys.argv[1] == "--show":
        _show(Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 30)
    else:
        raise SystemExit(_serve(Path(sys.argv[1]), sys.argv[2:]))
