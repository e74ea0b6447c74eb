"""The supervisor under faults, with real processes and real signals.

A worker that crashes, a supervisor killed or frozen while it holds a lease, a frozen worker, a
frozen supervisor together with its workers while another supervisor takes over, a dead worker
replaced while the app is slow to load, and the shutdown signals. The fault injectors are in
`tests/faults.py`; the workflows in `tests/apps/supervised_app.py`. The tests show that the
processes they kill are really gone, and the `supervisors` fixture kills whatever is left.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from faults import (HEARTBEAT_MS, LEASE_MS, admit, freeze, freeze_group, gone, last_write_at, read_log, sigkill,
                    step_tokens, thaw, thaw_group, wait_gone, wait_until)

pytestmark = pytest.mark.usefixtures("dump_on_hang")


def hold_input(tmp_path, hold_tokens) -> dict:
    return {"log": str(tmp_path / "effects.log"), "gate": str(tmp_path / "gate"), "hold_tokens": hold_tokens}


def waiting(log, token: int):
    """The `waiting` event of the delivery with `token`, once its `hold` step has started."""
    return next((e for e in read_log(log) if e.event == "waiting" and e.token == token), None)


def status(ledger, execution_id: str) -> str:
    return ledger.executions.get(execution_id).status


def outcomes(ledger, execution_id: str) -> list[tuple[int, str, str]]:
    return [(h.token, h.ended_by, h.outcome) for h in ledger.executions.history(execution_id)]


# -- a worker crashes ---------------------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["os._exit in a step", "SIGKILL mid-step"])
def test_a_worker_crash_leaves_the_lease_to_expire_and_the_execution_is_delivered_again(
        how, each_backend, each_ledger, tmp_path, supervisors):
    log = tmp_path / "effects.log"
    if how == "os._exit in a step":
        admit(each_backend, "crash", "sv.crash", {"log": str(log), "crash_tokens": [1]})
    else:
        admit(each_backend, "crash", "sv.hold", hold_input(tmp_path, hold_tokens=[1]))
    supervisor = supervisors.start(each_backend, concurrency=1, ready=False)
    if how == "SIGKILL mid-step":
        first_worker = wait_until(lambda: waiting(log, 1)).pid
        sigkill(first_worker)
    else:
        first_worker = wait_until(lambda: next((e.pid for e in read_log(log) if e.step_key == "crash"), None))

    wait_until(lambda: status(each_ledger, "crash") == "completed", timeout=20)
    wait_gone([first_worker])
    assert "mid-delivery; its lease is left to expire" in supervisor.log()
    first, second = each_ledger.executions.history("crash")
    assert (first.token, first.ended_by) == (1, "superseded")
    assert (second.token, second.ended_by, second.outcome) == (2, "acknowledged", "completed")
    assert second.claimed_at >= first.expires_at  # delivered again only after the lease expired
    record = each_ledger.executions.get("crash")
    assert json.loads(record.result_json)["token"] == 2
    assert record.unacknowledged_deliveries == 0
    # The step recorded before the crash was replayed, not run again; the one it died in ran again.
    assert [(key, token) for key, _, token in step_tokens(each_backend, "crash")][0] == ("before", 1)
    begins = [(e.step_key, e.token) for e in read_log(log) if e.event in ("begin", "waiting")]
    assert begins.count(("before", 1)) == 1 and ("before", 2) not in begins
    # The pool replaced the dead worker, and the redelivery ran in the replacement.
    replacement = [e.pid for e in read_log(log) if e.token == 2]
    assert replacement and first_worker not in replacement
    assert len(supervisor.workers()) == 1 and first_worker not in supervisor.workers()
    assert supervisor.log().count("worker pid") == 1, "a healthy worker was taken for dead"


# -- the supervisor holding the lease dies ------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_killed_supervisor_leaves_no_worker_writing_and_another_takes_over_after_expiry(
        each_backend, each_ledger, tmp_path, supervisors):
    log = tmp_path / "effects.log"
    admit(each_backend, "orphaned", "sv.steps", {"log": str(log), "steps": 60, "sleep": 0.03})
    first = supervisors.start(each_backend, concurrency=1)
    workers = first.workers()
    everything = [p.pid for p in first.tree()]
    wait_until(lambda: len(step_tokens(each_backend, "orphaned")) >= 5, message="the delivery to be under way")

    killed_at = time.monotonic()
    sigkill(first.pid)
    assert first.wait(10) == -signal.SIGKILL
    wait_gone(workers, timeout=5)
    took = time.monotonic() - killed_at
    wait_gone(everything, timeout=5)
    # PR_SET_PDEATHSIG, or else the watch on the pipe: the worker goes at once, long before
    # the lease could expire and let anyone else in.
    assert took < 2 * HEARTBEAT_MS / 1000 + 0.5, f"the orphaned worker lived {took:.2f} s"
    written = step_tokens(each_backend, "orphaned")
    effects = read_log(log)

    # Nothing more is written while the lease runs out.
    wait_until(lambda: status(each_ledger, "orphaned") != "running", timeout=10, message="the lease to expire")
    assert step_tokens(each_backend, "orphaned") == written and read_log(log) == effects
    assert {token for _, _, token in written} == {1}

    (expired,) = each_ledger.executions.history("orphaned")
    assert last_write_at(each_backend, "orphaned", 1) < expired.expires_at

    second = supervisors.start(each_backend, concurrency=1)
    wait_until(lambda: status(each_ledger, "orphaned") == "completed", timeout=30)
    before, after = each_ledger.executions.history("orphaned")
    assert (before.token, before.ended_by) == (1, "superseded")
    assert (after.token, after.ended_by, after.outcome) == (2, "acknowledged", "completed")
    assert after.claimed_at >= before.expires_at
    assert after.holder != before.holder and after.holder.endswith(f":{second.pid}")
    steps = step_tokens(each_backend, "orphaned")
    assert steps[: len(written)] == written  # the orphan's records stand, none added later
    assert [key for key, _, _ in steps] == [f"s{i}" for i in range(60)]
    assert {token for _, _, token in steps[len(written):]} == {2}
    assert {e.token for e in read_log(log)[len(effects):]} == {2}


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_frozen_supervisor_alone_has_its_workers_stop_writing_before_its_lease_expires(
        each_backend, each_ledger, tmp_path, supervisors):
    log = tmp_path / "effects.log"
    admit(each_backend, "unheard", "sv.steps", {"log": str(log), "steps": 60, "sleep": 0.03})
    supervisor = supervisors.start(each_backend, concurrency=1)
    (worker,) = supervisor.workers()
    wait_until(lambda: len(step_tokens(each_backend, "unheard")) >= 5, message="the delivery to be under way")

    frozen_at = time.monotonic()
    freeze(supervisor.pid)  # its renewals stop, and so do its heartbeats: the worker must not go on
    try:
        wait_gone([worker], timeout=10)
        took = time.monotonic() - frozen_at
        written = step_tokens(each_backend, "unheard")
        wait_until(lambda: status(each_ledger, "unheard") != "running", timeout=10, message="the lease to expire")
        (lease,) = each_ledger.executions.history("unheard")
        assert last_write_at(each_backend, "unheard", 1) < lease.expires_at
        assert step_tokens(each_backend, "unheard") == written
    finally:
        thaw(supervisor.pid)
    assert took < LEASE_MS / 1000, f"the unheard worker went on for {took:.2f} s"

    # Thawed, the supervisor finds its worker gone, replaces it and delivers the execution again.
    supervisor.wait_log(f"worker pid {worker} lost its supervisor")
    wait_until(lambda: status(each_ledger, "unheard") == "completed", timeout=30)
    assert outcomes(each_ledger, "unheard") == [(1, "superseded", None), (2, "acknowledged", "completed")]
    steps = step_tokens(each_backend, "unheard")
    assert steps[: len(written)] == written and {token for _, _, token in steps[len(written):]} == {2}
    assert [key for key, _, _ in steps] == [f"s{i}" for i in range(60)]


# -- a frozen worker ----------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_frozen_worker_is_killed_and_replaced_and_its_execution_delivered_again(
        each_backend, each_ledger, tmp_path, supervisors):
    options = hold_input(tmp_path, hold_tokens=[1])
    admit(each_backend, "frozen", "sv.hold", options)
    supervisor = supervisors.start(each_backend, concurrency=1)
    frozen = wait_until(lambda: waiting(options["log"], 1)).pid
    freeze(frozen)

    supervisor.wait_log(f"worker pid {frozen} silent for")
    wait_gone([frozen], timeout=10)
    wait_until(lambda: status(each_ledger, "frozen") == "completed", timeout=20)
    first, second = each_ledger.executions.history("frozen")
    assert (first.token, first.ended_by) == (1, "superseded")
    assert (second.token, second.ended_by, second.outcome) == (2, "acknowledged", "completed")
    assert second.claimed_at >= first.expires_at
    record = each_ledger.executions.get("frozen")
    assert json.loads(record.result_json)["pid"] != frozen
    assert [(key, token) for key, _, token in step_tokens(each_backend, "frozen")] == [
        ("before", 1), ("hold", 2), ("after", 2)]
    (replacement,) = supervisor.workers()
    assert replacement != frozen
    assert supervisor.popen.poll() is None  # the supervisor itself carried on


PAUSE_CASES = {
    # The workers hear nothing for longer than 3 heartbeats: the resumed worker stops by itself,
    # before it reaches the ledger at all (or its supervisor, resumed too, kills it first: no
    # renewal has confirmed its lease for a whole lease length).
    "worker gives up": ("sv.hold", ()),
    # Workers that wait 50 heartbeats survive the pause: the resumed worker's next step write
    # meets the fence, or the supervisor kills it first (no renewal has confirmed its lease, or
    # its renewal came back lost).
    "step write refused": ("sv.hold", ("--heartbeat-misses", "50")),
    # The resumed worker has nothing left to write: its supervisor's acknowledgement is refused.
    "acknowledgement refused": ("sv.finish_late", ("--heartbeat-misses", "50")),
}


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.parametrize("case", list(PAUSE_CASES))
def test_a_frozen_supervisor_and_its_workers_resume_to_find_their_writes_refused(
        case, each_backend, each_ledger, tmp_path, supervisors):
    workflow, options_of_the_first = PAUSE_CASES[case]
    options = hold_input(tmp_path, hold_tokens=[1])
    admit(each_backend, "paused", workflow, options)
    first = supervisors.start(each_backend, concurrency=1, extra=options_of_the_first)
    stale = wait_until(lambda: waiting(options["log"], 1)).pid
    freeze_group(first.pgid)  # the supervisor and its workers, as a paused host or VM would be

    second = supervisors.start(each_backend, concurrency=1)
    wait_until(lambda: status(each_ledger, "paused") == "completed", timeout=30, message="the takeover")
    assert "delivery execution=" not in first.log()  # it really was paused throughout
    taken_over = outcomes(each_ledger, "paused")
    assert taken_over == [(1, "superseded", None), (2, "acknowledged", "completed")]
    result = each_ledger.executions.get("paused").result_json
    assert json.loads(result)["token"] == 2
    steps = step_tokens(each_backend, "paused")
    recorded = [("before", 1, 1), ("hold", 1, 2), ("after", 1, 2)] if workflow == "sv.hold" else \
        [("before", 1, 1), ("after", 1, 1)]
    assert steps == recorded

    Path(options["gate"]).touch()  # the stale worker may now carry on...
    thaw_group(first.pgid)
    unconfirmed = f"token 1: no renewal has confirmed its lease for {LEASE_MS} ms"
    if case == "worker gives up":
        wait_gone([stale], timeout=15)
        wait_until(lambda: f"worker pid {stale} lost its supervisor" in first.log() or unconfirmed in first.log(),
                   message="the supervisor to say why its worker stopped")
    else:
        # Two things race once thawed, and either keeps the stale worker out: its own write (or
        # its supervisor's acknowledgement) refused by the token, or its supervisor's renewal
        # finding the lease lost and killing it before it gets that far.
        refused = "delivery execution=paused token=1 outcome=lost"
        killed = (f"token 1: the lease is lost; killing worker pid {stale}", unconfirmed)
        wait_until(lambda: refused in first.log() or any(k in first.log() for k in killed),
                   message="the stale delivery to end")
        if any(k in first.log() for k in killed):  # logged before the release it leads to is refused
            wait_gone([stale], timeout=15)
        else:
            assert not gone(stale)  # not killed: the fence alone kept it out, and the pool reuses it
            if case == "acknowledgement refused":
                assert [e.token for e in read_log(options["log"]) if e.event == "finishing"] == [2, 1]
    assert first.popen.poll() is None and second.popen.poll() is None  # both carry on
    # ...and nothing it did counted: the outcome and the records are the new holder's.
    assert outcomes(each_ledger, "paused") == taken_over
    assert each_ledger.executions.get("paused").result_json == result
    assert step_tokens(each_backend, "paused") == steps
    if workflow == "sv.hold":  # the stale worker got no further than the step it could not record
        assert ("after", 1) not in [(e.step_key, e.token) for e in read_log(options["log"])]


# -- replacing a worker -------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(60)
def test_replacing_a_dead_worker_of_a_slow_loading_app_leaves_the_other_workers_running(
        each_backend, each_ledger, tmp_path, supervisors):
    # Loading the app takes longer than a worker waits for a heartbeat (3 x 200 ms), as a real
    # app importing big libraries may: the supervisor must keep the others hearing from it.
    options = hold_input(tmp_path, hold_tokens=[1])
    admit(each_backend, "busy", "sv.hold", options)
    supervisor = supervisors.start(each_backend, concurrency=2, env={"SV_IMPORT_DELAY_S": "1.5"})
    busy = wait_until(lambda: waiting(options["log"], 1)).pid
    (idle,) = [pid for pid in supervisor.workers() if pid != busy]
    sigkill(idle)  # idle, or still loading the app: the pool starts it beside the busy one
    supervisor.wait_log(f"worker pid {idle} killed by SIGKILL")
    admit(each_backend, "probe", "sv.noop3")  # runs only once the replacement is up and the loop runs again
    wait_until(lambda: status(each_ledger, "probe") == "completed", timeout=20)

    assert not gone(busy), "the busy worker quit while its supervisor started another"
    Path(options["gate"]).touch()
    wait_until(lambda: status(each_ledger, "busy") == "completed", timeout=20)
    assert outcomes(each_ledger, "busy") == [(1, "acknowledged", "completed")]
    assert "lost its supervisor" not in supervisor.log()
    assert supervisor.log().count("worker pid") == 1, "a healthy worker was taken for dead"
    wait_gone([idle])


@pytest.mark.timeout(60)
def test_a_stepped_system_clock_does_not_make_workers_take_their_live_supervisor_for_gone(
        each_backend, each_ledger, supervisors):
    # A worker checks that its supervisor's pid was not reused by another process. The
    # supervisor's wall-clock start time moves when the clock is stepped (the kernel derives it
    # from the boot time, which moves with the clock): a check that compared it would have every
    # worker quit mid-step, and every lease expire, after one clock step.
    supervisor = supervisors.start(each_backend, concurrency=2, env={"SV_BOOT_TIME_SHIFT_S": "1.5"})
    workers = set(supervisor.workers())
    for n in range(6):
        admit(each_backend, f"after-step-{n}", "sv.noop3")
    wait_until(lambda: all(status(each_ledger, f"after-step-{n}") == "completed" for n in range(6)), timeout=20)
    # Several heartbeats go by with the workers idle, each one checking on its supervisor.
    time.sleep(5 * HEARTBEAT_MS / 1000)
    admit(each_backend, "probe", "sv.noop3")
    wait_until(lambda: status(each_ledger, "probe") == "completed", timeout=20)
    assert "lost its supervisor" not in supervisor.log() and "is gone" not in supervisor.log()
    assert set(supervisor.workers()) == workers, "a worker quit while its supervisor was alive"
    assert [h.token for h in each_ledger.executions.history("probe")] == [1]


# -- shutdown -----------------------------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig, target", [(signal.SIGTERM, "supervisor"), (signal.SIGINT, "process group"),
                                         (signal.SIGTERM, "process group")])
def test_a_stop_signal_lets_a_running_delivery_finish_within_the_grace_period(
        sig, target, each_backend, each_ledger, tmp_path, supervisors):
    options = hold_input(tmp_path, hold_tokens=[1])
    admit(each_backend, "finishing", "sv.hold", options)
    supervisor = supervisors.start(each_backend, concurrency=2, grace_ms=20_000)
    workers = supervisor.workers()
    wait_until(lambda: waiting(options["log"], 1))
    if target == "supervisor":
        supervisor.signal(sig)
    else:  # Ctrl-C in a terminal, or a service manager stopping the whole group: workers ignore it
        supervisor.signal_group(sig)
    supervisor.wait_log("stopping: no new claims")
    admit(each_backend, "too-late", "sv.noop3")  # no longer claimed

    Path(options["gate"]).touch()
    assert supervisor.wait(20) == 0
    wait_gone(workers)
    assert outcomes(each_ledger, "finishing") == [(1, "acknowledged", "completed")]
    record = each_ledger.executions.get("too-late")
    assert (record.status, record.token) == ("admitted", 0)


@pytest.mark.timeout(60)
def test_a_stop_signal_releases_a_delivery_that_cannot_finish_within_the_grace_period(
        each_backend, each_ledger, tmp_path, supervisors):
    options = hold_input(tmp_path, hold_tokens=[1])
    admit(each_backend, "unfinished", "sv.hold", options)
    supervisor = supervisors.start(each_backend, concurrency=1, grace_ms=500)
    workers = supervisor.workers()
    wait_until(lambda: waiting(options["log"], 1))

    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(20) == 0
    wait_gone(workers)
    assert "grace period over" in supervisor.log()
    assert outcomes(each_ledger, "unfinished") == [(1, "released", None)]
    record = each_ledger.executions.get("unfinished")
    assert (record.status, record.unacknowledged_deliveries) == ("admitted", 1)
    assert [key for key, _, _ in step_tokens(each_backend, "unfinished")] == ["before"]


@pytest.mark.timeout(60)
def test_a_second_stop_signal_exits_at_once_with_a_nonzero_code(each_backend, each_ledger, tmp_path, supervisors):
    options = hold_input(tmp_path, hold_tokens=[1])
    admit(each_backend, "abandoned", "sv.hold", options)
    supervisor = supervisors.start(each_backend, concurrency=1, grace_ms=60_000)
    workers = supervisor.workers()
    wait_until(lambda: waiting(options["log"], 1))

    supervisor.signal(signal.SIGTERM)
    supervisor.wait_log("stopping: no new claims")
    signalled = time.monotonic()
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(20) != 0
    assert time.monotonic() - signalled < 5, "the second signal did not stop the supervisor at once"
    wait_gone(workers)
    assert "second stop request" in supervisor.log()
    # Not released: the lease is left to expire, and the execution is delivered again later.
    (lease,) = each_ledger.executions.history("abandoned")
    assert lease.ended_by in (None, "expired")
    wait_until(lambda: status(each_ledger, "abandoned") == "admitted", timeout=LEASE_MS / 1000 + 5)
    assert each_ledger.executions.get("abandoned").unacknowledged_deliveries == 1
