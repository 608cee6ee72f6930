"""proxy.store.pgwatch: a version the watcher confirms is known current as of its read's START,
never as of when the answer arrived (review r-approve). The staleness bound counts from that
time: an answer delayed on the network (here: a loopback relay that holds the server's bytes)
describes the database as it was when the query ran, and a write committed meanwhile is not in
it, so counting from the arrival let a node serve past the bound by the delay."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
from pg import Cluster

from proxy.store.keyring import KeyRing
from proxy.store.pgwatch import Watcher
from proxy.store.postgres import PostgresStore


class _Relay:
    """A loopback TCP relay to ``port`` whose server-to-client direction can be held."""

    def __init__(self, port: int) -> None:
        self.port_to = port
        self.flowing = threading.Event()
        self.flowing.set()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.port_to))
            threading.Thread(target=self._pipe, args=(client, server, None), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, self.flowing), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, gate: threading.Event | None) -> None:
        try:
            while data := src.recv(65536):
                if gate is not None:
                    gate.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                s.close()

    def close(self) -> None:
        self.listener.close()


class _Recording(Watcher):
    """A Watcher that records every confirmation: (version, the time it is known current as of)."""

    seen: list[tuple[int, float]]

    def _read(self, conn: psycopg.Connection) -> None:  # type: ignore[type-arg]
        super()._read(conn)
        confirmed = self.confirmed()
        if confirmed is not None:
            self.seen.append(confirmed)


def test_a_delayed_answer_is_known_current_only_as_of_the_reads_start(
    pg_cluster: Cluster, tmp_path: Path
) -> None:
    url = pg_cluster.database()
    db = urlsplit(url).path.lstrip("/")
    relay = _Relay(pg_cluster.port)
    params = pg_cluster.url_params(db).replace(f"port={pg_cluster.port}", f"port={relay.port}")
    with PostgresStore.open(url, KeyRing.load_or_create(tmp_path / "k")) as writer:
        writer.create_claim("c1", "p")
        watcher = _Recording(lambda: psycopg.connect(params, autocommit=True), poll=0.2)
        watcher.seen = []
        watcher.start()
        try:
            deadline = time.monotonic() + 10
            while not watcher.seen:
                assert time.monotonic() < deadline, "the watcher never confirmed"
                time.sleep(0.01)
            relay.flowing.clear()  # the next read's answer is held on the way back
            time.sleep(0.6)  # past a poll: a read was sent and answered with the old version
            old = writer.data_version()
            writer.create_claim("c2", "p")
            written = time.monotonic()  # the write is acknowledged: the old version is stale now
            time.sleep(0.6)
            relay.flowing.set()
            deadline = time.monotonic() + 10
            while not any(v > old for v, _ in watcher.seen):
                assert time.monotonic() < deadline, "the watcher never saw the write"
                time.sleep(0.01)
        finally:
            relay.flowing.set()
            watcher.stop()
            relay.close()
    stale = [(v, at) for v, at in watcher.seen if v <= old and at > written]
    assert not stale, f"version {old} confirmed as current {stale[0][1] - written:.2f} s after a newer write"
