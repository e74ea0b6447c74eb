"""The `yieldstar` command line: thin commands over the library (SPEC sections 6 and 8).

The group and what every command shares live here; the commands live in one module per
concern: `submit` (start, settle, stores), `show` (get, ls, steps, history, wake),
`operate` (cancel, resume, purge), `views` (stats, metrics, top), `run` (supervise, demo, chaos).

Exit codes: 0 success; 1 the execution asked for is unknown (`get`, `steps`, `history`, `wake`);
2 bad input or a database error (the message says which), printed on stderr without a traceback.
A command that only reads (`get`, `ls`, `steps`, `history`, `store ls`, `store get`), and `wake`,
which needs an execution that exists, never creates a ledger: on a path with no file it prints
"yieldstar: no ledger at PATH" and exits 2, like any other bad `--db`. `supervise` has its own
exit codes (see `supervisor.dispatcher`).
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import click

from ..errors import UnknownExecution, YieldstarError
from ..sqlite.backend import open_backend

EXIT_UNKNOWN = 1
EXIT_BAD_INPUT = 2


def as_json(record: Any) -> dict:
    """A value object as the JSON the CLI prints: payload fields lose `_json` and are decoded."""
    out = {}
    for key, value in asdict(record).items():
        if key.endswith("_json"):
            out[key[: -len("_json")]] = None if value is None else json.loads(value)
        else:
            out[key] = value
    status = getattr(record, "status", None)
    if status is not None and "status" not in out:
        out["status"] = status
    return out


def fail(message: str, code: int = EXIT_BAD_INPUT) -> None:
    click.echo(f"yieldstar: {message}", err=True)
    sys.exit(code)


def handles_errors(fn: Callable) -> Callable:
    """Report library errors as one line on stderr with the documented exit code, no traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UnknownExecution as exc:
            fail(str(exc), EXIT_UNKNOWN)
        except (YieldstarError, ValueError) as exc:
            fail(str(exc))
        except OSError as exc:
            fail(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": "))
        except Exception as exc:  # a bug (storage failures are YieldstarErrors): still one line, no traceback
            fail(f"{type(exc).__name__}: {exc}")

    return wrapper


def backend_of(ctx: click.Context, *, create: bool = True):
    """The ledger named by --db; with `create=False`, a missing one raises `NoLedger`."""
    path = ctx.obj["db"]
    if os.path.isdir(path):
        raise ValueError(f"--db {path} is a folder, not a database file")
    return open_backend(path, create=create)


def parse_json_option(name: str, text: str) -> str:
    try:
        json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{name} is not valid JSON: {exc}") from None
    return text


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--db", envvar="YIELDSTAR_DB", default="yieldstar.db", show_default=True,
              help="The ledger file (default: $YIELDSTAR_DB, else ./yieldstar.db).")
@click.pass_context
def main(ctx: click.Context, db: str) -> None:
    """Yieldstar: durable workflows on one host, with execution leases and fencing tokens."""
    ctx.ensure_object(dict)
    ctx.obj["db"] = db




# Registers every command on `main`.
from . import operate, run, show, submit, views  # noqa: F401
