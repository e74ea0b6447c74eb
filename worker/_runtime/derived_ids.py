"""The ids an execution derives from its step keys: effect ids and start-request ids.

An effect id goes to the outside world as an idempotency key, and a start-request id becomes the
child execution's id, so two different (execution id, step key) pairs must never share one: the
provider would charge once for two customers, and a parent would be handed another's child.
"""

from __future__ import annotations

import hashlib

from supervisor.ledger.arguments import MAX_ID_LENGTH

HASHED_PREFIX = 180  # how much of the escaped execution id a hashed id keeps, for readers


def derived_id(execution_id: str, key: str) -> str:
    """The id that step `key` of execution `execution_id` owns: the same on every replay and
    every holder, and never the same for two different (execution id, key) pairs.

    The encoding: escape the execution id (`%` -> `%25`, then `/` -> `%2F`) and join it to the
    key, left as is, with a `/`: `order-42` and `charge` give `order-42/charge`; `cust/7` and
    `charge` give `cust%2F7/charge`; `cust` and `7/charge` give `cust/7/charge`. The first `/`
    splits the id, so an id reads back into exactly one pair. Ids without `/` or `%` read as
    they always did.

    Past 255 characters the id is `escaped_id[:180] + "%#" + sha256(unhashed id)` in hex. An
    escaped execution id never holds `%#` and a hashed id never holds `/`, so a hashed id can
    equal neither an unhashed one nor, short of a SHA-256 collision, another hashed one.
    """
    escaped = execution_id.replace("%", "%25").replace("/", "%2F")
    derived = f"{escaped}/{key}"
    if len(derived) <= MAX_ID_LENGTH:
        return derived
    return f"{escaped[:HASHED_PREFIX]}%#{hashlib.sha256(derived.encode()).hexdigest()}"
