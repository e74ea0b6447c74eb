"""`open_backend(target)`: the ledger a target names, whichever backend keeps it.

Every caller (the supervisor, its children, the command line, the client, the chaos harness)
opens its ledger here, so that the backend is chosen in one place. A `postgresql://` or
`postgres://` URI names a PostgreSQL database (SPEC section 7); anything else is the path of
a SQLite file.
"""

from __future__ import annotations

import os

from .errors import InvalidArgument
from .sqlite.backend import open_backend as open_sqlite

URI_SCHEMES = ("postgresql://", "postgres://")


def is_uri(target) -> bool:
    return isinstance(target, str) and target.startswith(URI_SCHEMES)


def shown(target) -> str:
    """The target as logs and messages show it: a URI without its password."""
    if is_uri(target):
        from .postgres.connection import redacted

        return redacted(target)
    return str(target)


def anywhere(target):
    """The target as another process opens it, whatever its working folder: a SQLite path made
    absolute; a URI as it is."""
    return target if is_uri(target) else os.path.abspath(target)


def open_backend(target, *, clock=None, redelivery_delay=None, durability="normal", create=True,
                 max_payload_bytes=None):
    """Open the ledger at `target` (see SPEC section 3 for the arguments).

    `max_payload_bytes`: the size limit, in bytes of UTF-8 JSON text, of each payload this client
    writes (an input, a step's result, a result or error, a store's value...); None means
    `arguments.DEFAULT_MAX_PAYLOAD_BYTES` (4 MiB). A larger one raises `PayloadTooLarge` and
    writes nothing. It is this client's own limit, not the ledger's: a client opened with a higher
    one may write what another would refuse, and every client reads whatever is stored."""
    if is_uri(target):
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise InvalidArgument(f"a PostgreSQL ledger ({target.split('://')[0]}://...) needs psycopg 3: pip install"
                                  " 'yieldstar[postgres]'") from None
        from .postgres.backend import PostgresBackend

        return PostgresBackend(target, clock=clock, redelivery_delay=redelivery_delay, durability=durability,
                               create=create, max_payload_bytes=max_payload_bytes)
    if not isinstance(target, (str, os.PathLike)):
        raise InvalidArgument(f"the ledger must be a path (str or os.PathLike), not {type(target).__name__}")
    return open_sqlite(target, clock=clock, redelivery_delay=redelivery_delay, durability=durability,
                       create=create, max_payload_bytes=max_payload_bytes)
