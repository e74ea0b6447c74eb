"""A throwaway PostgreSQL cluster, for the tests and the benchmarks: `initdb` in a temporary
folder, listening on a Unix socket only (`listen_addresses=''`, socket owner-only), removed
afterwards.

`initdb` refuses to run as root; as root, every server command runs as the `postgres` user
(`runuser -u postgres --`) in a folder that user owns. Without the server binaries the caller
skips PostgreSQL tests (under `CI=true` a skip is a failure: CI always runs both backends).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from typing import Optional

PG_BIN = os.environ.get("YIELDSTAR_PG_BIN", "/usr/lib/postgresql/15/bin")


def available() -> Optional[str]:
    """None if a cluster can be started here, else why not."""
    if not os.path.isfile(os.path.join(PG_BIN, "initdb")):
        return f"no PostgreSQL server binaries in {PG_BIN} (set YIELDSTAR_PG_BIN)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser, which initdb needs to run as the postgres user"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install 'yieldstar[postgres]')"
    return None


class Cluster:
    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="yieldstar-pg-")
        self.data = os.path.join(self.folder, "data")
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(self.folder, "postgres")
        self.user = "postgres" if self._as_postgres else None
        self._databases = 0

    def _run(self, *args: str, timeout: float = 60) -> None:
        command = [os.path.join(PG_BIN, args[0]), *args[1:]]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed ({done.returncode}): {done.stdout}{done.stderr}")

    def start(self) -> "Cluster":
        self._run("initdb", "-D", self.data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")
        self.start_server()
        return self

    def start_server(self) -> None:
        """Start the server (again): on its Unix socket only, never on a network address."""
        options = (f"-c listen_addresses='' -c unix_socket_directories={self.folder} -c unix_socket_permissions=0700"
                   " -c max_connections=300 -c shared_buffers=32MB")
        self._run("pg_ctl", "-D", self.data, "-o", options, "-l", os.path.join(self.folder, "server.log"), "-w",
                  "start")

    def stop_server(self, mode: str = "fast") -> None:
        """Stop the server, keeping its data: `start_server()` starts it again."""
        self._run("pg_ctl", "-D", self.data, "-m", mode, "-w", "stop")

    def uri(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@/{database}?host={self.folder}"

    def new_database(self) -> str:
        """A fresh, empty database; returns its URI."""
        import psycopg

        self._databases += 1
        name = f"t{os.getpid()}_{self._databases}"
        with psycopg.connect(self.uri(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.uri(name)

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")
        except (RuntimeError, subprocess.TimeoutExpired):
            pass
        shutil.rmtree(self.folder, ignore_errors=True)

