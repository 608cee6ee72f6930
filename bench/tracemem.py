"""Run ``surrogate run`` under tracemalloc, dumping a snapshot on each SIGUSR1 (issue 19).

Bench-only: the proxy itself holds no such switch. ``python bench/tracemem.py OUTDIR run ARGS…``
starts the proxy as ``python -m proxy run ARGS…`` would, with tracemalloc on (25 frames), and
writes ``OUTDIR/snap-N.pickle`` on SIGUSR1; with ``TRACEMEM_COLLECT=1`` after a full
``gc.collect()`` (what is alive, not the cyclic garbage waiting for a collection). Compare two
with ``python bench/tracemem.py --diff A B [PER]``: growth by allocating file, then the lines of
surrogate's own code, ÷ PER. tracemalloc sees only Python's allocator: OpenSSL's memory is in
RSS but not in the snapshots.

On SIGUSR2 it writes ``OUTDIR/probe-N.json`` instead (cheap, no snapshot; what bench/idle.py's
``--heap`` reads): after a full ``gc.collect()``, the Python heap tracemalloc traces, tracemalloc's
own overhead, VmRSS, glibc's ``mallinfo2`` (arena bytes in use / free), a census of the live
objects gc tracks by type, and, once ``OUTDIR/trim`` exists, VmRSS again after ``malloc_trim(0)``
(what glibc could hand back: free memory held in its heaps). ``TRACEMEM_FRAMES`` sets the
traceback depth (default 25; 1 keeps tracemalloc's own overhead small).
"""

from __future__ import annotations

import ctypes
import gc
import itertools
import json
import os
import signal
import sys
import tracemalloc
from collections import Counter
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _serve(out: Path, argv: list[str], collect: bool) -> int:
    from proxy.cli.main import main

    out.mkdir(parents=True, exist_ok=True)
    counter = itertools.count()

    def dump(_sig: int, _frame: FrameType | None) -> None:
        if collect:
            gc.collect()  # what is alive, not what waits for the cycle collector
        tracemalloc.take_snapshot().dump(str(out / f"snap-{next(counter)}.pickle"))

    probes = itertools.count()

    def probe(_sig: int, _frame: FrameType | None) -> None:
        (out / f"probe-{next(probes)}.json").write_text(json.dumps(_probe(trim=(out / "trim").exists())))

    signal.signal(signal.SIGUSR1, dump)
    signal.signal(signal.SIGUSR2, probe)
    tracemalloc.start(int(os.environ.get("TRACEMEM_FRAMES", "25")))
    return main(argv)


class _Mallinfo2(ctypes.Structure):
    _fields_ = [  # glibc's struct mallinfo2 (malloc.h), every field a size_t
        (name, ctypes.c_size_t)
        for name in (
            *("arena", "ordblks", "smblks", "hblks", "hblkhd"),
            *("usmblks", "fsmblks", "uordblks", "fordblks", "keepcost"),
        )
    ]


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise KeyError("VmRSS")


def _probe(trim: bool) -> dict[str, object]:
    """What this process holds now: Python heap, RSS, glibc's heaps, live objects by type."""
    gc.collect()
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _Mallinfo2
    mi = libc.mallinfo2()
    census = Counter(type(o).__module__ + "." + type(o).__qualname__ for o in gc.get_objects())
    traced, _peak = tracemalloc.get_traced_memory()
    got: dict[str, object] = {
        "traced": traced,
        "tracemalloc_overhead": tracemalloc.get_tracemalloc_memory(),
        "rss_kib": _rss_kib(),
        "malloc_in_use": mi.uordblks + mi.hblkhd,  # allocated from the heaps + mmapped chunks
        "malloc_free": mi.fordblks,  # free chunks kept in the heaps
        "census": dict(census.most_common(60)),
    }
    if trim:
        libc.malloc_trim(0)
        got["rss_kib_trimmed"] = _rss_kib()
    return got


def _diff(a: Path, b: Path, top: int, per: int) -> None:
    """What grew from snapshot ``a`` to ``b``, ÷ ``per``: by the file that allocated it, then
    the lines of surrogate's own code (addons/, proxy/) that allocated directly."""
    old, new = tracemalloc.Snapshot.load(str(a)), tracemalloc.Snapshot.load(str(b))
    stats = new.compare_to(old, "lineno")
    total = sum(s.size_diff for s in stats)
    by_file: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    for s in stats:
        frame = s.traceback[-1]  # the allocating line (frames run oldest to newest)
        where = Path(frame.filename)
        by_file["/".join(where.parts[-2:])] += s.size_diff
        if where.is_relative_to(ROOT) and where.parts[len(ROOT.parts)] in ("addons", "proxy"):
            ours[f"{where.relative_to(ROOT)}:{frame.lineno}"] += s.size_diff
    print(f"Python heap grown: {total / 1024:,.0f} KiB, {total / per:,.0f} B per unit of {per:,}")
    for name, size in by_file.most_common(top):
        print(f"  {size / per:8,.0f} B  {name}")
    print(f"allocated on surrogate's own lines: {sum(ours.values()) / per:,.0f} B per unit")
    for name, size in ours.most_common(top):
        print(f"  {size / per:8,.0f} B  {name}")


if __name__ == "__main__":
    if sys.argv[1] == "--diff":
        per = int(sys.argv[4]) if len(sys.argv) > 4 else 1
        _diff(Path(sys.argv[2]), Path(sys.argv[3]), 20, per)
    else:
        raise SystemExit(_serve(Path(sys.argv[1]), sys.argv[2:], os.environ.get("TRACEMEM_COLLECT") == "1"))
