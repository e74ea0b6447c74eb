"""Bad values on the command line are refused naming the option or argument the user typed
(`--id`, `ID`, `--lease-ms`), never the library's parameter behind it (`execution_id`,
`lease_ms`), in one line on stderr, exit 2, and nothing written (issue 34, item 3). Values that
used to end in a Python error (an int too large for SQLite, a wait too long for the clock, a
'nan' that spun a loop) are refused alike."""

from __future__ import annotations

import pytest

from faults import cli
from supervisor import open_backend

LONG = "x" * 256
APP = "no_such_app.py"  # every case is refused before an app is loaded


def see(command: str) -> str:
    return f" (see yieldstar {command} --help)"


CASES = [
    # ids and names, checked as the ledger checks them
    (("start", ""), "WORKFLOW must not be empty" + see("start")),
    (("start", " "), "WORKFLOW ' ' is blank: it needs a character other than a space" + see("start")),
    (("start", "wf", "--id", ""), "--id must not be empty" + see("start")),
    (("start", "wf", "--id", "a\tb"), "--id 'a\\tb' contains a control character" + see("start")),
    (("start", "wf", "--id", LONG), "--id is 256 characters long; at most 255 are allowed" + see("start")),
    (("start", "wf", "--queue", ""), "--queue must not be empty" + see("start")),
    (("start", "wf", "--key", " "), "--key ' ' is blank: it needs a character other than a space" + see("start")),
    (("get", ""), "ID must not be empty" + see("get")),
    (("steps", ""), "ID must not be empty" + see("steps")),
    (("history", ""), "ID must not be empty" + see("history")),
    (("wake", ""), "ID must not be empty" + see("wake")),
    (("cancel", LONG), "ID is 256 characters long; at most 255 are allowed" + see("cancel")),
    (("resume", ""), "ID must not be empty" + see("resume")),
    (("ls", "--workflow", ""), "--workflow must not be empty" + see("ls")),
    (("ls", "--id-prefix", ""), "--id-prefix must not be empty" + see("ls")),
    (("settle", "", "--result", "1"), "EFFECT_ID must not be empty" + see("settle")),
    (("store", "get", ""), "NAME must not be empty" + see("store get")),
    (("store", "put", "", "1"), "NAME must not be empty" + see("store put")),
    (("store", "set", "\x7f", "1"), "NAME '\\x7f' contains a control character" + see("store set")),
    (("backup", ""), "DEST must not be empty" + see("backup")),
    (("restore", ""), "SRC must not be empty" + see("restore")),
    (("check", ""), "APP must not be empty" + see("check")),
    (("supervise", ""), "APP must not be empty" + see("supervise")),
    (("--db", "", "ls"), "--db must not be empty (see yieldstar --help)"),
    # numbers and durations
    (("start", "wf", "--priority", "2147483648"),
     "invalid value for '--priority': 2147483648 is not in the range -2147483648<=x<=2147483647" + see("start")),
    (("start", "wf", "--timeout", "99999999999d"), "--timeout must be at most 104,249,991d, got '99999999999d'"),
    (("purge", "--older-than", "a while"),
     "--older-than: 'a while' is not a duration: write a number and a unit, like 30s, 15m, 2h or 7d"),
    (("purge", "--older-than", "99999999999999d"),
     "--older-than '99999999999999d' reaches back before 1970; the ledger's times begin there"),
    (("supervise", APP, "--lease-ms", "100", "--renew-ms", "500"),
     "--renew-ms (500) must be less than --lease-ms (100): a lease must outlast its renewals"),
    *[(("supervise", APP, option, "99999999999999999999"),
       f"invalid value for '{option}': 99999999999999999999 is not in the range {low}<=x<=2592000000"
       + see("supervise"))
      for option, low in (("--lease-ms", 1), ("--renew-ms", 1), ("--heartbeat-ms", 1), ("--poll-ms", 1),
                          ("--grace-ms", 0))],
    (("supervise", APP, "--heartbeat-misses", "1001"),
     "invalid value for '--heartbeat-misses': 1001 is not in the range 1<=x<=1000" + see("supervise")),
    *[(("supervise", APP, "--summary", seconds),
       f"invalid value for '--summary': {seconds} is not a number of seconds from 0.1 to 86400" + see("supervise"))
      for seconds in ("nan", "inf", "1e308")],
    (("top", "--interval", "nan"),
     "invalid value for '--interval': nan is not a number of seconds from 0.1 to 3600" + see("top")),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args, message", CASES, ids=[" ".join(args)[:60] or "empty" for args, _ in CASES])
def test_a_bad_value_is_refused_naming_the_option_or_argument_the_user_typed_and_nothing_is_written(
        tmp_path, db_snapshot, args, message):
    db = tmp_path / "ledger.db"
    with open_backend(db) as backend:
        backend.executions.admit("known", "wf")
    before = db_snapshot(db)

    result = cli(db, *args)

    assert result.returncode == 2, result
    assert result.stderr == f"yieldstar: {message}\n", result.stderr
    assert db_snapshot(db) == before
