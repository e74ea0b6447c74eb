"""The SQLite ledger under the faults of a real host: many processes opening one new file, unsafe,
foreign and mistyped files, a corrupt page and a full disk.

Real processes, real files, a real (small) file system: the storms fork their openers from one
helper process that has imported Yieldstar and opened nothing (no threads, so forking is safe,
and hundreds of openers start in a moment on a small machine); the full disk is a 1 MB tmpfs,
which only root may mount, so those tests are skipped for other users.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import sqlite3
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from faults import cli, fill_disk, tmpfs
from supervisor import open_backend
from supervisor.ledger import errors
from supervisor.ledger.sqlite import connection
from supervisor.ledger.sqlite.schema import SCHEMA_VERSION, tables_at

pytestmark = pytest.mark.usefixtures("dump_on_hang")

ROOT = Path(__file__).resolve().parents[2]
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (to mount a tmpfs or to chown a file)")

# Forks N openers of one path, releases them together (they all wait for EOF on one pipe), and
# prints one line per opener that failed. Exit 0 only if every opener succeeded.
STORM = textwrap.dedent("""
    import os, sys
    from supervisor import open_backend
    path, n = sys.argv[1], int(sys.argv[2])
    release_r, release_w = os.pipe()
    pids = []
    for i in range(n):
        pid = os.fork()
        if pid == 0:
            os.close(release_w)
            os.read(release_r, 1)
            try:
                open_backend(path).close()
            except BaseException as exc:
                print(f"opener {i}: {type(exc).__name__}: {exc}", flush=True)
                os._exit(1)
            os._exit(0)
        pids.append(pid)
    os.close(release_r)
    os.close(release_w)
    failed = sum(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0 for pid in pids)
    print(f"{failed} of {n} openers failed", flush=True)
    sys.exit(1 if failed else 0)
