"""The ledger: the durable record every supervisor and child reads and writes.

    contract.py   the interface every backend implements (SPEC sections 3, 4 and 8)
    values.py     the records and replies it returns
    errors.py     the errors it raises (`StorageError` and its kinds among them)
    arguments.py  the checks of its arguments, shared by every backend
    backends.py   `open_backend(target)`: a SQLite path or a PostgreSQL URI
    tables/       the tables' statements and logic, written once for both backends
    sqlite/       the embedded default: one file, its connection, schema and nudges
    postgres/     several hosts on one database: its connection, schema and LISTEN/NOTIFY

The worker (child) side imports only the contract, the values, the errors and `open_backend`.
"""
