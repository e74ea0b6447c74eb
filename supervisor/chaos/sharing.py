"""What executions share with each other and with the outside world: effects at the external
system, the counter and mailbox stores, and children. Run by a `Checker` on what it loaded.

Effect ids and start-request ids are derived from an execution and a step key, and must be
injective: two executions (a parent and its child among them) must never share one. The chaos
workload asks for such pairs on purpose (`workload.collider_plans`); these checks find a shared
id from the evidence, without decoding ids: every effect step records the effect id it used,
every request at the external system says which execution and step asked, and every start step
records the child it got.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from typing import Optional

from worker.apps.chaos import COUNTER, MAILBOX

from .evidence import read_external
from .recorded import MISSING, RecordedValues, plan_of, value_of


class SharingChecks(RecordedValues):
    """Run by a `Checker`, on the executions, plans, records and stores it loaded."""

    def _effect_owners(self, askers: dict) -> dict[str, set]:
        """{effect id: {(execution, step key), ...}}: the steps that recorded it, and those that
        asked the external system for it. One pair each, unless two executions share an id."""
        owners: dict[str, set] = defaultdict(set)
        for (eid, key), row in self.recorded.items():
            op = self.plans.get(eid, {}).get(key)
            if op is None or op[0] != "effect":
                continue
            ok, value = value_of(row[5])
            if ok and isinstance(value, dict) and isinstance(value.get("effect_id"), str):
                owners[value["effect_id"]].add((eid, key))
        for effect_id, pairs in askers.items():
            owners[effect_id] |= pairs
        return owners

    def _check_effects(self) -> None:
        executed, repeats, askers = read_external(self.folder)
        owners = self._effect_owners(askers)
        for effect_id, pairs in owners.items():
            if len(pairs) > 1:
                self.result.violate("effect_id_shared", min(pairs)[0], f"effect id {effect_id} is used by"
                                    f" {len(pairs)} steps: {sorted(pairs)[:6]}")

        def owner(effect_id: str) -> tuple[Optional[str], Optional[str]]:
            pairs = owners.get(effect_id, set())
            return next(iter(pairs)) if len(pairs) == 1 else (None, None)

        settled = 0
        for effect_id, runs in executed.items():
            if len(runs) != 1:
                self.result.violate("effect_executed_twice", owner(effect_id)[0], f"effect {effect_id} was"
                                    f" executed {len(runs)} times by the external system: {runs}")
        for effect_id, (_, status, result_json, _) in self.effects.items():
            eid, key = owner(effect_id)
            runs = executed.get(effect_id, [])
            if status == "settled":
                settled += 1
                kept = json.loads(result_json)
                if not runs or kept.get("receipt") != runs[0][0]:
                    self.result.violate("effect_result_mismatch", eid, f"effect {effect_id} settled with {kept};"
                                        f" the external system executed {runs}")
                recorded = self._recorded_value(eid, key) if eid is not None else MISSING
                if recorded is not MISSING and recorded != kept:
                    self.result.violate("effect_result_mismatch", eid, f"step {key} records {recorded}; effect"
                                        f" {effect_id} settled with {kept}")
            elif eid is not None and self.executions.get(eid, (None,) * 4)[3] == "completed":
                self.result.violate("effect_unsettled", eid, f"effect {effect_id} is {status} though its"
                                    " execution completed")
        for effect_id in set(executed) - set(self.effects):
            self.result.violate("effect_result_mismatch", owner(effect_id)[0], f"effect {effect_id} was"
                                " executed but never begun in the ledger")
        self.result.figures["effects"] = {
            "effect_ids": len(self.effects), "settled": settled,
            "executions_at_external_system": sum(len(r) for r in executed.values()),
            "max_executions_per_id": max((len(r) for r in executed.values()), default=0),
            "repeat_requests_absorbed": sum(repeats.values()),
            "begun_in_ledger": sum(row[3] for row in self.effects.values()),
            "owners_checked": len(owners),
        }

    def _check_stores(self) -> None:
        figures: dict = {}
        if COUNTER in self.stores:
            value = json.loads(self.stores[COUNTER])
            receipts = self.receipts.get(COUNTER, [])
            increments = sorted(json.loads(r[3]) for r in receipts)
            recorded = []
            for _, eid, key, result_json in receipts:
                step = self._recorded_value(eid, key)
                if step is not MISSING:
                    recorded.append(step)
                    if step != json.loads(result_json):
                        self.result.violate("counter_mismatch", eid, f"step {key} records {step}; its store"
                                            f" receipt {result_json}")
            if value != len(receipts) or increments != list(range(1, len(receipts) + 1)):
                dupes = [v for v, n in Counter(increments).items() if n > 1][:10]
                self.result.violate("counter_mismatch", None, f"counter is {value} after {len(receipts)} receipted"
                                    f" increments; duplicated results {dupes}")
            receipted = {(r[1], r[2]) for r in receipts}
            for (eid, key), row in self.recorded.items():
                op = self.plans.get(eid, {}).get(key)
                if op is not None and op[0] == "inc" and (eid, key) not in receipted:
                    self.result.violate("counter_mismatch", eid, f"increment {key} is recorded without a receipt")
            figures["counter"] = {"value": value, "increments_receipted": len(receipts),
                                  "increments_recorded": len(recorded)}
        if MAILBOX in self.stores:
            remaining = json.loads(self.stores[MAILBOX])
            put, taken = Counter(), Counter()
            for _, eid, key, result_json in self.receipts.get(MAILBOX, []):
                op = self.plans.get(eid, {}).get(key)
                if op is None:
                    continue
                if op[0] == "put":
                    put[json.dumps({"pair": op[2], "from": eid}, sort_keys=True)] += 1
                elif op[0] == "take":
                    item = json.loads(result_json)
                    if not isinstance(item, dict) or item.get("pair") != op[2]:
                        self.result.violate("mailbox_mismatch", eid, f"take {key} for pair {op[2]} got {item}")
                    taken[json.dumps(item, sort_keys=True)] += 1
            left = Counter(json.dumps(item, sort_keys=True) for item in remaining)
            if put != taken + left or any(n > 1 for n in put.values()):
                self.result.violate("mailbox_mismatch", None, f"{sum(put.values())} items put, {sum(taken.values())}"
                                    f" taken, {sum(left.values())} left: {(put - taken - left) or (taken + left - put)}")
            figures["mailbox"] = {"put": sum(put.values()), "taken": sum(taken.values()), "left": len(remaining)}
        self.result.figures["stores"] = figures

    def _check_children(self) -> None:
        """From the parents' plans and records: the child each start recorded, and what the
        parent saw of it. A start id shared by two starts shows as one child recorded twice, or a
        child running a plan that is not its start's."""
        checked = 0
        started: dict[str, list] = defaultdict(list)
        for eid, plan in self.plans.items():
            for key, op in plan.items():
                if op[0] != "child":
                    continue
                child = self._recorded_value(eid, key)
                if child is not MISSING:
                    started[child].append((eid, key, op))
        for child, starts in started.items():
            if len(starts) > 1:
                self.result.violate("start_id_shared", starts[0][0], f"child {child} was started by"
                                    f" {len(starts)} steps: {sorted((e, k) for e, k, _ in starts)[:6]}")
            for eid, key, op in starts:
                target = self.executions.get(child)
                if target is None:
                    self.result.violate("child_result_mismatch", eid, f"step {key} started {child}, which"
                                        " does not exist")
                    continue
                if plan_of(target[2]) != op[2]:
                    self.result.violate("start_id_shared", eid, f"step {key} started {child}, which runs"
                                        " another start's plan")
                waited = self._recorded_value(eid, f"{key}.wait")
                if waited is MISSING or target[3] != "completed":
                    continue
                checked += 1
                if waited != json.loads(target[6]):
                    self.result.violate("child_result_mismatch", eid, f"step {key}.wait records {waited}; child"
                                        f" {child} completed with {target[6]}")
        for request_id, child in self.starts:
            if child not in self.executions:
                self.result.violate("child_result_mismatch", None, f"start {request_id} names {child}, which"
                                    " does not exist")
        self.result.figures["children"] = {"started": len(self.starts), "results_checked": checked}