""")


def storm(path: Path, n: int, *, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", STORM, str(path), str(n)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, stdin=subprocess.DEVNULL)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def listing(folder: Path) -> dict[str, str]:
    """Every file in `folder` with its hash: what "nothing changed, nothing created" compares."""
    return {p.name: digest(p) if p.is_file() and not p.is_symlink() else "link" for p in sorted(folder.iterdir())}


def schema_of(path: Path) -> tuple[int, list[str]]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = [name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        return version, tables
    finally:
        conn.close()


def make_ledger(path: Path, executions: int = 3) -> None:
    with open_backend(path) as ledger:
        for i in range(executions):
            ledger.executions.admit(f"order-{i}", "charge", json.dumps({"order": i}))


# -- finding 8: a start-up storm on one file ------------------------------------------------------


@pytest.mark.timeout(150)
def test_finding_8_many_processes_open_one_new_file_at_once_without_an_error(tmp_path):
    for round_ in range(2):
        path = tmp_path / f"ledger-{round_}.db"
        opened = storm(path, 300, timeout=120)

        assert opened.returncode == 0, opened.stdout + opened.stderr
        assert opened.stdout.strip() == "0 of 300 openers failed"
        # The schema was created once, completely, in a file only its owner may use.
        assert schema_of(path) == (SCHEMA_VERSION, sorted(tables_at(SCHEMA_VERSION)))
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


@pytest.mark.timeout(90)
def test_finding_8_processes_open_a_ledger_while_another_process_holds_its_write_lock(tmp_path):
    """Opening a current ledger takes no write lock, so a start-up storm never queues behind one."""
    path = tmp_path / "ledger.db"
    make_ledger(path)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sqlite3, sys\n"
                               "conn = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
                               "conn.execute('BEGIN IMMEDIATE')\n"
                               "print('held', flush=True)\n"
                               "sys.stdin.read()\n"
                               "conn.execute('ROLLBACK')\n", str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        started = time.monotonic()
        # Well inside the busy timeout (15 s): an opener that waited for the lock would fail.
        opened = storm(path, 100, timeout=60)
        took = time.monotonic() - started

        assert opened.returncode == 0, opened.stdout + opened.stderr
        assert holder.poll() is None, "the write lock was held throughout"
        assert took < connection.BUSY_TIMEOUT_MS / 1000, took
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert holder.returncode == 0


# -- finding 9: files are adopted only if they are safe, and ours --------------------------------


def test_finding_9_a_dangling_symlink_at_the_ledger_path_is_refused_and_nothing_is_created_at_its_target(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = elsewhere / "target.db"
    path = tmp_path / "ledger.db"
    path.symlink_to(target)

    with pytest.raises(errors.UnsafeLedgerFile) as refused:
        open_backend(path)

    assert str(path) in str(refused.value) and "symbolic link" in str(refused.value)
    assert not target.exists() and list(elsewhere.iterdir()) == []
    assert path.is_symlink()


def test_finding_9_a_a_symlink_to_a_real_ledger_is_refused_and_the_ledger_is_unchanged(tmp_path):
    real = tmp_path / "real.db"
    make_ledger(real)
    path = tmp_path / "ledger.db"
    path.symlink_to(real)
    before = listing(tmp_path)

    with pytest.raises(errors.UnsafeLedgerFile, match="symbolic link"):
        open_backend(path)

    assert listing(tmp_path) == before


@pytest.mark.parametrize("mode", [0o644, 0o666, 0o640, 0o604, 0o660], ids=lambda mode: f"{mode:04o}")
def test_finding_9_b_a_ledger_open_to_other_users_is_refused_saying_how_to_fix_it(tmp_path, mode):
    path = tmp_path / "ledger.db"
    make_ledger(path)
    path.chmod(mode)
    before = listing(tmp_path)

    with pytest.raises(errors.UnsafeLedgerFile) as refused:
        open_backend(path)

    message = str(refused.value)
    assert str(path) in message and f"{mode:04o}" in message and f"chmod 600 {path}" in message
    assert listing(tmp_path) == before and stat.S_IMODE(path.stat().st_mode) == mode
    path.chmod(0o600)  # as the message says
    with open_backend(path) as ledger:
        assert ledger.executions.get("order-0").status == "admitted"


@AS_ROOT
def test_finding_9_b_another_users_ledger_is_refused(tmp_path):
    nobody = pwd.getpwnam("nobody")
    path = tmp_path / "ledger.db"
    make_ledger(path)
    os.chown(path, nobody.pw_uid, nobody.pw_gid)
    before = listing(tmp_path)

    with pytest.raises(errors.UnsafeLedgerFile) as refused:
        open_backend(path)

    message = str(refused.value)
    assert str(path) in message and "nobody" in message and "chown" in message
    assert listing(tmp_path) == before


@pytest.mark.parametrize("suffix", ["-wal", "-shm"])
def test_finding_9_b_a_loose_wal_or_shm_file_is_refused(tmp_path, suffix):
    path = tmp_path / "ledger.db"
    with open_backend(path) as first:  # keeps the -wal and -shm files in place
        first.executions.admit("order-1", "charge")
        companion = tmp_path / f"ledger.db{suffix}"
        companion.chmod(0o644)

        with pytest.raises(errors.UnsafeLedgerFile) as refused:
            open_backend(path)

        assert str(companion) in str(refused.value) and f"chmod 600 {companion}" in str(refused.value)
        assert first.executions.get("order-1").status == "admitted"


def test_finding_9_b_a_symlinked_wal_file_is_refused(tmp_path):
    path = tmp_path / "ledger.db"
    make_ledger(path)  # closed: SQLite removed its -wal and -shm
    target = tmp_path / "elsewhere"
    (tmp_path / "ledger.db-wal").symlink_to(target)

    with pytest.raises(errors.UnsafeLedgerFile, match="symbolic link"):
        open_backend(path)

    assert not target.exists()


def test_the_ledger_and_its_wal_and_shm_are_owner_only_whatever_the_umask(tmp_path):
    path = tmp_path / "ledger.db"
    show_modes = ("import os, sys\n"
                  "from supervisor import open_backend\n"
                  "with open_backend(sys.argv[1]) as ledger:\n"
                  "    ledger.executions.admit('order-1', 'charge')\n"
                  "    print({s: oct(os.stat(sys.argv[1] + s).st_mode & 0o777) for s in ('', '-wal', '-shm')})\n")
    shown = subprocess.run([sys.executable, "-c", show_modes, str(path)], capture_output=True, text=True,
                           timeout=60, cwd=ROOT, umask=0)

    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == str({"": "0o600", "-wal": "0o600", "-shm": "0o600"})


def foreign_database(path: Path, *statements: str) -> Path:
    """An SQLite file made by another program, owner-only so that only its contents are judged."""
    conn = sqlite3.connect(path)
    for statement in statements:
        conn.execute(statement)
    conn.commit()
    conn.close()
    path.chmod(0o600)
    return path


@pytest.mark.parametrize("journal_mode", ["delete", "wal"])
def test_finding_9_c_a_foreign_sqlite_file_stays_byte_for_byte_unchanged(tmp_path, journal_mode):
    path = foreign_database(tmp_path / "customers.db", f"PRAGMA journal_mode = {journal_mode}",
                            "CREATE TABLE customers (name TEXT)", "INSERT INTO customers VALUES ('alice')")
    before = digest(path)

    with pytest.raises(errors.NotALedger) as refused:
        open_backend(path)

    assert digest(path) == before
    if journal_mode == "delete":  # no file appeared beside it either
        assert sorted(p.name for p in tmp_path.iterdir()) == ["customers.db"]
    assert str(path) in str(refused.value) and "customers" in str(refused.value)


@pytest.mark.parametrize("user_version", [1, SCHEMA_VERSION + 6])
def test_finding_9_c_a_foreign_sqlite_file_with_a_schema_version_stays_unchanged(tmp_path, user_version):
    path = foreign_database(tmp_path / "app.db", "CREATE TABLE settings (key TEXT, value TEXT)",
                            f"PRAGMA user_version = {user_version}")
    before = listing(tmp_path)

    with pytest.raises(errors.NotALedger) as refused:
        open_backend(path)

    assert listing(tmp_path) == before
    assert str(path) in str(refused.value)


@pytest.mark.parametrize("mode", [0o644, 0o600])
def test_a_file_that_is_no_database_is_reported_as_not_a_ledger_whatever_its_mode(tmp_path, mode):
    # "Not a ledger, check the path" is what helps; "chmod 600" would only lead to that next.
    path = tmp_path / "notes.db"
    path.write_text("shopping: milk, eggs\n")
    path.chmod(mode)
    before = digest(path)
    with pytest.raises(errors.NotALedger, match="not an SQLite database"):
        open_backend(path)
    assert digest(path) == before


def test_a_file_that_is_not_a_database_is_refused_unchanged(tmp_path):
    path = tmp_path / "notes.db"
    path.write_text("shopping: milk, eggs\n")
    path.chmod(0o600)
    before = listing(tmp_path)

    with pytest.raises(errors.NotALedger, match=str(path)):
        open_backend(path)

    assert listing(tmp_path) == before


def test_a_newer_schema_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "ledger.db"
    make_ledger(path)
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()

    with pytest.raises(errors.SchemaTooNew) as refused:
        open_backend(path)

    assert str(path) in str(refused.value) and "upgrade" in str(refused.value)


HALF_DONE = """
import os, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA cache_size = 2")  # the transaction spills into the file: its journal is hot
conn.execute("BEGIN")
for i in range(2000):
    conn.execute("INSERT INTO stores VALUES (?, ?, 1, 0, 0)", (f"store-{i}", "x" * 500))
