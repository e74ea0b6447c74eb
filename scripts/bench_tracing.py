"""What OpenTelemetry tracing costs a worker (SPEC section 13), with and without a provider set.

    .venv/bin/python scripts/bench_tracing.py [--workflows N] [--repeats R] [--step-ms MS]

Prints, in one run on this machine:
- a worker's boot: the wall time of a fresh interpreter importing the worker's runtime and loading
  an app as a worker does (`load_app`), median of 21, for the benchmark app (`worker.apps.bench`,
  no provider set) and for `scripts/bench_tracing_app.py` (the same workflows, in an app that sets
  a provider up with a batch processor and an exporter that only counts), and whether the first
  imported anything of OpenTelemetry (it must not, installed or not, unless the app sets a
  provider);
- start-up: from executing `yieldstar supervise` (4 workers) to its first claim and to its first
  acknowledgement, for each app, interleaved, median of R (`bench_supervisor.start_up`);
- the tracing hooks of one delivery of 3 steps, alone, in a process: what the driver calls
  (`begin_delivery`, the delivery's span made current, a step span or `NO_STEP` per step, the
  end), in µs, where OpenTelemetry is not imported, where it is imported but no provider is set,
  and where one is set (with no stored context, and with a stored `traceparent`);
- workflows/s through a supervisor at concurrency 2 and the workers' CPU time per workflow, for
  each app: 3-step no-op workflows (`noop3`: 4 spans a workflow where a provider is set, its
  delivery and its 3 steps), and with `--step-ms MS` (default 1; 0: none) also 3-step workflows
  whose steps each wait MS ms (`wait3`, `time.sleep`), as steps that call a provider wait on it.
  The apps interleave, R runs each; medians reported, with the provider's cost as a fraction of
  the rate without one, and in µs of workers' CPU a workflow.

The machine is shared and noisy: compare the columns, not the absolute figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_supervisor import admitted, compile_bytecode, start_up, workers  # noqa: E402
from benchlib import cpu_seconds  # noqa: E402

from supervisor.dispatcher import Supervisor, SupervisorConfig  # noqa: E402

PLAIN_APP = "worker.apps.bench"
TRACED_APP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_tracing_app.py")
BOOT = "import worker._runtime.child; from worker._runtime.loading import load_app; load_app({app!r})"


def boot(app: str) -> tuple[float, bool]:
    """Median ms of a fresh interpreter importing a worker's runtime and loading `app`, and
    whether any of those imported OpenTelemetry."""
    code = BOOT.format(app=app)
    times = []
    for _ in range(21):
        began = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        times.append((time.perf_counter() - began) * 1000)
    loaded = subprocess.run([sys.executable, "-c", code + "; import sys; print(any(m.startswith('opentelemetry')"
                             " for m in sys.modules))"], check=True, capture_output=True, text=True).stdout.strip()
    return statistics.median(times), loaded == "True"


HOOKS = """
import sys, time
from supervisor.ledger.values import Completed, ExecutionLease
from worker._runtime.tracing import NO_STEP, begin_delivery
{setup}
lease, stored = ExecutionLease("e", 1, 0), {stored!r}
def delivery():
    trace = begin_delivery(lease, stored, "noop3")
    attached = None if trace is None else trace.attach()
    for key in ("a", "b", "c"):
        span = NO_STEP if trace is None else trace.step(key, 1)
        span.end()
    if trace is not None:
        trace.detach(attached)
        trace.end(Completed("null"), "noop3")
for _ in range(2000):
    delivery()
times = []
for _ in range(7):
    began = time.process_time()
    for _ in range(5000):
        delivery()
    times.append((time.process_time() - began) / 5000 * 1e6)
print(sorted(times)[3])
"""
PROVIDER = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
class Counting(SpanExporter):
    def export(self, spans):
        return SpanExportResult.SUCCESS
provider = TracerProvider()
provider.add_span_processor(BatchSpanProcessor(Counting()))
trace.set_tracer_provider(provider)
"""
STORED = '{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}'


def hooks(setup: str, stored) -> float:
    """µs of CPU the tracing hooks of one 3-step delivery take (the processor's thread included),
    median of 7 batches, in a fresh process."""
    done = subprocess.run([sys.executable, "-c", HOOKS.format(setup=setup, stored=stored)], check=True,
                          capture_output=True, text=True)
    return float(done.stdout)


