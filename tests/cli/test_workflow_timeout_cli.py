"""`yieldstar start --timeout DURATION` and the deadline in `get` (SPEC section 12), as real
commands on a real ledger (a SQLite file, and PostgreSQL): the duration as the CLI writes it
everywhere (30s, 5m, 1h30m); a bad one refused on stderr naming `--timeout`, with no traceback and
nothing admitted."""

from __future__ import annotations

import json

import pytest

from faults import cli
from supervisor import open_backend

pytestmark = pytest.mark.timeout(90)


def test_start_timeout_records_the_deadline_that_get_shows(each_backend):
    started = cli(each_backend, "start", "send", "--id", "t-1", "--timeout", "1h30m")
    assert started.returncode == 0, started.stderr
    assert cli(each_backend, "start", "send", "--id", "t-2").returncode == 0
    shown = json.loads(cli(each_backend, "get", "t-1", "--json").stdout)
    assert shown["deadline_at"] == shown["created_at"] + 5_400_000
    assert json.loads(cli(each_backend, "get", "t-2", "--json").stdout)["deadline_at"] is None
    assert "deadline_at" in cli(each_backend, "get", "t-1").stdout
    assert "deadline_at" not in cli(each_backend, "get", "t-2").stdout  # no timeout: no line
    repeated = cli(each_backend, "start", "send", "--id", "t-1", "--timeout", "5m")
    assert repeated.returncode != 0 and "timeout_ms" in repeated.stderr


@pytest.mark.parametrize("bad", ["0s", "0", "-5s", "abc", "5", "nan", "inf", "", "1x"])
def test_start_with_a_bad_timeout_is_refused_naming_the_option_and_admits_nothing(each_backend, bad):
    refused = cli(each_backend, "start", "send", "--id", "z", "--timeout", bad)
    assert refused.returncode == 2, refused
    assert "--timeout" in refused.stderr and repr(bad) in refused.stderr
    assert "Traceback" not in refused.stderr
    with open_backend(each_backend) as backend:
        assert backend.executions.get("z") is None