os._exit(0)  # dies mid-transaction
"""


def test_a_ledger_left_with_a_half_done_transaction_by_a_killed_process_still_opens(tmp_path):
    """A read-only look cannot roll back a hot journal; the writer that opens next does."""
    path = tmp_path / "ledger.db"
    make_ledger(path, executions=2)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode = DELETE").fetchone() == ("delete",)
    conn.close()
    subprocess.run([sys.executable, "-c", HALF_DONE, str(path)], check=True, timeout=60)
    assert (tmp_path / "ledger.db-journal").stat().st_size > 0

    with open_backend(path) as ledger:
        assert [r.execution_id for r in ledger.executions.list()] == ["order-1", "order-0"]
        assert ledger.stores.list() == []
        assert ledger.connection.raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)


@pytest.mark.timeout(90)
def test_finding_9_d_read_only_commands_on_a_missing_path_create_nothing_and_say_no_ledger_at(tmp_path):
    path = tmp_path / "mistyped.db"
    with pytest.raises(errors.NoLedger) as refused:
        open_backend(path, create=False)
    assert str(refused.value) == f"no ledger at {path}"

    for command in (["ls"], ["get", "order-1"], ["steps", "order-1"], ["history", "order-1"], ["store", "ls"],
                    ["store", "get", "mail"], ["wake", "order-1"]):
        result = cli(path, *command)

        assert (result.returncode, result.stdout, result.stderr) == (2, "", f"yieldstar: no ledger at {path}\n"), command
        assert list(tmp_path.iterdir()) == [], command


def test_read_only_commands_still_read_an_existing_ledger(tmp_path):
    path = tmp_path / "ledger.db"
    make_ledger(path, executions=2)

    listed = cli(path, "ls", "--json")

    assert listed.returncode == 0, listed.stderr
    assert [r["execution_id"] for r in json.loads(listed.stdout)] == ["order-1", "order-0"]


def corrupt_the_executions_table(path: Path) -> None:
    """Overwrite the header of the page that holds the executions table's rows with garbage."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # every row is in the main file
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        [root] = conn.execute("SELECT rootpage FROM sqlite_master WHERE type = 'table' AND name = 'executions'")
    finally:
        conn.close()
    with open(path, "r+b") as f:
        f.seek((root[0] - 1) * page_size)
        f.write(b"\xff" * 64)


