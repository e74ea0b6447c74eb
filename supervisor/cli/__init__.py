"""The `yieldstar` command line: thin commands over the library (SPEC sections 6 and 8).

The group and what every command shares live here; the commands live in one module per
concern: `submit` (start, settle, stores), `show` (get, ls, steps, history, wake),
`operate` (cancel, resume, purge, fork), `messages` (send, events), `views` (stats, metrics, top),
`supervisors` (the live supervisors), `schedules` (the workflows' schedules), `run` (supervise,
demo, chaos), `ui` (the web UI).

Every error is one line on stderr, `yieldstar: <message>`, without a traceback, and one exit
code per kind of error, the same in every command:

- 0: done.
- 1: the thing asked for is not there (an unknown execution for `get`, `steps`, `history`,
  `wake`, `cancel`, `resume`, `fork`; an unknown store for `store get`); also `demo` or `chaos` finding
  a verdict or invariant that does not hold, and `supervise` stopped by a second signal.
- 2: bad input: a usage error (an unknown option, a missing argument, a bad choice: one line
  and a hint to `--help`), a value that is not valid JSON, a missing file, a conflict, an app
  that cannot be loaded, a database error (the message says which).
- 5: (`supervise`) the ledger can no longer be used; the log says why and what to do.
- 130: interrupted (Ctrl-C, SIGINT) in any command but two: `supervise`, which stops
  gracefully (0), and `top`, for which Ctrl-C is a way to quit, like `q` (0). `chaos` stopped
  by SIGINT or SIGTERM also exits 130, after one line naming its phase and its work folder.
- 141: the reader of the output went away (`yieldstar ls | head -1`): quietly, like a command
  killed by SIGPIPE.

A command that only reads (`get`, `ls`, `steps`, `history`, `store ls`, `store get`), and `wake`,
which needs an execution that exists, never creates a ledger: on a path with no file it prints
"yieldstar: no ledger at PATH" and exits 2, like any other bad `--db`.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, Optional

import click

from ..ledger import arguments
from ..ledger.backends import open_backend
from ..humane import parse_size
from ..ledger.errors import PayloadTooLarge, UnknownExecution, YieldstarError
from . import params

EXIT_UNKNOWN = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command stopped by Ctrl-C
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports a command whose reader went away

DEFAULT_DB = "yieldstar.db"


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
        except PayloadTooLarge as exc:  # named by the option that sets the limit here
            fail(str(PayloadTooLarge(exc.name, exc.size, exc.limit, MAX_PAYLOAD)))
        except BrokenPipeError:
            raise  # the reader went away: `main` ends quietly
        except (YieldstarError, ValueError) as exc:
            fail(str(exc), EXIT_INTERRUPTED if _stopped_by_a_signal(exc) else EXIT_BAD_INPUT)
        except OSError as exc:
            fail(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": "))
        except Exception as exc:  # a bug (storage failures are YieldstarErrors): still one line, no traceback
            fail(f"{type(exc).__name__}: {exc}")

    return wrapper


def _stopped_by_a_signal(exc: Exception) -> bool:
    """A `chaos` run stopped by SIGINT or SIGTERM (`ChaosInterrupted`, whose message says where
    its work folder is): interrupted, not bad input. Looked up only when the harness was
    imported, so that no other command imports it."""
    harness = sys.modules.get(f"{__name__.rpartition('.')[0]}.chaos.harness")
    return harness is not None and isinstance(exc, harness.ChaosInterrupted)


def ledger_of(ctx: click.Context) -> str:
    """The ledger --db names: a path (not a folder's) or a postgresql:// URI."""
    path = ctx.obj["db"]
    if os.path.isdir(path):
        raise ValueError(f"--db {path} is a folder, not a database file")
    return path


def backend_of(ctx: click.Context, *, create: bool = True, max_payload_bytes: Optional[int] = None):
    """The ledger named by --db; with `create=False`, a missing one raises `NoLedger`."""
    return open_backend(ledger_of(ctx), create=create, max_payload_bytes=max_payload_bytes)


MAX_PAYLOAD = "--max-payload"


def max_payload_option(fn: Callable) -> Callable:
    """`--max-payload SIZE`, for a command that writes payloads: the limit it writes them under."""
    return click.option(MAX_PAYLOAD, "max_payload", metavar="SIZE", default=None,
                        help="The size limit of each JSON payload written (an input, a result, a store's value):"
                             " bytes, or a number and a unit, like 8MB or 512KiB  [default: 4MiB]")(fn)


def max_payload_bytes(text: Optional[str]) -> Optional[int]:
    """`--max-payload`'s size in bytes (None: not given, the ledger's default), or a one-line
    error naming the option."""
    if text is None:
        return None
    try:
        return parse_size(text)
    except ValueError as exc:
        raise ValueError(f"{MAX_PAYLOAD}: {exc}") from None


def parse_json_option(name: str, text: str, max_payload: Optional[int] = None) -> str:
    """`text`, checked as the ledger checks JSON (no NaN or Infinity) and its size (within
    `max_payload` bytes, None: the default limit), the error naming the option or argument
    `name` the user gave."""
    limit = arguments.max_payload_bytes(MAX_PAYLOAD, max_payload)
    return arguments.json_text(name, arguments.payload(name, text, limit, setting=MAX_PAYLOAD))


def read_json_option(name: str, text: str, max_payload: Optional[int] = None) -> str:
    """The JSON text an option names: itself, `@FILE` (the file's contents) or `-` (stdin);
    checked to be valid JSON of at most `max_payload` bytes. Raises ValueError with a one-line
    message otherwise."""
    if text == "-":
        text, source = sys.stdin.read(), "stdin"
    elif text.startswith("@"):
        path = text[1:]
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise ValueError(f"{name} @{path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise ValueError(f"{name} @{path} is not UTF-8 text: {exc.reason}") from None
        source = path
    else:
        return parse_json_option(name, text, max_payload)
    return parse_json_option(f"{name} (from {source})", text, max_payload)


class _Group(click.Group):
    """The `yieldstar` group, whose entry point gives every command the same error style.

    Click's own handling would print a multi-line "Usage: ... Error: ..." block for a usage
    error, "Aborted!" for Ctrl-C, and exit 1 for a closed pipe; here each kind of error is one
    line (or none) and its exit code is the one in this module's docstring."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:  # a caller that handles click's exceptions itself
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        code = self._run(sys.argv[1:] if args is None else list(args), prog_name or "yieldstar",
                         complete_var, extra)
        try:
            sys.stdout.flush()  # output still buffered may meet a closed pipe: here, not at exit
        except BrokenPipeError:
            code = EXIT_BROKEN_PIPE
        if code == EXIT_BROKEN_PIPE:
            # Python flushes stdout again as it exits: point it at /dev/null, so that nothing
            # prints "Exception ignored ... BrokenPipeError".
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        sys.exit(code)

    def _run(self, args: list, prog_name: str, complete_var, extra: dict) -> int:
        self._main_shell_completion(extra, prog_name, complete_var)
        try:
            with self.make_context(prog_name, args, **extra) as ctx:
                self.invoke(ctx)
            return 0
        except click.exceptions.Exit as exc:
            return exc.exit_code
        except click.exceptions.NoArgsIsHelpError as exc:
            exc.show()  # `yieldstar` alone: the help, which is what was wanted
            return EXIT_BAD_INPUT
        except click.UsageError as exc:
            # No context: the group's own options could not be parsed (`yieldstar --db`).
            hint = f" (see {exc.ctx.command_path if exc.ctx is not None else prog_name} --help)"
            _say(_sentence(exc.format_message()) + hint)
            return EXIT_BAD_INPUT
        except click.ClickException as exc:
            _say(_sentence(exc.format_message()))
            return EXIT_BAD_INPUT
        except SystemExit as exc:  # `fail()` and the commands' own exit codes
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_BAD_INPUT)
        except (KeyboardInterrupt, click.Abort):
            return EXIT_INTERRUPTED
        except BrokenPipeError:
            return EXIT_BROKEN_PIPE


_closed_down = False  # see `closed_down`


def closed_down() -> None:
    """Called by a command that has closed everything it opened (its children gone, its ledger
    closed) just before it exits: `entry` then flushes the output and exits at once, without the
    interpreter's own teardown, which frees nothing that outlives the process and cost a
    supervisor 17-36 ms at every exit."""
    global _closed_down
    _closed_down = True


def entry() -> None:
    """The `yieldstar` command, and `python -m supervisor.cli`: `main`, which always ends in
    `SystemExit`; after `closed_down`, the exit skips the interpreter's teardown. A caller of
    `main` in its own process (a test's `CliRunner`) never exits this way."""
    try:
        main()
    except SystemExit as exc:
        if _closed_down and isinstance(exc.code, int):
            logging.shutdown()  # flushes the log's handlers, as the interpreter's exit would
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except OSError:
                    pass  # `main` said how it ended: the exit code stands
            os._exit(exc.code)
        raise


def _say(message: str) -> None:
    try:
        click.echo(f"yieldstar: {message}", err=True)
    except OSError:
        pass  # stderr is gone too: the exit code has to say it


def _sentence(message: str) -> str:
    """Click's message in this CLI's style: lower case first, no full stop (as `fail()` writes)."""
    message = message.strip().rstrip(".")
    if message[:1].isupper() and message[1:2].islower():
        message = message[0].lower() + message[1:]
    return message


class _DbOption(click.Option):
    """`--db`, whose help shows the default in effect: $YIELDSTAR_DB when set, else ./yieldstar.db."""

    def get_help_record(self, ctx):
        record = super().get_help_record(ctx)
        if record is None:
            return None
        env = os.environ.get("YIELDSTAR_DB")
        default = f"{env} (from $YIELDSTAR_DB)" if env else f"./{DEFAULT_DB}"
        return record[0], f"{record[1]}  [default: {default}]"


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--db", cls=_DbOption, envvar="YIELDSTAR_DB", default=DEFAULT_DB, callback=params.not_empty,
              help="The ledger file ($YIELDSTAR_DB when set, else ./yieldstar.db).")
@click.version_option(package_name="yieldstar", prog_name="yieldstar", message="%(prog)s %(version)s")
@click.pass_context
def main(ctx: click.Context, db: str) -> None:
    """Yieldstar: durable workflows with execution leases and fencing tokens, on SQLite or PostgreSQL."""
    ctx.ensure_object(dict)
    ctx.obj["db"] = db


# Registers every command on `main`.
from . import check, messages, operate, queues, run, schedules, show, submit, supervisors, ui, views  # noqa: F401
