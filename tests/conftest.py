"""Fixtures every area shares, registered here once: a fake clock, where a test's ledger lives (a
SQLite file, or each backend in turn), the throwaway PostgreSQL server, and, as plugins, the
process fixtures of `faults.py` and the holders of `holders.py`.

Each name means one thing everywhere:

- `clock`: the one fake ledger clock (`worker.testing.FakeClock`), at 1,000,000 ms;
- `sqlite_path`: a SQLite ledger file under `tmp_path` (not yet created);
- `each_backend`: a ledger's location on each backend in turn (a SQLite file, then a fresh
  PostgreSQL database): a test that takes it runs twice;
- `pg_cluster`, `pg_uri`: the session's PostgreSQL server, and a fresh database on it;
- `db_snapshot`: a deterministic dump of a ledger, for "nothing changed" checks.

Each area's conftest.py adds the fixtures of its own tests.
"""

from __future__ import annotations

import os
import sqlite3

import pytest

from worker.testing import FakeClock

pytest_plugins = ["faults", "holders"]


def snapshot(path) -> dict:
    """A deterministic dump of a ledger file: schema version, schema SQL and every table's rows.

    Read through a separate connection, so it sees exactly what other processes would see.
    """
    if isinstance(path, str) and path.startswith("postgresql://"):
        return _pg_snapshot(path)
    path = os.fspath(path)
    if not os.path.exists(path):
        return {}
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        dump: dict = {"user_version": conn.execute("PRAGMA user_version").fetchone()[0]}
        schema = conn.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name"
        ).fetchall()
        dump["schema"] = schema
        for _, name, _, _ in (row for row in schema if row[0] == "table"):
            rows = conn.execute(f'SELECT * FROM "{name}"').fetchall()
            dump[name] = sorted(rows, key=repr)
        return dump
    finally:
        conn.close()


def _pg_snapshot(uri: str) -> dict:
    """`snapshot` of a PostgreSQL ledger: schema version, tables and every table's rows."""
    import psycopg

    with psycopg.connect(uri) as conn:
        tables = [name for (name,) in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
            " ORDER BY table_name").fetchall()]
        dump: dict = {"tables": tables}
        for name in tables:
            dump[name] = sorted(conn.execute(f'SELECT * FROM "{name}"').fetchall(), key=repr)
        return dump


@pytest.fixture
def clock() -> FakeClock:
    """The fake ledger clock (integer ms), moved only when a test says so."""
    return FakeClock(1_000_000)


@pytest.fixture
def sqlite_path(tmp_path):
    """A SQLite ledger file under tmp_path, for the tests of what SQLite alone has."""
    return tmp_path / "ledger.db"


@pytest.fixture
def db_snapshot():
    """`db_snapshot(path)` -> a deterministic dump of every table, for "nothing changed" checks."""
    return snapshot


@pytest.fixture(scope="session")
def pg_cluster():
    """A throwaway PostgreSQL cluster for the whole run, on a Unix socket only (tests/pgcluster.py)."""
    from pgcluster import cluster_fixture

    yield from cluster_fixture()


@pytest.fixture(params=["sqlite", "postgres"])
def each_backend(request, tmp_path):
    """A ledger on each backend in turn: a SQLite file under tmp_path, then a fresh PostgreSQL
    database."""
    return tmp_path / "ledger.db" if request.param == "sqlite" else request.getfixturevalue("pg_uri")


@pytest.fixture
def pg_uri(pg_cluster) -> str:
    """The URI of a fresh, empty database of the test's own."""
    return pg_cluster.new_database()
