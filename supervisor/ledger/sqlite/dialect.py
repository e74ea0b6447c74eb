"""SQLite's SQL where it differs from PostgreSQL's (`supervisor.ledger.dialect`): `?` parameters,
no row locks (each write transaction holds the whole database's write lock), `rowid`, the
functions the backend registers on its connection, and index hints."""

from ..dialect import Dialect

DIALECT = Dialect(name="sqlite", parameter="?", for_update="", for_share="", skip_locked="", row_order="rowid",
                  session_functions="", index_hints=True)
