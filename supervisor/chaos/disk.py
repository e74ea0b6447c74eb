"""A disk of the chaos run's own for the ledger, and bursts that fill it (`disk_full`).

As root, the harness mounts a small tmpfs in its work folder and keeps the ledger there (with
its -wal and -shm), so that "the disk is full" can be made true for that file alone, for a few
hundred milliseconds at a time, without touching any other file of the host. A burst fills the
tmpfs to 100% with one filler file (`posix_fallocate` of every free block, so it takes
tens of milliseconds however big the tmpfs is), holds it full, and deletes it.

A full disk fails only writes that need a new block. SQLite rewrites its -wal from the start
after each checkpoint, in blocks the file already has, so a burst first truncates the -wal (a
`wal_checkpoint(TRUNCATE)`, given up after `CHECKPOINT_PATIENCE_MS` if readers hold it): then the
first commit during the burst must grow the -wal, and fails with SQLITE_FULL, as it would on a
host whose disk filled up while the ledger's log was growing.

SQLite maps the -shm file into memory, and the last connection to close deletes it (and the
-wal); the next one to open creates it again, which a full disk fails. So the -shm must exist
before the first burst and stay: `LedgerDisk.pin()` keeps a connection open for the whole run,
after one read (the -shm is then created and mapped). When SQLite grows the -shm it writes to
each new page rather than touching unallocated pages of the mapping, so a full disk makes that a
failed write (SQLITE_FULL), not a SIGBUS.

After the run the ledger is copied off the tmpfs into the work folder (with SQLite's backup, so
the copy holds every committed transaction), and the tmpfs is unmounted, also when the run ends
with an error or a stop signal.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
import threading
import time
from typing import Optional

from ..ledger.errors import InvalidArgument

MOUNT_POINT = "ledger"  # inside the work folder
MIN_SIZE_MB = 256
PER_EXECUTION_KB = 48  # a run's ledger takes 1-2 KB per execution, its -wal some MB: room to spare
CHECKPOINT_PATIENCE_MS = 200
FILL_CHUNK = 64 * 2**20
BLOCK = 4096  # tmpfs allocates whole pages


def size_mb(executions: int) -> int:
    """A tmpfs big enough for a run of `executions`, WAL included, with room to spare."""
    return max(MIN_SIZE_MB, executions * PER_EXECUTION_KB // 1024)


def can_mount() -> Optional[str]:
    """None if this process may mount a tmpfs, else why not."""
    if os.geteuid() != 0:
        return "it needs root (the ledger goes on a tmpfs the harness mounts)"
    return None


class Burst(threading.Thread):
    """One disk-full burst: fill the tmpfs, hold it full for `seconds`, free it.

    `filling_ns`, `full_ns` and `freed_ns` are the wall-clock moments the fill began, the tmpfs
    had no free block left, and the filler was deleted; the checker sets them beside ledger times."""

    def __init__(self, folder: str, db_path: str, seconds: float):
        super().__init__(name="disk-full burst", daemon=True)
        self.folder = folder
        self.db_path = db_path
        self.seconds = seconds
        self.filling_ns = self.full_ns = self.freed_ns = 0
        self.wal_truncated = False
        self.left_bytes: Optional[int] = None  # free bytes once full (0 unless something freed some)
        self.error: Optional[str] = None

    def _truncate_wal(self) -> None:
        conn = sqlite3.connect(self.db_path, timeout=CHECKPOINT_PATIENCE_MS / 1000)
        try:
            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            self.wal_truncated = not busy
        except sqlite3.Error:
            pass  # the ledger is busy: fill the disk anyway, the -wal may have to grow
        finally:
            conn.close()

    def run(self) -> None:
        path = os.path.join(self.folder, f".filler-{os.getpid()}")
        self.filling_ns = time.time_ns()
        self._truncate_wal()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            # Allocate in halving chunks: writers take blocks while this runs, and a chunk that
            # finds too few fails whole (tmpfs undoes it), so the last chunks take what is left.
            offset, chunk = 0, FILL_CHUNK
            while chunk >= BLOCK:
                try:
                    os.posix_fallocate(fd, offset, chunk)
                    offset += chunk
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    chunk //= 2
            self.full_ns = time.time_ns()
            stat = os.statvfs(self.folder)
            self.left_bytes = stat.f_bavail * stat.f_frsize
            time.sleep(self.seconds)
        except OSError as exc:
            self.error = f"could not fill {self.folder}: {exc}"
        finally:
            os.unlink(path)
            os.close(fd)
            self.freed_ns = time.time_ns()

    def as_params(self) -> dict:
        return {"seconds": round(self.seconds, 3), "filling_ms": self.filling_ns // 1_000_000,
                "full_ms": self.full_ns // 1_000_000, "freed_ms": self.freed_ns // 1_000_000,
                "wal_truncated": self.wal_truncated, "left_bytes": self.left_bytes, "error": self.error}


class LedgerDisk:
    """The tmpfs that holds a chaos run's ledger: mounted, pinned, filled in bursts, copied off,
    unmounted."""

    def __init__(self, folder: str, size_mb: int):
        self.folder = folder
        self.mount_point = os.path.join(folder, MOUNT_POINT)
        self.size_mb = size_mb
        self.mounted = False
        self._pin: Optional[sqlite3.Connection] = None

    @property
    def db_path(self) -> str:
        return os.path.join(self.mount_point, "ledger.db")

    def mount(self) -> None:
        os.makedirs(self.mount_point, mode=0o700, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m,mode=0700,nodev,nosuid,noexec",
                               "tmpfs", self.mount_point], capture_output=True, text=True)
        if done.returncode != 0:
            raise InvalidArgument(f"disk_full: could not mount a tmpfs on {self.mount_point}:"
                                  f" {done.stderr.strip() or done.returncode}")
        self.mounted = True

    def pin(self) -> None:
        """Keep the ledger's -shm in place and mapped for the whole run (see the module docstring)."""
        self._pin = sqlite3.connect(self.db_path, timeout=60)
        self._pin.execute("SELECT count(*) FROM executions").fetchone()
        if not os.path.exists(self.db_path + "-shm"):
            raise InvalidArgument(f"disk_full: {self.db_path} has no -shm file; is it in WAL mode?")

    def used_mb(self) -> float:
        stat = os.statvfs(self.mount_point)
        return round((stat.f_blocks - stat.f_bfree) * stat.f_frsize / 2**20, 1)

    def burst(self, seconds: float) -> Burst:
        burst = Burst(self.mount_point, self.db_path, seconds)
        burst.start()
        return burst

    def copy_out(self, target: str) -> None:
        """Copy the ledger off the tmpfs to `target` (owner-only), every committed transaction."""
        fd = os.open(target, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        source = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True, timeout=60)
        copy = sqlite3.connect(target)
        try:
            source.backup(copy)
            copy.execute("PRAGMA journal_mode = WAL")  # as the runtime keeps its ledgers
        finally:
            copy.close()
            source.close()

    def unmount(self) -> Optional[str]:
        """Unmount (lazily if some process still holds a file there); None, or what went wrong."""
        if self._pin is not None:
            self._pin.close()
            self._pin = None
        if not self.mounted:
            return None
        done = subprocess.run(["umount", self.mount_point], capture_output=True, text=True)
        if done.returncode != 0:
            done = subprocess.run(["umount", "-l", self.mount_point], capture_output=True, text=True)
        if done.returncode != 0:
            return f"could not unmount {self.mount_point}: {done.stderr.strip()}"
        self.mounted = False
        try:
            os.rmdir(self.mount_point)
        except OSError:
            pass
        return None
