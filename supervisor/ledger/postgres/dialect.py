"""PostgreSQL's SQL where it differs from SQLite's (`supervisor.ledger.dialect`): psycopg's `%s`
parameters, row locks (`FOR UPDATE`, `FOR SHARE`, and `FOR UPDATE SKIP LOCKED` for claims), the
`seq` column that numbers rows as SQLite's rowid does, the functions each session makes in its
own temporary schema (`connection.SESSION_FUNCTIONS`), and no index hints."""

from ..dialect import Dialect

DIALECT = Dialect(name="postgres", parameter="%s", for_update="FOR UPDATE", for_share="FOR SHARE",
                  skip_locked="FOR UPDATE SKIP LOCKED", row_order="seq", session_functions="pg_temp.",
                  index_hints=False)