def throughput(folder: str, app: str, n: int, repetition: int, step_ms: float = 0) -> tuple[float, float]:
    """Workflows/s from the first acknowledgement to the last, and the workers' CPU ms a workflow,
    of `n` 3-step workflows whose steps do nothing (`step_ms` 0) or wait `step_ms` ms each."""
    if step_ms:
        db = admitted(folder, f"{os.path.basename(app)}-wait-{repetition}", n, "wait3", str(step_ms / 1000))
    else:
        db = admitted(folder, f"{os.path.basename(app)}-{repetition}", n)
    me = psutil.Process()
    acks: list[float] = []
    cpu: list[float] = []

    def acknowledged(*_) -> None:
        acks.append(time.perf_counter())
        if len(acks) in (1, n):
            cpu.append(cpu_seconds(workers(me)))

    supervisor = Supervisor(db, app, SupervisorConfig(concurrency=2, poll_ms=50), on_delivery=acknowledged)
    supervisor.run(until_idle=True)
    assert supervisor.stats.completed == n and supervisor.stats.child_deaths == 0, supervisor.stats
    return (n - 1) / (acks[-1] - acks[0]), (cpu[1] - cpu[0]) / (n - 1) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workflows", type=int, default=1500, help="workflows per throughput run (default 1500)")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each; medians are reported (default 5)")
    parser.add_argument("--step-ms", type=float, default=1.0,
                        help="also run workflows whose 3 steps each wait this long, in ms (default 1; 0: do not)")
    args = parser.parse_args()
    compile_bytecode()
    try:
        import opentelemetry.sdk  # noqa: F401
        installed = True
    except ImportError:
        installed = False
    print(f"OpenTelemetry SDK installed: {installed}")
    apps = [("no provider set", PLAIN_APP)] + ([("provider set", TRACED_APP)] if installed else [])
    for name, app in apps:
        boot_ms, imported = boot(app)
        print(f"worker boot, {name} (import runtime, load app, fresh interpreter, median of 21): {boot_ms:.0f} ms;"
              f" OpenTelemetry imported: {imported}")
    print("tracing hooks of one 3-step delivery, in process, CPU (median of 7 x 5000):")
    print(f"  OpenTelemetry not imported:           {hooks('', None):8.2f} µs")
    if installed:
        print(f"  imported, no provider set:            {hooks('import opentelemetry.trace', None):8.2f} µs")
        print(f"  provider set, no stored context:      {hooks(PROVIDER, None):8.2f} µs")
        print(f"  provider set, a stored traceparent:   {hooks(PROVIDER, STORED):8.2f} µs")
    with tempfile.TemporaryDirectory(prefix="yieldstar-bench-") as folder:
        starts: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in apps}
        for r in range(args.repeats):
            for name, app in apps:
                starts[name].append(start_up(folder, r, app=app))
        print(f"start-up, exec to first claim / first acknowledgement (4 workers, median of {args.repeats}):")
        for name, _ in apps:
            print(f"  {name:16} {statistics.median(c for c, _ in starts[name]):6.0f} ms"
                  f" / {statistics.median(a for _, a in starts[name]):6.0f} ms")
        for step_ms in [0.0] + ([args.step_ms] if args.step_ms else []):
            runs: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in apps}
            for r in range(args.repeats):
                for name, app in apps:
                    runs[name].append(throughput(folder, app, args.workflows, r, step_ms))
            steps = "no-op steps" if not step_ms else f"steps that each wait {step_ms:g} ms"
            print(f"3-step workflows of {steps}, at concurrency 2 ({args.workflows} each, median of {args.repeats}):")
            medians = {name: (statistics.median(rate for rate, _ in runs[name]),
                              statistics.median(cpu for _, cpu in runs[name])) for name, _ in apps}
            for name, _ in apps:
                rate, cpu = medians[name]
                print(f"  {name:16} {rate:8,.0f} /s   workers' CPU {cpu:.3f} ms a workflow   (each: "
                      + ", ".join(f"{rate:,.0f}" for rate, _ in runs[name]) + ")")
            if installed:
                (plain_rate, plain_cpu), (traced_rate, traced_cpu) = medians["no provider set"], medians["provider set"]
                print(f"  a provider set: {(plain_rate - traced_rate) / plain_rate:.1%} fewer workflows a second,"
                      f" {(traced_cpu - plain_cpu) * 1000:.0f} µs more of workers' CPU a workflow")
    return 0


if __name__ == "__main__":
    sys.exit(main())
