"""Argument checks shared by every ledger entry point.

Each check raises `InvalidArgument` (a `ValueError`) naming the argument, before anything is
written, so bad input never changes the database.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Mapping
from typing import Any, Optional

from .errors import InvalidArgument, PayloadTooLarge
from .values import ExecutionLease

MAX_ID_LENGTH = 255
# A diverged replay's detail (`Suspended.diverged`): one line naming two step keys (at most
# MAX_ID_LENGTH each) and what the replay found, with room to spare; a longer one is refused,
# not cut, so that what an operator reads is what the worker said.
MAX_DETAIL_LENGTH = 2000


# The times the ledger holds, in ms since the epoch: from the epoch to the end of year 9999 (what
# an ISO-8601 time, a datetime and every reader of the ledger can show).
MIN_TIME_MS, MAX_TIME_MS = 0, 253_402_300_799_999
LAST_TIME = "253402300799999 (9999-12-31T23:59:59.999Z)"
TIME_RANGE = f"0 (1970-01-01T00:00:00Z) to {LAST_TIME}"


def identifier(name: str, value: Any) -> str:
    """A str of at most 255 characters, not blank (only spaces), with no control characters."""
    if not isinstance(value, str):
        raise InvalidArgument(f"{name} must be a str, not {type(value).__name__}")
    if not value:
        raise InvalidArgument(f"{name} must not be empty")
    if not value.strip():
        raise InvalidArgument(f"{name} {value!r} is blank: it needs a character other than a space")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidArgument(f"{name} is {len(value)} characters long; at most {MAX_ID_LENGTH} are allowed")
    if _CONTROL.search(value):
        raise InvalidArgument(f"{name} {value!r} contains a control character")
    return value


def detail(name: str, value: Any) -> str:
    """A non-empty (not only blank) str of at most MAX_DETAIL_LENGTH characters."""
    if not isinstance(value, str):
        raise InvalidArgument(f"{name} must be a str, not {type(value).__name__}")
    if not value.strip():
        raise InvalidArgument(f"{name} must not be empty")
    if len(value) > MAX_DETAIL_LENGTH:
        raise InvalidArgument(f"{name} is {len(value)} characters long; at most {MAX_DETAIL_LENGTH} are allowed")
    return value


def integer(name: str, value: Any, *, minimum: Optional[int] = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(f"{name} must be an int, not {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise InvalidArgument(f"{name} must be >= {minimum}, got {value}")
    return value


# A timeout (ms) at most this long: a deadline (admission + timeout) then fits a 64-bit column
# however late the admission; 2**53 ms is some 285,000 years, beyond any real one.
MAX_TIMEOUT_MS = 2 ** 53


def timeout_ms(name: str, value: Any) -> Optional[int]:
    """A ledger timeout: None, or an int of ms >= 1."""
    if value is None:
        return None
    integer(name, value, minimum=1)
    if value > MAX_TIMEOUT_MS:
        raise InvalidArgument(f"{name} must be at most {MAX_TIMEOUT_MS} ms, got {value}")
    return value


def seconds_to_ms(name: str, seconds: Any) -> Optional[int]:
    """An SDK timeout in seconds (None: none) as the ledger's ms, refusing what is no positive
    finite number (a bool included: `timeout=True` is a mistake, not one second)."""
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
            or seconds <= 0:
        raise InvalidArgument(f"{name} must be None or a number of seconds > 0, got {seconds!r}")
    ms = max(1, round(seconds * 1000))  # a timeout under a ms is one ms, not none
    if ms > MAX_TIMEOUT_MS:
        raise InvalidArgument(f"{name} must be at most {MAX_TIMEOUT_MS // 1000} seconds, got {seconds!r}")
    return ms


def time_ms(name: str, value: Any) -> int:
    """A time in ms since the epoch that the ledger can hold (MIN_TIME_MS to MAX_TIME_MS)."""
    integer(name, value)
    if not MIN_TIME_MS <= value <= MAX_TIME_MS:
        raise InvalidArgument(f"{name} {value} is outside the times the ledger holds: {TIME_RANGE}, in ms since the"
                              " epoch")
    return value


def lease(name: str, value: Any) -> ExecutionLease:
    """An `ExecutionLease` whose fields the fence can compare as they are: a str execution id and
    a 64-bit int token (SQLite would convert a token "1" to 1 and let it through the fence, and
    refuse one beyond 64 bits with an `OverflowError`)."""
    if not isinstance(value, ExecutionLease):
        raise InvalidArgument(f"{name} must be an ExecutionLease, not {type(value).__name__}")
    token = value.token
    if not isinstance(value.execution_id, str) or type(token) is not int or not -2**63 <= token < 2**63:
        raise InvalidArgument(f"{name} must hold a str execution_id and a 64-bit int token, not {value!r}")
    return value


def workflows(name: str, value: Any) -> Optional[frozenset[str]]:
    """None (any workflow), or a collection of workflow names (each checked as an `identifier`)
    as a frozenset. A bare str is refused, not read as its characters, and so is a mapping; an
    empty collection is allowed (it matches nothing)."""
    if value is None:
        return None
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Collection):
        raise InvalidArgument(f"{name} must be None or a collection of workflow names (a set, list or tuple of str),"
                              f" not {type(value).__name__}")
    for item in value:
        identifier(f"{name} item", item)
    return frozenset(value)


def boolean(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{name} must be a bool, not {type(value).__name__}")
    return value


def _reject_constant(token: str) -> Any:
    raise ValueError(f"{token} is not a JSON value (JSON has no NaN or Infinity)")


# Built once: json.loads(..., parse_constant=...) would build a decoder on every call, and these
# checks run on every fenced write.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


# The default size limit of one payload: 4 MiB of UTF-8 JSON text (Temporal refuses a payload
# above 4 MB). A payload is read whole into memory by every process that reads its row (a
# worker replaying, `yieldstar get`, a client's `result()`), so one of 50 MB costs each of them
# hundreds of MB; a value that large belongs in a file or an object store, its key in the ledger.
DEFAULT_MAX_PAYLOAD_BYTES = 4 * 1024 * 1024


def max_payload_bytes(name: str, value: Any) -> int:
    """A payload limit: None (the default, `DEFAULT_MAX_PAYLOAD_BYTES`) or an int of bytes >= 1."""
    if value is None:
        return DEFAULT_MAX_PAYLOAD_BYTES
    return integer(name, value, minimum=1)


def utf8_size(text: str) -> int:
    """The length of `text` in bytes of UTF-8 (a lone surrogate counted as the 3 bytes it takes)."""
    return len(text.encode("utf-8", "surrogatepass"))


def within_limit(text: str, limit: Optional[int]) -> bool:
    """Whether `text` is at most `limit` bytes of UTF-8 (None: no limit).

    The one place the limit is checked. A code point takes 1 to 4 bytes of UTF-8, so `len(text)`
    is a lower bound of the size and `4 * len(text)` an upper one: the text is encoded only when
    those two disagree about the answer, which no payload under a quarter of the limit does.
    """
    return limit is None or 4 * len(text) <= limit or (len(text) <= limit and utf8_size(text) <= limit)


def payload(name: str, text: str, limit: Optional[int], *, setting: str = "max_payload_bytes") -> str:
    """`text` if it is within `limit` bytes of UTF-8 (None: no limit), else `PayloadTooLarge`
    naming `name`, and `setting` as what sets the limit."""
    if within_limit(text, limit):
        return text
    raise PayloadTooLarge(name, utf8_size(text), limit, setting)


def json_text(name: str, value: Any, *, limit: Optional[int] = None) -> str:
    """Valid JSON text (NaN and Infinity, which Python would accept, are refused) of at most
    `limit` bytes (checked first: an oversized text is refused before it is parsed)."""
    if not isinstance(value, str):
        raise InvalidArgument(f"{name} must be a JSON str, not {type(value).__name__}")
    payload(name, value, limit)
    try:
        _DECODER.decode(value)
    except ValueError as exc:
        raise InvalidArgument(f"{name} is not valid JSON: {exc}") from None
    return value


# A start's trace context (`trace_context`): a propagator's carrier, a few hundred characters at
# most in practice (a W3C `traceparent` is 55, a `tracestate` at most 512); room for baggage too.
MAX_TRACE_CONTEXT_LENGTH = 16_384


def trace_context(name: str, value: Any) -> Optional[str]:
    """None, or the JSON text of an object whose values are str (an OpenTelemetry propagator's
    carrier, as `worker._runtime.tracing` writes it), at most MAX_TRACE_CONTEXT_LENGTH characters."""
    if value is None:
        return None
    json_text(name, value)
    if len(value) > MAX_TRACE_CONTEXT_LENGTH:
        raise InvalidArgument(f"{name} is {len(value)} characters long; at most {MAX_TRACE_CONTEXT_LENGTH} are"
                              " allowed")
    carrier = json.loads(value)
    if not isinstance(carrier, dict) or not all(isinstance(item, str) for item in carrier.values()):
        raise InvalidArgument(f"{name} must be a JSON object of str values (a propagator's carrier, such as"
                              f' {{"traceparent": "00-...-01"}}), got {value[:80]!r}')
    return value


def canonical_json(text: str) -> str:
    """The one spelling of a JSON value, for comparing two texts by meaning."""
    return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def to_json(name: str, value: Any, *, limit: Optional[int] = None) -> str:
    """Encode a Python value as JSON text, refusing what JSON cannot hold and a text above
    `limit` bytes."""
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"{name} is not JSON-serialisable: {exc}") from None
    return payload(name, text, limit)


def finite(value: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
