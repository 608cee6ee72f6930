"""A private PostgreSQL cluster for the session: the fleet store's tests run against a real server.

:func:`pg_cluster` (session-scoped, imported by tests/conftest.py) finds the server binaries
(``initdb`` on PATH, else Debian's ``/usr/lib/postgresql/*/bin``), makes a temporary directory
owned by the ``postgres`` user (the server refuses to run as root: as root every command runs
through ``runuser -u postgres --``; as another user, as that user), runs ``initdb`` with
password authentication on TCP, starts the server on a free loopback port with its Unix socket
inside that directory, and at the end stops it by the PID in ``postmaster.pid`` (SIGINT: a fast
shutdown; SIGKILL after 30 s) and deletes the directory. Before the directory goes, its data
files and WAL are scanned for every canary secret of the session: a hit fails the session.

Tests skip, saying why, only when the binaries are absent (``.ci/run`` installs the Debian
package ``postgresql``). :meth:`Cluster.database` gives each test a fresh database and its URL
(the password in a ``password_file``, never in the URL).

A test that stops the server (an outage) takes :func:`own_pg_cluster` instead: a cluster of its
own, made and scanned the same way (:func:`private_cluster`), so the session's cluster is never
stopped under the other tests. :meth:`Cluster.stop` and :meth:`Cluster.start` stop it (fast
shutdown, by PID) and start it again on the same port and data directory.
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import canary
import pytest

USER = "postgres"


def binaries() -> Path | None:
    """The folder of ``initdb``, ``pg_ctl`` and ``pg_dump``, or None when PostgreSQL is absent."""
    found = shutil.which("initdb")
    if found:
        return Path(os.path.realpath(found)).parent
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    return Path(dirs[-1]) if dirs and (Path(dirs[-1]) / "initdb").exists() else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Cluster:
    bin: Path
    root: Path  # owned by the server's user
    port: int
    password_file: Path  # the superuser's password, outside the data dir
    as_root: bool
    _count: int = field(default=0)

    @property
    def data(self) -> Path:
        return self.root / "data"

    def command(self, *args: str) -> list[str]:
        return (["runuser", "-u", USER, "--"] if self.as_root else []) + list(args)

    def url(self, db: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{db}?password_file={self.password_file}"

    def database(self) -> str:
        """A new, empty database; its URL."""
        import psycopg

        self._count += 1
        name = f"t{self._count}_{secrets.token_hex(3)}"
        with psycopg.connect(self.url_params(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"'.encode())
        return self.url(name)

    def url_params(self, db: str = "postgres") -> str:
        """A libpq string for the tests' own connections (password inline: never a process's argv)."""
        pw = self.password_file.read_text().strip()
        return f"host=127.0.0.1 port={self.port} user={USER} dbname={db} password={pw}"

    def dump(self, url: str) -> bytes:
        """``pg_dump`` of the database of ``url`` (plain SQL), with the password from the environment."""
        db = urlsplit(url).path.lstrip("/")
        env = {**os.environ, "PGPASSWORD": self.password_file.read_text().strip()}
        args = [str(self.bin / "pg_dump"), "-h", "127.0.0.1", "-p", str(self.port), "-U", USER, db]
        done = subprocess.run(self.command(*args), env=env, capture_output=True, timeout=60, check=True)
        return done.stdout

    def pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def start(self) -> None:
        opts = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=on"
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "server.log"),
                  "-o", opts, "-w", "-t", "60", "start")  # fmt: skip

    def stop(self) -> None:
        """SIGINT to the postmaster's PID (fast shutdown), SIGKILL after 30 s."""
        pid = self.pid()
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGINT)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                os.kill(pid, 0)
                time.sleep(0.1)
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _run(self, *args: str) -> None:
        done = subprocess.run(self.command(*args), capture_output=True, text=True, timeout=120)
        if done.returncode:
            raise RuntimeError(f"{args[0]} failed ({done.returncode}): {done.stderr.strip()}")


def _make_root(as_root: bool) -> Path:
    root = Path(tempfile.mkdtemp(prefix="surrogate-pg-"))
    if as_root:
        shutil.chown(root, USER, USER)
    root.chmod(0o700)
    return root


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    with private_cluster() as cluster:
        yield cluster


@pytest.fixture
def own_pg_cluster() -> Iterator[Cluster]:
    """A cluster for one test only (one that stops and starts the server)."""
    with private_cluster() as cluster:
        yield cluster


@contextmanager
def private_cluster() -> Iterator[Cluster]:
    """A new cluster, started; stopped, scanned for canaries and deleted at the end (module docstring)."""
    bindir = binaries()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not installed: apt-get install postgresql")
    as_root = os.geteuid() == 0
    if as_root and shutil.which("runuser") is None:
        pytest.skip("running as root without runuser: the PostgreSQL server cannot run as root")
    root = _make_root(as_root)
    secrets_dir = Path(tempfile.mkdtemp(prefix="surrogate-pgpw-"))
    password = canary.make("pgpw")  # the database password is a secret like any other
    pwfile = canary.source(secrets_dir / "password", password)
    server_pw = canary.source(root / "initdb-password", password)
    if as_root:
        shutil.chown(server_pw, USER, USER)
    cluster = Cluster(bindir, root, _free_port(), pwfile, as_root)
    try:
        auth = ("--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={server_pw}")
        cluster._run(str(bindir / "initdb"), "-D", str(cluster.data), "-U", USER, *auth, "-E", "UTF8",
                     "--locale=C")  # fmt: skip
        server_pw.unlink()
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        hits = canary.scan_tree(root, canary.values(), canary.exempted())
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(secrets_dir, ignore_errors=True)
        assert not hits, f"canary secret in the PostgreSQL data directory: {hits}"
