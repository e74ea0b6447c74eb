"""`yieldstar send` and `yieldstar events` (SPEC section 14), and what `get --json` shows of
messages and events, against a real supervisor running `tests/apps/messages_app.py`."""

from __future__ import annotations

import json

import pytest

from faults import TESTS, cli, wait_until

pytestmark = pytest.mark.usefixtures("dump_on_hang")

APP = str(TESTS / "apps" / "messages_app.py")


def events_of(db, execution_id: str) -> dict:
    done = cli(db, "events", execution_id, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.timeout(120)
def test_send_wakes_a_waiting_workflow_and_events_and_get_show_what_it_published(each_backend, supervisors):
    supervisors.start(each_backend, app=APP)
    started = cli(each_backend, "start", "msg.approval", "--id", "order-7")
    assert started.returncode == 0, started.stderr
    wait_until(lambda: events_of(each_backend, "order-7") == {"status": "waiting for approval"})
    wait_until(lambda: json.loads(cli(each_backend, "get", "order-7", "--json").stdout)["status"] == "suspended")

    waits = cli(each_backend, "get", "order-7")
    assert 'a message on topic "approval"' in waits.stdout, waits.stdout
    noted = cli(each_backend, "send", "order-7", '"a note nobody takes"', "--topic", "notes")
    assert noted.returncode == 0, noted.stderr
    text = cli(each_backend, "get", "order-7").stdout
    assert 'pending messages            1 on "notes"' in text, text
    assert 'event "status"              "waiting for approval"' in text, text
    shown = json.loads(cli(each_backend, "get", "order-7", "--json").stdout)
    assert shown["pending_messages"] == {"notes": 1}
    assert shown["events"] == {"status": "waiting for approval"}

    sent = cli(each_backend, "send", "order-7", '{"verdict": "approved"}', "--topic", "approval", "--id", "a-1")
    assert sent.returncode == 0, sent.stderr
    assert json.loads(sent.stdout) == {"execution_id": "order-7", "id": "a-1", "topic": "approval", "seq": 2,
                                       "added": True}
    wait_until(lambda: events_of(each_backend, "order-7") == {"status": "approved"})
    text = cli(each_backend, "events", "order-7")
    assert text.returncode == 0 and text.stdout == 'status\t"approved"\n'
    final = wait_until(lambda: (shown := json.loads(cli(each_backend, "get", "order-7", "--json").stdout))["status"]
                       == "completed" and shown)
    assert final["pending_messages"] == {"notes": 1}
    # Once it is over, nothing would take a message: refused, as a repeat of a send is not.
    late = cli(each_backend, "send", "order-7", '"late"')
    assert late.returncode == 2 and "completed" in late.stderr and "Traceback" not in late.stderr


@pytest.mark.timeout(60)
def test_send_refuses_bad_input_and_an_unknown_execution_and_writes_nothing(each_backend, db_snapshot):
    assert cli(each_backend, "start", "msg.collect", "--id", "order-1").returncode == 0
    repeated = [cli(each_backend, "send", "order-1", '"hello"', "--id", "m-1") for _ in range(2)]
    assert [json.loads(done.stdout)["added"] for done in repeated] == [True, False]
    before = db_snapshot(each_backend)
    refusals = [
        (["send", "nobody", '"x"'], 1, "'nobody' is not admitted"),
        (["send", "order-1", "{not json"], 2, "JSON is not valid JSON"),
        (["send", "order-1", "NaN"], 2, "JSON is not valid JSON"),
        (["send", "order-1", '"x"', "--topic", ""], 2, "--topic must not be empty"),
        (["send", "order-1", '"x"', "--id", "m" * 256], 2, "--id is 256 characters long"),
        (["send", "order-1", '"' + "x" * 2000 + '"', "--max-payload", "1KB"], 2, "JSON is 2"),
        (["events", "nobody"], 1, "no execution 'nobody'"),
    ]
    for args, code, message in refusals:
        done = cli(each_backend, *args)
        assert done.returncode == code, (args, done.stderr)
        assert message in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)
    assert db_snapshot(each_backend) == before
