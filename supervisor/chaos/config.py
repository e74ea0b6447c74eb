"""The configuration of a chaos run: how long, how many processes, which timings and faults."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

from ..ledger.errors import InvalidArgument
from ..pool import MAX_CONCURRENCY, MAX_WORKERS
from .netns import MAX_HOSTS
from .faults import ALL_KINDS, FaultKind
from .workload import CHAOS_APP


@dataclass(frozen=True)
class ChaosConfig:
    seed: int = 1
    duration_s: float = 60.0
    supervisors: int = 3
    concurrency: int = 4
    executions: int = 1000
    lease_ms: int = 1500
    renew_ms: int = 300
    heartbeat_ms: int = 200
    faults: tuple = ALL_KINDS
    fault_interval_s: float = 1.2
    drain_timeout_s: float = 300.0
    grace_ms: int = 5000
    poll_ms: int = 100
    lenient_supervisors: Optional[int] = None  # run with fleet.LENIENT_MISSES; None: 1 if > 1 supervisor
    hosts: int = 0  # > 0: that many network-namespace hosts, one supervisor each, on the run's own server
    app: str = CHAOS_APP  # the workflows the supervisors run; another app brings its own workload (`workload`)
    workers: Optional[int] = None  # worker processes per supervisor (`supervise --workers`); None: one per delivery

    def __post_init__(self) -> None:
        for name in ("supervisors", "concurrency", "executions", "lease_ms", "renew_ms", "heartbeat_ms", "poll_ms"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidArgument(f"{name} must be an int >= 1, got {value!r}")
        for name in ("duration_s", "fault_interval_s", "drain_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value <= 0:
                raise InvalidArgument(f"{name} must be a number > 0, got {value!r}")
        if not isinstance(self.hosts, int) or isinstance(self.hosts, bool) or not 0 <= self.hosts <= MAX_HOSTS:
            raise InvalidArgument(f"hosts must be an int in 0..{MAX_HOSTS}, got {self.hosts!r}")
        if self.hosts and self.supervisors != self.hosts:
            raise InvalidArgument(f"with hosts, each host runs one supervisor: supervisors ({self.supervisors})"
                                  f" must equal hosts ({self.hosts})")
        if self.workers is not None and (not isinstance(self.workers, int) or isinstance(self.workers, bool)
                                         or not 1 <= self.workers <= MAX_WORKERS):
            raise InvalidArgument(f"workers must be an int in 1..{MAX_WORKERS}, got {self.workers!r}")
        limit = MAX_CONCURRENCY if self.workers else MAX_WORKERS
        if self.concurrency > limit:
            raise InvalidArgument(f"concurrency ({self.concurrency}) may be at most {limit}"
                                  + ("" if self.workers else ": give workers (--workers) to run more deliveries"
                                                             " than worker processes"))
        if self.lenient_supervisors is None:
            object.__setattr__(self, "lenient_supervisors", 1 if self.supervisors > 1 else 0)
        if not isinstance(self.lenient_supervisors, int) or not 0 <= self.lenient_supervisors <= self.supervisors:
            raise InvalidArgument(f"lenient_supervisors must be an int in 0..supervisors ({self.supervisors}),"
                                  f" got {self.lenient_supervisors!r}")
        if self.renew_ms >= self.lease_ms:
            raise InvalidArgument(f"renew_ms ({self.renew_ms}) must be less than lease_ms ({self.lease_ms})")
        if self.heartbeat_ms * 3 >= self.lease_ms:
            raise InvalidArgument(f"three heartbeats ({3 * self.heartbeat_ms} ms) must fit in a lease"
                                  f" ({self.lease_ms} ms): a frozen worker must be found out before its lease ends")
        object.__setattr__(self, "faults", tuple(FaultKind(k) for k in self.faults))

    @property
    def worker_processes(self) -> int:
        """Worker processes per supervisor."""
        return self.workers or self.concurrency

    @property
    def max_skew_ms(self) -> int:
        """How far any supervisor's clock may be skewed. Two clocks then differ by at most half
        of (lease - renewal interval): a holder renewing on time always has a lease left, by the
        clock of any claimer, and half of that interval is left for a renewal that comes late.
        (On one SQLite file each process's clock decides claimability; a claimer whose clock ran
        a whole lease ahead could take a lease its holder is renewing. That is the documented
        limit of "clocks decide when", which this keeps the run clear of.)"""
        return (self.lease_ms - self.renew_ms) // 4

    def as_dict(self) -> dict:
        d = asdict(self)
        d["faults"] = [k.value for k in self.faults]
        d["max_skew_ms"] = self.max_skew_ms
        return d


def per_supervisor(concurrency: int, workers: Optional[int]) -> str:
    """What each supervisor runs: "4 workers", or "16 deliveries in 2 workers" (`--workers`)."""
    return f"{concurrency} deliveries in {workers} workers" if workers else f"{concurrency} workers"
