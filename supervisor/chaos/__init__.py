"""Chaos testing: supervisors killed, frozen and orphaned mid-step, and a checker that proves,
from the ledger and the workflows' own evidence, that nothing was lost or written twice.

    from supervisor.chaos import ChaosConfig, run_chaos, check

`run_chaos` is what `yieldstar chaos` runs; `check(ledger, folder)` works on its own, on any
ledger (and, given the work folder of a chaos run, its evidence). `page.render(report)` draws a
report as a self-contained web page (`python -m supervisor.chaos.page report.json`).
"""

from .checker import CheckResult, check
from .config import ChaosConfig
from .faults import ALL_KINDS, FaultKind, parse_kinds
from .harness import run_chaos
from .report import summary_lines, write_report

__all__ = ["ChaosConfig", "run_chaos", "check", "CheckResult", "FaultKind", "ALL_KINDS", "parse_kinds",
           "summary_lines", "write_report"]
