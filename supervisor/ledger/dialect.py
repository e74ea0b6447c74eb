"""What differs between the backends' SQL, said in one place: `Dialect`.

The table modules (`supervisor.ledger.tables`) write each statement once, for both backends, as
a template: plain SQL where the databases agree, and a named fragment where they differ, which
each backend's `Dialect` fills in (`supervisor.ledger.sqlite.dialect`,
`supervisor.ledger.postgres.dialect`):

    fragment              what it stands for                        SQLite              PostgreSQL
    $p                    a positional parameter                    ?                   %s
    $for_update           the lock of a row a write decides on      (nothing)           FOR UPDATE
    $for_share            the same, shared                          (nothing)           FOR SHARE
    $skip_locked          a claimer's lock, skipping rows others    (nothing)           FOR UPDATE SKIP
                          hold                                                          LOCKED
    $row_order            the column that numbers rows as written   rowid               seq
    $yieldstar_delay      the session's redelivery delay function   yieldstar_delay     pg_temp.yieldstar_delay
    $yieldstar_max        its NULL-keeping maximum                  yieldstar_max       pg_temp.yieldstar_max
    $by_<index>           an index hint for the index `<index>`     INDEXED BY <index>  (nothing)

and one fragment that is the same on both, so that the statuses are spelled in one place
(`values.TERMINAL_STATUSES`):

    $terminal             the terminal statuses as SQL strings      'completed', 'failed', 'cancelled'

SQLite takes a whole-database write lock in every write transaction, so it needs no row locks;
PostgreSQL plans without hints. A `$` that is not a fragment is written `$$`; the templates hold
no `%` (psycopg would read it as a parameter). A statement whose length varies (one `$p` per item
of a list) is built from its template with `str.format` (`{targets}`), then rendered the same way.

A statement is rendered once per dialect, the first time it runs, and kept: on the hot path a
call costs one dictionary lookup (`dialect.statements[TEMPLATE]`), as the statement itself is the
key. A statement the database alone runs (PostgreSQL's session functions, its schema, SQLite's
pragmas) is written in that database's own SQL beside its backend, not as a template.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from string import Template
from typing import Mapping

from .values import TERMINAL_STATUSES

# The indexes a statement may name in a hint (`$by_<index>`): the planner's choice is right on
# PostgreSQL, while SQLite, which keeps no statistics unless ANALYZE ran, may scan the table.
HINTED_INDEXES = ("executions_claimable", "executions_expiring", "executions_by_update",
                  "executions_claimable_by_workflow", "executions_ready_by_workflow",
                  "executions_running_by_queue", "executions_deadline", "executions_claimable_by_key",
                  "executions_ready")
# `$terminal`: the terminal statuses as a list of SQL strings, for `status [NOT] IN (...)`.
TERMINAL_SQL = ", ".join(f"'{status}'" for status in TERMINAL_STATUSES)


class Rendered(dict):
    """Templates and the statements a dialect renders them to, each rendered once, when first
    asked for (`Dialect.statements`)."""

    __slots__ = ("_fragments",)

    def __init__(self, fragments: Mapping[str, str]):
        super().__init__()
        self._fragments = dict(fragments)

    def __missing__(self, template: str) -> str:
        statement = self[template] = Template(template).substitute(self._fragments)
        return statement


@dataclass(frozen=True, slots=True, eq=False)
class Dialect:
    """One backend's SQL where it differs from the other's (see the module docstring)."""

    name: str
    parameter: str
    for_update: str
    for_share: str
    skip_locked: str
    row_order: str
    session_functions: str  # the prefix of the functions each session makes for itself
    index_hints: bool
    statements: Rendered = field(init=False, repr=False)

    def __post_init__(self) -> None:
        hints = {f"by_{index}": f"INDEXED BY {index}" if self.index_hints else "" for index in HINTED_INDEXES}
        object.__setattr__(self, "statements", Rendered({
            "p": self.parameter, "for_update": self.for_update, "for_share": self.for_share,
            "skip_locked": self.skip_locked, "row_order": self.row_order,
            "yieldstar_delay": self.session_functions + "yieldstar_delay",
            "yieldstar_max": self.session_functions + "yieldstar_max",
            "terminal": TERMINAL_SQL, **hints}))
