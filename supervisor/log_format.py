"""The two formats of the log lines of `supervise` and its workers: text, or one JSON object a line.

Every log call of the supervisor and of its workers names what kind of line it is with an
`event` (a stable snake_case name: `delivery_ended`, `lease_lost`, `worker_died`, ...) and
passes what it is about as fields, both through the standard `extra=`:

    log.info("delivery execution=%s token=%d outcome=%s duration_ms=%d", ...,
             extra={"event": "delivery_ended", "execution_id": ..., "outcome": "failed", ...})

The text format shows the message alone, as it always did. The JSON format (`JsonFormatter`)
writes one object a line: `ts` (ISO 8601 UTC with milliseconds), `level`, `event`, `message`
(the text line's message), `logger`, `pid`, then the call's fields (`execution_id`, `workflow`,
`token`, `outcome`, `duration_ms`, `error`, `worker_pid`, ...), and `exception` when the call
had a traceback. A field that does not apply (None) is left out. A record that names no event
(the app's own logging in a worker, Python's warnings) gets `"event": "log"`.

The workers (`worker._runtime.child`) import this module too, and format their lines as their
supervisor does: they share its stderr. It needs the standard library alone, so that importing
it costs a worker's start nothing.
"""

from __future__ import annotations

import enum
import json
import logging
import time
from typing import Optional

# What a failed delivery's text line shows of its error's message at most: enough to tell
# errors apart, never a screenful (the whole error is in the ledger: `yieldstar get`).
TEXT_ERROR_CHARS = 200


class LogFormat(str, enum.Enum):
    TEXT = "text"
    JSON = "json"


# The attributes every LogRecord has: anything else on a record came with `extra=`.
_RECORD_ATTRIBUTES = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object a line. The whole line is escaped ASCII (`json.dumps`' default): a
    newline, a carriage return or a Unicode line separator in a message or a traceback can
    never split it, whatever a reader takes for the end of a line."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": iso_ms(record.created),
            "level": record.levelname.lower(),
            "event": getattr(record, "event", None) or "log",
            "message": record.getMessage(),
            "logger": record.name,
            "pid": record.process,
        }
        for key, value in record.__dict__.items():
            if key not in _RECORD_ATTRIBUTES and key not in line and value is not None:  # None: does not apply
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str)


def iso_ms(created: float) -> str:
    """`created` (epoch seconds) as ISO 8601 UTC with milliseconds: 2026-12-05T13:44:25.779Z."""
    seconds = int(created)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int((created - seconds) * 1000):03d}Z"


def formatter(log_format: LogFormat | str, name: str = "yieldstar") -> logging.Formatter:
    """The formatter of `log_format`; `name` begins a text line: yieldstar[PID], yieldstar-worker[PID]."""
    if LogFormat(log_format) is LogFormat.JSON:
        return JsonFormatter()
    return logging.Formatter(f"%(asctime)s {name}[%(process)d] %(message)s")


def configure(handler: logging.Handler, log_format: LogFormat | str, level: int,
              name: str = "yieldstar") -> None:
    """Send every log record of this process at `level` and above to `handler`, in `log_format`.
    As JSON, Python's warnings are logged too (`logging.captureWarnings`): printed as they are,
    they would be lines that are not JSON."""
    handler.setFormatter(formatter(log_format, name))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    if LogFormat(log_format) is LogFormat.JSON:
        logging.captureWarnings(True)


def delivery_error(outcome: object) -> Optional[dict]:
    """The error a delivery's log line carries, None if it has none: a failed delivery's
    (`Failed.error_json`) as `{"type", "message"}`, its traceback left in the ledger; or, for a
    delivery suspended to retry a step, that step's failed attempt (`Suspended.step_error_json`)
    as `{"type", "message", "step", "attempt"}`."""
    error_json = getattr(outcome, "error_json", None) or getattr(outcome, "step_error_json", None)
    if not error_json:
        return None
    try:
        error = json.loads(error_json)
    except ValueError:
        return {"type": "Error", "message": error_json}
    if not isinstance(error, dict):
        return {"type": "Error", "message": str(error)}
    out = {"type": str(error.get("type") or "Error"), "message": str(error.get("message") or "")}
    out.update((key, error[key]) for key in ("step", "attempt") if key in error)
    return out


def error_text(error: dict) -> str:
    """`Type: message` on one line, the message cut to TEXT_ERROR_CHARS: the end of a failed
    delivery's text line."""
    message = "\\n".join(error["message"].splitlines())  # any line break: one line, always
    if len(message) > TEXT_ERROR_CHARS:
        message = message[: TEXT_ERROR_CHARS - 3] + "..."
    return f"{error['type']}: {message}" if message else error["type"]
