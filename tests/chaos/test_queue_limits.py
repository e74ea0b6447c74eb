

@pytest.mark.timeout(60)
def test_a_lease_acknowledged_while_a_claim_waited_for_its_queues_row_lock_is_not_held_against_it():
    """On PostgreSQL a claim reads its time before it waits for its queue's row lock: a lease
    acknowledged during the wait ends, as recorded, after the claim's time. Beyond that allowance
    the same pair is a breach."""
    limits = {QUEUE: QueueLimits(QUEUE, 1, None, None, None)}
    executions = {"e1": (QUEUE, None), "e2": (QUEUE, None)}

    def history(ended_after_claim_ms: int) -> dict:
        return {"e1": [("e1", 1, "h:1", 1_000, 2_500, 1_200 + ended_after_claim_ms, "acknowledged", "completed")],
                "e2": [("e2", 1, "h:2", 1_200, 2_700, 1_900, "acknowledged", "completed")]}

    for ended_after, slack, breaches in ((50, 1_000, []), (50, 0, ["queue_concurrency"]),
                                         (1_100, 1_000, ["queue_concurrency"])):
        found = []
        figures = check_queue_limits(limits, executions, history(ended_after), {}, Clocks(None),
                                     lambda kind, eid, detail: found.append(kind), end_slack_ms=slack)
        assert found == breaches, (ended_after, slack)
        assert figures[QUEUE]["max_live"] == (2 if breaches else 1)
