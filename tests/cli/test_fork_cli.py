"""`yieldstar fork ID --from-step KEY [--id NEW_ID]` (SPEC section 14): what it prints, and its
refusals, each one line on stderr naming the option the user gave, with nothing written. The
original's steps are recorded through the ledger (the supervised fork is
`tests/supervisor/test_fork_supervised.py`)."""

from __future__ import annotations

import json

import pytest

from faults import cli
from supervisor import Completed, open_backend


def completed_with_steps(db, execution_id: str, keys: str) -> None:
    with open_backend(db) as backend:
        backend.executions.admit(execution_id, "order", '{"sku": "kettle"}')
        (lease,) = backend.executions.claim_due(limit=1, duration=30_000)
        for key in keys:
            backend.heap.write_step(lease, step_key=key, step_attempt=1, done=True,
                                    step_response_json=json.dumps({"value": key.upper()}))
        backend.executions.acknowledge(lease, Completed('"done"'))


@pytest.mark.timeout(60)
def test_fork_prints_the_new_id_and_the_fork_holds_the_steps_before_the_one_named(each_backend):
    completed_with_steps(each_backend, "order-1", "abc")
    done = cli(each_backend, "fork", "order-1", "--from-step", "b", "--id", "order-1-again")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "order-1-again\n"
    # Admitted all the same, as a start is; the note says why nothing runs it yet.
    assert "no live supervisor serves workflow 'order'" in done.stderr
    steps = json.loads(cli(each_backend, "steps", "order-1-again", "--json").stdout)
    assert [(s["step_key"], s["step_response"]) for s in steps] == [("a", {"value": "A"})]
    shown = json.loads(cli(each_backend, "get", "order-1-again", "--json").stdout)
    assert (shown["status"], shown["workflow"], shown["input"]) == ("admitted", "order", {"sku": "kettle"})
    assert json.loads(cli(each_backend, "get", "order-1", "--json").stdout)["status"] == "completed"

    made = cli(each_backend, "fork", "order-1", "--from-step", "c")
    assert made.returncode == 0, made.stderr
    new_id = made.stdout.strip()
    assert len(new_id) == 32 and new_id not in ("order-1", "order-1-again")
    steps = json.loads(cli(each_backend, "steps", new_id, "--json").stdout)
    assert [s["step_key"] for s in steps] == ["a", "b"]


@pytest.mark.timeout(60)
def test_fork_refuses_bad_input_naming_the_option_and_writes_nothing(each_backend, db_snapshot):
    completed_with_steps(each_backend, "order-1", "abc")
    assert cli(each_backend, "fork", "order-1", "--from-step", "b", "--id", "taken").returncode == 0
    before = db_snapshot(each_backend)
    refusals = [
        (["fork", "order-1", "--from-step", "shipping"], 2,
         "--from-step 'shipping' is not a recorded step of execution 'order-1' (its recorded steps: 'a', 'b',"
         " 'c'); nothing was forked"),
        (["fork", "nobody", "--from-step", "b"], 1, "no execution 'nobody'"),
        (["fork", "order-1", "--from-step", "b", "--id", "taken"], 2, "--id 'taken' is taken"),
        (["fork", "order-1", "--from-step", "b", "--id", "order-1"], 2, "--id 'order-1' is taken"),
        (["fork", "order-1", "--from-step", "b", "--id", "  "], 2, "--id '  ' is blank"),
        (["fork", "order-1", "--from-step", ""], 2, "--from-step must not be empty"),
        (["fork", "order-1", "--from-step", "b" * 256], 2, "--from-step is 256 characters long"),
        (["fork", "order-1"], 2, "missing option '--from-step'"),
        (["fork", " ", "--from-step", "b"], 2, "ID ' ' is blank"),
    ]
    for args, code, message in refusals:
        done = cli(each_backend, *args)
        assert done.returncode == code, (args, done.stderr)
        assert message in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)
        assert done.stdout == "", (args, done.stdout)
    assert db_snapshot(each_backend) == before
