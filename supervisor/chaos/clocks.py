"""Setting the times of several clocks beside each other.

A chaos run with `clock_skew` gives some supervisors a ledger clock that runs ahead or behind
(their workers inherit it). Every time in the ledger was read from the clock of the process
that wrote it, so before the checker compares two of them it turns each into true time by
taking away its writer's skew. Who wrote what:

- a claim's `claimed_at`, a renewal's `expires_at`, an acknowledgement's or release's
  `ended_at`: the holder's supervisor, whose pid the lease history names (`host:pid`);
- a step's `written_at` and a timer's `until`: the holder's worker, with the same clock;
- a superseded delivery's `ended_at` is its own last `expires_at`, the holder's clock again.

With `--hosts` the ledger's clock is the server's for every process, whatever its host's wall
clock says: every ledger skew is 0, and a host's wall-clock skew (`wall_skew_ms`) moves only the
times the workers write into the step log.

Without a fleet journal (a ledger that no chaos run wrote), every skew is 0.
"""

from __future__ import annotations

from typing import Optional

from .evidence import SupervisorLife

# Beyond any skew the harness gives: used to tell apart two supervisors that had the same pid.
PID_REUSE_SLACK_MS = 5_000


def holder_pid(holder: str) -> Optional[int]:
    """The pid in a lease history's `host:pid`."""
    _, _, pid = holder.rpartition(":")
    return int(pid) if pid.isdigit() else None


class Clocks:
    """The fleet's supervisors by holder, with their skews."""

    def __init__(self, lives: Optional[dict[int, list[SupervisorLife]]]):
        self.known = lives is not None
        self._lives = lives or {}

    def life(self, holder: str, ledger_ms: int) -> Optional[SupervisorLife]:
        """The supervisor that was `holder` at (about) `ledger_ms`, if the fleet journal knows it."""
        pid = holder_pid(holder)
        lives = self._lives.get(pid) if pid is not None else None
        if not lives:
            return None
        found = lives[0]
        for life in lives:
            if life.started_ms <= ledger_ms + PID_REUSE_SLACK_MS:
                found = life
        return found

    def skew(self, holder: str, ledger_ms: int) -> int:
        life = self.life(holder, ledger_ms)
        return life.skew_ms if life is not None else 0

    def wall_skew(self, holder: str, ledger_ms: int) -> int:
        """How far the wall clock of `holder`'s host ran ahead (`--hosts`; 0 otherwise)."""
        life = self.life(holder, ledger_ms)
        return life.wall_skew_ms if life is not None else 0

    def true_ms(self, holder: str, ledger_ms: int) -> int:
        """`ledger_ms`, read from `holder`'s clock, in true time."""
        return ledger_ms - self.skew(holder, ledger_ms)

    def skews(self) -> list[int]:
        """Every supervisor's skew: of its ledger clock, or of its host's wall clock (`--hosts`)."""
        return sorted(life.skew_ms or life.wall_skew_ms for lives in self._lives.values() for life in lives)

    def lives(self) -> list[SupervisorLife]:
        return [life for lives in self._lives.values() for life in lives]
