"""Copies of a SQLite ledger: `backup` taken online, `restore` put back without reissuing a token.

`backup(path, dest)` copies the ledger with SQLite's online backup API in one step: one read
transaction, so the copy is one consistent moment of the ledger while supervisors go on writing
(a WAL reader blocks no writer). The copy is a new owner-only file in rollback-journal mode,
complete in itself (no -wal beside it), and checked (`PRAGMA quick_check`) before it is kept.

`restore(src, path)` puts a backup in place of the ledger. A backup has forgotten every claim
made after it was taken, and those claims' holders may still carry their tokens; counting on
from the backup would issue those tokens again. So the restore raises the ledger's epoch
(`supervisor.ledger.tables.epochs`) above both the backup's and the replaced ledger's: every
token issued from then on is above every token issued before, whether the backup recorded it
or not, and the deliveries the backup shows open end as `fenced` and are delivered again. In
steps:

1. The backup must be a Yieldstar ledger of this user, private, of a schema this Yieldstar reads;
   the ledger it replaces, if there is one, must be one too (nothing else is overwritten).
2. No process may have the ledger open (a supervisor, its workers, a client, a command):
   refused, naming them, until they are stopped.
3. The backup is copied to a new file beside the ledger, its schema brought up to date and its
   epoch raised there, in rollback-journal mode so that the file is whole on its own.
4. The replaced ledger's -wal and -shm go (they belong to the file being replaced; kept, SQLite
   would apply them to the restored one), and the copy is renamed over the ledger in one step.

The folder is trusted, as for every ledger (`files`). Both are made for a process that has no
backend of the ledger open (the `yieldstar backup` and `restore` commands): closing the copy's
own descriptors of the ledger would drop such a backend's SQLite locks (see `files`).
"""

from __future__ import annotations

import os
import sqlite3
import urllib.parse
from typing import Optional

import psutil

from ..errors import InvalidArgument, LedgerInUse, NotALedger
from ..tables import epochs
from . import files
from .connection import probe
from .schema import recognise

COMPANIONS = ("-wal", "-shm")


def backup(path: str, dest: str) -> int:
    """Copy the ledger at `path` into a new file `dest`, consistently, while it is in use.
    Returns the copy's size in bytes.

    Raises:
        InvalidArgument: `dest` exists already, or its folder does not.
        NoLedger, NotALedger, UnsafeLedgerFile, SchemaTooNew: `path` is no ledger of this user's.
        StorageError: reading the ledger or writing the copy failed (the copy is removed).
    """
    path, dest = os.fspath(path), os.fspath(dest)
    hold = files.check_ledger_file(path, create=False)
    try:
        probe(path, lambda db: recognise(db, path))
        _create_private(dest, "the backup")
        try:
            _copy(path, dest)
        except BaseException:
            _remove(dest)
            raise
    finally:
        hold.release()
    return os.path.getsize(dest)


def restore(src: str, path: str) -> int:
    """Replace the ledger at `path` (or create it) with the backup `src`, raising its epoch
    (see the module docstring). Returns the restored ledger's new epoch.

    Raises:
        LedgerInUse: a process has the ledger open; the message names it.
        NoLedger, NotALedger, UnsafeLedgerFile, SchemaTooNew: `src` (or the ledger it would
            replace) is no ledger of this user's.
        StorageError: copying failed (the ledger is left as it was).
    """
    from .backend import SqliteBackend

    src, path = os.fspath(src), os.fspath(path)
    if os.path.realpath(src) == os.path.realpath(path):
        raise InvalidArgument(f"the backup {src} is the ledger itself: give the path of a copy made by yieldstar backup")
    hold = files.check_ledger_file(src, create=False)
    try:
        probe(src, lambda db: recognise(db, src))
    finally:
        hold.release()
    _refuse_if_open(path)
    replaced_epoch = _replaced_epoch(path)
    copy = f"{path}.restoring-{os.getpid()}"
    _create_private(copy, "the restored copy")
    try:
        _copy(src, copy)
        with SqliteBackend(copy) as restored:  # brings the schema up to date
            with restored.connection.write() as db:  # above the backup's epoch, and the replaced ledger's
                epoch = epochs.raise_epoch(db, restored.connection.dialect.statements, restored.clock(),
                                           reason="restored", above=replaced_epoch)
            restored.connection.raw.execute("PRAGMA journal_mode = DELETE")  # whole in one file
        _refuse_if_open(path)  # again: one may have started while the copy was made
        for suffix in COMPANIONS:
            _remove(path + suffix)
        os.replace(copy, path)
    except BaseException:
        _remove(copy)
        raise
    _sync_folder(path)
    return epoch


def _copy(src: str, dest: str) -> None:
    """Copy the ledger `src` into the empty file `dest` in one read transaction, and check it."""
    source = sqlite3.connect("file:" + urllib.parse.quote(os.path.abspath(src)) + "?mode=ro", uri=True)
    try:
        target = sqlite3.connect(dest, isolation_level=None)
        try:
            source.backup(target)
            target.execute("PRAGMA journal_mode = DELETE")
            problems = [row[0] for row in target.execute("PRAGMA quick_check").fetchall()]
            if problems != ["ok"]:
                raise NotALedger(f"the copy of {src} does not check out: {'; '.join(problems[:3])}")
        finally:
            target.close()
    finally:
        source.close()
    fd = os.open(dest, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _epoch(db: sqlite3.Connection, path: str) -> int:
    version = recognise(db, path)
    if not version or not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'epochs'").fetchone():
        return 0  # a ledger from before epochs ran in epoch 0
    return db.execute("SELECT COALESCE(max(epoch), 0) FROM epochs").fetchone()[0]


def _replaced_epoch(path: str) -> int:
    """The epoch of the ledger a restore replaces (0 if there is none yet)."""
    if not os.path.lexists(path):
        return 0
    hold = files.check_ledger_file(path, create=False)
    try:
        return probe(path, lambda db: _epoch(db, path)) or 0
    except NotALedger as exc:
        raise NotALedger(f"{exc}; restore does not overwrite it") from None
    finally:
        hold.release()


def _refuse_if_open(path: str) -> None:
    """Raise `LedgerInUse` if any other process has the ledger or its -wal or -shm open."""
    names = {os.path.realpath(path + suffix) for suffix in ("", *COMPANIONS)}
    users = []
    for process in psutil.process_iter(["pid", "name", "cmdline"]):
        if process.pid == os.getpid():
            continue
        try:
            if any(f.path in names for f in process.open_files()):
                users.append(f"{process.pid} ({' '.join(process.info['cmdline'] or [process.info['name']])[:80]})")
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue  # another user's (who cannot open an owner-only ledger), or gone
    if users:
        shown = "; ".join(users[:5]) + (f"; and {len(users) - 5} more" if len(users) > 5 else "")
        raise LedgerInUse(f"the ledger {path} is in use by process {shown}: stop every supervisor, worker and client"
                          f" using it, then restore")


def _create_private(path: str, what: str) -> None:
    try:
        files.create_owner_only(path)
    except FileExistsError:
        raise InvalidArgument(f"{what} {path} already exists: give a path that does not") from None
    except FileNotFoundError:
        raise InvalidArgument(f"{what} {path}: the folder {os.path.dirname(path) or '.'} does not exist") from None


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _sync_folder(path: str) -> None:
    fd: Optional[int] = None
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        os.fsync(fd)
    except OSError:
        pass  # the rename is done; only its durability across a power loss is at stake
    finally:
        if fd is not None:
            os.close(fd)
