"""Every store backend's leases (:mod:`proxy.store.leases`): one holder at a time across handles
(another process's view: for PostgreSQL another pool, as another node has) and processes; a
bounded wait; a holder killed with ``kill -9`` loses the lease within its ttl.

The fixtures are the conformance suite's (SQLite temp file, PostgreSQL private cluster)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest

from proxy.store.base import CredentialStore
from unit.store.test_conformance import ROOT, Backend, backend, other, store

__all__ = ["backend", "other", "store"]  # the fixtures, used by name


def test_one_holder_at_a_time_across_handles(
    store: CredentialStore, other: Callable[[], CredentialStore]
) -> None:
    peer = other()
    with store.lease("oauth:c1/gh", ttl=30) as held:
        assert held
        with peer.lease("oauth:c1/gh", ttl=30) as second:
            assert not second
        with peer.lease("oauth:c1/other", ttl=30) as unrelated:
            assert unrelated  # leases are per key
    with peer.lease("oauth:c1/gh", ttl=30) as again:
        assert again  # given back on exit


def test_a_lease_is_given_back_when_the_block_raises(store: CredentialStore) -> None:
    with pytest.raises(RuntimeError), store.lease("k", ttl=30) as held:
        assert held
        raise RuntimeError("the job failed")
    with store.lease("k", ttl=30) as held:
        assert held


def test_of_many_concurrent_takers_exactly_one_holds(
    store: CredentialStore, other: Callable[[], CredentialStore]
) -> None:
    handles = [other() for _ in range(4)]
    barrier = threading.Barrier(16)
    inside, most, held_count = 0, 0, 0
    lock = threading.Lock()

    def taker(i: int) -> None:
        nonlocal inside, most, held_count
        barrier.wait()
        with handles[i % 4].lease("one", ttl=30) as held:
            if held:
                with lock:
                    inside += 1
                    held_count += 1
                    most = max(most, inside)
                time.sleep(0.2)
                with lock:
                    inside -= 1

    threads = [threading.Thread(target=taker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert held_count == 1 and most == 1


def test_waiters_take_turns_and_never_overlap(
    store: CredentialStore, other: Callable[[], CredentialStore]
) -> None:
    handles = [other() for _ in range(3)]
    inside, most, turns = 0, 0, 0
    lock = threading.Lock()

    def taker(i: int) -> None:
        nonlocal inside, most, turns
        with handles[i % 3].lease("turns", ttl=30, wait=20) as held:
            assert held
            with lock:
                inside += 1
                most = max(most, inside)
            time.sleep(0.05)
            with lock:
                inside -= 1
                turns += 1

    threads = [threading.Thread(target=taker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert turns == 6 and most == 1


def test_the_wait_is_bounded(store: CredentialStore, other: Callable[[], CredentialStore]) -> None:
    peer = other()
    with store.lease("busy", ttl=30) as held:
        assert held
        start = time.monotonic()
        with peer.lease("busy", ttl=30, wait=0.5) as second:
            waited = time.monotonic() - start
        assert not second and 0.45 <= waited < 3.0


def test_an_expired_lease_is_taken_over_and_the_old_holder_frees_nothing(
    store: CredentialStore, other: Callable[[], CredentialStore]
) -> None:
    peer = other()
    with store.lease("slow", ttl=0.3) as held:
        assert held
        time.sleep(0.5)  # the job outlived its ttl
        with peer.lease("slow", ttl=30) as taken:
            assert taken
            with store.lease("slow", ttl=30) as third:
                assert not third
        # the peer gave its own lease back; ours is gone, so giving it back must not free anyone
        with peer.lease("slow", ttl=30) as again:
            assert again
    with peer.lease("slow", ttl=30) as after:
        assert after


@pytest.mark.parametrize(
    ("key", "ttl", "wait"),
    [("", 1, 0), ("x" * 201, 1, 0), ("k", 0, 0), ("k", -1, 0), ("k", 3601, 0), ("k", float("nan"), 0),
     ("k", 1, -1), ("k", 1, float("nan"))],
    ids=["empty-key", "long-key", "zero-ttl", "negative-ttl", "long-ttl", "nan-ttl", "negative-wait",
         "nan-wait"],
)  # fmt: skip
def test_bad_arguments_are_refused_and_hold_nothing(
    store: CredentialStore, key: str, ttl: float, wait: float
) -> None:
    with pytest.raises(ValueError), store.lease(key, ttl, wait):
        pass


HOLDER = """
import sys, time
from pathlib import Path
from proxy.store.choose import open_store

state, url, ttl = Path(sys.argv[1]), (sys.argv[2] or None), float(sys.argv[3])
with open_store(state, url, state / "store.key") as store, store.lease("job", ttl=ttl) as held:
    print("HELD" if held else "NOT", flush=True)
    time.sleep(600)
"""


def test_a_holder_killed_with_kill_9_loses_the_lease_within_its_ttl(
    backend: Backend, store: CredentialStore
) -> None:
    ttl = 2.0
    args = [sys.executable, "-c", HOLDER, str(backend.state), backend.url or "", str(ttl)]
    with subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "HELD"
        taken_after = time.monotonic()
        with store.lease("job", ttl=30) as held:
            assert not held  # another process holds it
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
    with store.lease("job", ttl=30, wait=ttl + 5) as held:
        freed = time.monotonic() - taken_after
    assert held and freed <= ttl + 1.0, freed