def test_finding_9_e_a_corrupt_page_is_reported_as_corruption_naming_the_file(tmp_path):
    path = tmp_path / "ledger.db"
    make_ledger(path, executions=20)
    corrupt_the_executions_table(path)

    with open_backend(path) as ledger:  # the schema is intact: only the rows are damaged
        for call in (lambda: ledger.executions.get("order-7"),            # a read
                     lambda: ledger.executions.admit("order-99", "charge"),  # a write
                     lambda: ledger.executions.claim_due(limit=5, duration=30_000),
                     lambda: ledger.executions.list()):
            with pytest.raises(errors.StorageCorrupt) as raised:
                call()

            message = str(raised.value)
            assert str(path) in message and "integrity_check" in message and ".recover" in message
            assert raised.value.transient is False and raised.value.kind == "corrupt"
            assert not ledger.connection.raw.in_transaction


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_ledger_deleted_or_replaced_while_in_use_is_reported_as_gone(tmp_path, monkeypatch, how):
    path = tmp_path / "ledger.db"
    with open_backend(path) as ledger:
        ledger.executions.admit("order-1", "charge")
        monkeypatch.chdir(tmp_path.parent)  # the check does not depend on the working folder
        assert ledger.executions.admit("order-2", "charge").status == "admitted"
        if how == "deleted":
            path.unlink()
        else:
            make_ledger(tmp_path / "other.db")
            (tmp_path / "other.db").rename(path)

        with pytest.raises(errors.LedgerGone) as raised:
            ledger.executions.admit("order-3", "charge")

        assert str(path) in str(raised.value) and how in str(raised.value)
        assert raised.value.transient is False and raised.value.kind == "gone"


def put_another_file_at(path: Path) -> None:
    """Replace the file at `path` by a copy of it (a new inode), as a restore or a sync tool would."""
    other = path.with_name(path.name + ".other")
    fd = os.open(other, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, path.read_bytes())
    finally:
        os.close(fd)
    other.rename(path)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["deleted", "replaced"])
@pytest.mark.parametrize("suffix", ["-wal", "-shm"])
def test_a_wal_or_shm_deleted_or_replaced_while_in_use_refuses_writes_within_a_second(tmp_path, suffix, how):
    path = tmp_path / "ledger.db"
    companion = Path(f"{path}{suffix}")
    with open_backend(path) as ledger:
        ledger.executions.admit("order-0", "charge")
        if how == "deleted":
            companion.unlink()
        else:
            put_another_file_at(companion)
        changed_at = time.monotonic()

        with pytest.raises(errors.LedgerGone) as looked:
            ledger.check_files()  # what a supervisor's loop asks once a second: it only looks
        n = 0
        with pytest.raises(errors.LedgerGone) as refused:
            while time.monotonic() < changed_at + 5:
                n += 1
                ledger.executions.admit(f"order-{n}", "charge")
        took = time.monotonic() - changed_at
        with pytest.raises(errors.LedgerGone):
            ledger.executions.admit("order-later", "charge")  # and so is every later write

    assert took < connection.FILE_CHECK_S + 0.5, took
    for error in (looked.value, refused.value):
        message = str(error)
        assert f"its {suffix} file {companion} was {how}" in message, message
        assert "since its last checkpoint is gone" in message and "Stop every process using the ledger" in message
        assert error.transient is False and error.kind == "gone"
    with open_backend(path) as reader:
        written = {r.execution_id for r in reader.executions.list()}
    assert f"order-{n}" not in written and "order-later" not in written


