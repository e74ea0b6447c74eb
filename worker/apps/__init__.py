"""Sample apps, apart from the SDK: each is a module `yieldstar supervise` can run.

- `worker.apps.bench`: one-step workflows the benchmarks (scripts/bench_*.py) time;
- `worker.apps.chaos`: the chaos harness's built-in workload (`yieldstar chaos`, docs/chaos.md);
- `worker.apps.demo_shop`: the order workflow and payment provider `yieldstar demo` plays.
"""
