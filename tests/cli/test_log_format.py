"""`supervise --log-format json` (SPEC section 13, issue 32): one JSON object a line from the
supervisor and its workers, with an `event` for every kind of line and the fields of a
delivery; and a failed delivery's line, in either format, says why it failed."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from faults import ROOT, cli
from supervisor.dispatcher import SupervisorConfig
from supervisor.ledger.errors import InvalidArgument

SHOP = '''
import logging
import os
import time

from worker import RetryPolicy, workflow

FOLDER = os.path.dirname(os.path.abspath(__file__))


class CardDeclined(Exception):
    pass


@workflow("charge")
def charge(ctx, input):
    if input.get("decline"):
        raise CardDeclined(input["decline"])
    ctx.run("wait", time.sleep, input.get("seconds", 0))
    return {"paid": True}


def call_bank():
    marker = os.path.join(FOLDER, "bank-called")
    if not os.path.exists(marker):
        open(marker, "w").close()
        raise ConnectionError("bank unreachable")
    return "ok"


@workflow("flaky")
def flaky(ctx, input):
    return ctx.run("call bank", call_bank, retry=RetryPolicy(max_attempts=3, interval=0.05))


@workflow("chatty")
def chatty(ctx, input):
    logging.getLogger("shop").warning("a warning of the app's own,\\non two lines")
    return None
'''

ISO_MS_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
# A message with what could split a line: a newline, a carriage return, a Unicode line separator.
DECLINED = "card ending 4242 was declined\nby the bank\r (carte refusée\u2028)"


def shop(tmp_path: Path, *starts: tuple[str, str, dict]) -> Path:
    """A ledger with the executions `starts` (id, workflow, input) of the shop app in tmp_path."""
    (tmp_path / "shop.py").write_text(SHOP)
    db = tmp_path / "ledger.db"
    for execution_id, name, payload in starts:
        started = cli(db, "start", name, "--id", execution_id, "--input", json.dumps(payload))
        assert started.returncode == 0, started.stderr
    return db


def deliveries(lines: list[dict]) -> dict[tuple[str, int], dict]:
    """The `delivery_ended` lines by (execution, token), checked to be one per delivery."""
    ended = [line for line in lines if line["event"] == "delivery_ended"]
    by_delivery = {(line["execution_id"], line["token"]): line for line in ended}
    assert len(by_delivery) == len(ended), ended
    return by_delivery


@pytest.mark.timeout(120)
def test_json_logs_are_one_object_a_line_and_a_failed_delivery_carries_its_error(tmp_path):
    db = shop(tmp_path, ("ok-1", "charge", {"seconds": 0.5}), ("order-42", "charge", {"decline": DECLINED}),
              ("flaky-1", "flaky", {}), ("chatty-1", "chatty", {}))
    run = cli(db, "supervise", str(tmp_path / "shop.py"), "--until-idle", "--concurrency", "1", "--poll-ms", "50",
              "--summary", "0.1", "--log-format", "json", timeout=90)
    assert run.returncode == 0, run.stderr

    assert run.stdout == ""
    lines = [json.loads(line) for line in run.stderr.splitlines()]  # every line, or this raises
    assert len(lines) == run.stderr.count("\n")  # no line broken in two by a message
    for line in lines:
        assert ISO_MS_UTC.fullmatch(line["ts"]), line
        assert line["level"] in ("info", "warning", "error"), line
        assert re.fullmatch(r"[a-z]+(_[a-z]+)*", line["event"]), line
        assert isinstance(line["message"], str) and isinstance(line["pid"], int), line
    (started,) = [line for line in lines if line["event"] == "supervisor_started"]
    supervisor_pid = started["pid"]
    assert started["supervisor_id"].split(":")[1] == str(supervisor_pid)
    assert [line["event"] for line in lines if line["event"] != "summary"][-1] == "supervisor_idle"

    ended = deliveries(lines)
    assert set(ended) == {("ok-1", 1), ("order-42", 1), ("flaky-1", 1), ("flaky-1", 2), ("chatty-1", 1)}
    failed = ended[("order-42", 1)]
    assert failed["error"] == {"type": "CardDeclined", "message": DECLINED}
    assert (failed["workflow"], failed["outcome"], failed["level"]) == ("charge", "failed", "info")
    assert failed["message"].startswith("delivery execution=order-42 token=1 outcome=failed duration_ms=")
    completed = ended[("ok-1", 1)]
    assert (completed["workflow"], completed["outcome"]) == ("charge", "completed") and "error" not in completed
    assert isinstance(completed["duration_ms"], int) and completed["duration_ms"] >= 500
    # Retried: its step failed once, the delivery suspended for the backoff, carrying the step's
    # error, and the next one completed.
    assert [(ended[("flaky-1", token)]["workflow"], ended[("flaky-1", token)]["outcome"]) for token in (1, 2)] \
        == [("flaky", "suspended"), ("flaky", "completed")]
    assert ended[("flaky-1", 1)]["error"] == {"type": "ConnectionError", "message": "bank unreachable",
                                              "step": "call bank", "attempt": 1}
    assert "error" not in ended[("flaky-1", 2)] and "error=" not in ended[("flaky-1", 1)]["message"]

    # The workers' lines are JSON too (they share the stderr): here the app's own warning.
    (app_line,) = [line for line in lines if line["logger"] == "shop"]
    assert app_line["event"] == "log" and app_line["level"] == "warning" and app_line["pid"] != supervisor_pid
    assert app_line["message"] == "a warning of the app's own,\non two lines"
    # --summary lines are log lines like the others.
    summaries = [line for line in lines if line["event"] == "summary"]
    assert summaries and all(isinstance(line["claimed"], int) and isinstance(line["failed"], int)
                             for line in summaries)


@pytest.mark.timeout(120)
def test_the_text_line_of_a_failed_delivery_ends_with_its_error_on_one_line_cut_to_a_sane_length(tmp_path):
    long = "x" * 1000
    db = shop(tmp_path, ("order-42", "charge", {"decline": DECLINED}), ("order-43", "charge", {"decline": long}),
              ("ok-1", "charge", {}))
    run = cli(db, "supervise", str(tmp_path / "shop.py"), "--until-idle", "--concurrency", "1", "--poll-ms", "50",
              timeout=90)
    assert run.returncode == 0, run.stderr

    lines = run.stderr.splitlines()
    (declined,) = [line for line in lines if "delivery execution=order-42 " in line]
    assert re.fullmatch(r"\S+ \S+ yieldstar\[\d+\] delivery execution=order-42 token=1 outcome=failed"
                        r" duration_ms=\d+ error=CardDeclined: card ending 4242 was declined\\nby the bank\\n"
                        r" \(carte refusée\\n\)", declined), declined
    (cut,) = [line for line in lines if "delivery execution=order-43 " in line]
    assert cut.endswith(" error=CardDeclined: " + "x" * 197 + "...")
    (completed,) = [line for line in lines if "delivery execution=ok-1 " in line]
    assert " outcome=completed " in completed and "error=" not in completed


@pytest.mark.timeout(60)
def test_a_bad_log_format_is_a_usage_error_naming_the_option_and_nothing_is_created(tmp_path):
    (tmp_path / "shop.py").write_text(SHOP)
    db = tmp_path / "ledger.db"
    run = cli(db, "supervise", str(tmp_path / "shop.py"), "--log-format", "xml")
    assert run.returncode == 2
    assert run.stderr == ("yieldstar: invalid value for '--log-format': 'xml' is not one of 'text', 'json'"
                          " (see yieldstar supervise --help)\n")
    assert not db.exists()
    with pytest.raises(InvalidArgument, match="log_format must be one of text, json, got 'xml'"):
        SupervisorConfig(log_format="xml")


@pytest.mark.timeout(60)
def test_an_app_that_cannot_be_loaded_is_one_json_line_with_exit_code_2(tmp_path):
    (tmp_path / "broken.py").write_text("import nowhere_to_be_found\n")
    db = tmp_path / "ledger.db"
    run = cli(db, "supervise", str(tmp_path / "broken.py"), "--log-format", "json", timeout=60)
    assert run.returncode == 2, run.stderr
    (line,) = [json.loads(text) for text in run.stderr.splitlines()]
    assert (line["level"], line["event"]) == ("error", "app_not_loaded")
    assert line["message"].startswith(f"cannot load app {tmp_path / 'broken.py'}: ")
    assert "nowhere_to_be_found" in line["message"] and "Traceback" in line["traceback"]
    assert not db.exists()


def log_calls_without_an_event(path: Path) -> list[str]:
    """The `log.<level>(...)` calls in `path` that pass no `extra={"event": ...}`."""
    missing = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "log"
                and node.func.attr in ("debug", "info", "warning", "error", "critical", "exception")):
            continue
        extra = next((k.value for k in node.keywords if k.arg == "extra"), None)
        if not (isinstance(extra, ast.Dict) and any(isinstance(k, ast.Constant) and k.value == "event"
                                                     for k in extra.keys)):
            missing.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return missing


def test_every_log_call_of_the_supervisor_and_its_workers_names_its_event():
    files = sorted((ROOT / "supervisor").rglob("*.py")) + sorted((ROOT / "worker").rglob("*.py"))
    calls = [f for f in files if re.search(r"^\s*log\.(debug|info|warning|error|critical|exception)\(",
                                           f.read_text(), re.M)]
    assert len(calls) >= 15  # the check looks where the log calls are
    assert [where for f in calls for where in log_calls_without_an_event(f)] == []