# A worker's view: step writes on a lease of its own until the test deletes the -wal, then on
# until one is refused; prints which, how long after, and the error.
STEP_WRITER = """
import json, sys, time
from supervisor import open_backend
from supervisor.ledger.errors import LedgerGone
with open_backend(sys.argv[1]) as backend:
    backend.executions.admit("order", "charge")
    (lease,) = backend.executions.claim_due(limit=1, duration=600_000)
    def step(key):
        backend.heap.write_step(lease, step_key=key, step_attempt=1, done=True, step_response_json="1")
    step("first")
    print("ready", flush=True)
    sys.stdin.readline()
    changed_at, n = time.monotonic(), 0
    try:
        while time.monotonic() < changed_at + 5:
            n += 1
            step(f"step-{n}")
    except LedgerGone as exc:
        print(json.dumps({"refused": f"step-{n}", "took": time.monotonic() - changed_at, "error": str(exc)}))
"""


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_process_whose_wal_is_deleted_refuses_its_next_step_writes_within_a_second(tmp_path):
    path = tmp_path / "ledger.db"
    writer = subprocess.Popen([sys.executable, "-c", STEP_WRITER, str(path)], cwd=ROOT, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert writer.stdout.readline() == "ready\n", writer.stderr.read()
        Path(f"{path}-wal").unlink()
        writer.stdin.write("deleted\n")
        writer.stdin.flush()
        out, err = writer.communicate(timeout=30)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    assert writer.returncode == 0 and out.strip(), out + err
    result = json.loads(out)

    assert result["took"] < connection.FILE_CHECK_S + 0.5, result
    assert f"its -wal file {path}-wal was deleted" in result["error"], result["error"]
    assert "since its last checkpoint is gone" in result["error"]
    with open_backend(path) as reader:
        assert result["refused"] not in {step.step_key for step in reader.heap.steps("order")}


# -- a full disk ---------------------------------------------------------------------------------


def fill(folder: Path) -> Path:
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        fill_disk(fd)
    finally:
        os.close(fd)
    return filler


@AS_ROOT
@pytest.mark.timeout(60)
def test_a_full_disk_during_a_write_raises_storage_unavailable_and_the_connection_stays_usable(tmp_path):
    with tmpfs(tmp_path / "small", "1m") as disk:
        path = disk / "ledger.db"
        with open_backend(path) as ledger:
            ledger.executions.admit("order-1", "charge")
            filler = fill(disk)
            big = json.dumps("x" * 200_000)

            for call in (lambda: ledger.executions.admit("order-2", "charge", big),
                         lambda: open_backend(disk / "new.db")):  # opening is transient too: not NotALedger
                with pytest.raises(errors.StorageUnavailable) as raised:
                    call()
                assert "disk" in str(raised.value) and str(disk) in str(raised.value)
                assert raised.value.transient is True
            assert not ledger.connection.raw.in_transaction
            assert ledger.executions.get("order-2") is None  # rolled back

            filler.unlink()
            assert ledger.executions.admit("order-2", "charge", big).status == "admitted"
            assert [r.execution_id for r in ledger.executions.list()] == ["order-2", "order-1"]
        with open_backend(disk / "new.db") as fresh:
            assert fresh.executions.list() == []


OPEN_AND_CLOSE = """
import sys
from supervisor import open_backend
with open_backend(sys.argv[1]) as backend:
    backend.executions.admit(sys.argv[2], "w")
"""


@pytest.mark.timeout(60)
def test_a_second_backend_in_one_process_leaves_the_first_ones_locks_in_place(tmp_path):
    # Closing any descriptor of a file drops the process's POSIX locks on it, SQLite's included.
    # A supervisor opens two backends; if the second one's file check closed a descriptor, the
    # first connection's shared lock would be gone, and another process's last close would take
    # itself for the last reader: checkpoint, and delete the -wal and -shm still in use here.
    db = tmp_path / "ledger.db"
    first = open_backend(db)
    second = open_backend(db)
    try:
        first.executions.admit("mine", "w")
        subprocess.run([sys.executable, "-c", OPEN_AND_CLOSE, str(db), "theirs"], check=True, timeout=30)
        assert os.path.exists(f"{db}-wal") and os.path.exists(f"{db}-shm"), "another process's close deleted them"
        first.executions.admit("mine-after", "w")
        second.executions.admit("second-after", "w")
    finally:
        second.close()
        first.close()
    with open_backend(db) as reader:
        assert {r.execution_id for r in reader.executions.list()} == {"mine", "theirs", "mine-after", "second-after"}
