"""The RFC's order shop, where a frozen worker's retry charges nobody twice. One command:

    .venv/bin/python scripts/order_shop.py

Plays act 2 of `yieldstar demo` with real processes on a temporary ledger: supervisor A's worker
charges the card through a fake payment provider that honours idempotency keys, and A freezes
(SIGSTOP) before the answer is recorded. Supervisor B claims the order with a higher token and
asks the provider again with the same key (the effect id), getting the first charge back. A
thaws and its late write is refused. It prints what happened and how many times the provider
charged, and exits 0 only if every verdict holds, "customer charged once" among them. The
workflow and the provider are in `worker/apps/demo_shop.py`.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from supervisor.demo import run_demo  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_demo([2]))
