"""`python scripts/chaos.py ARGS` is `yieldstar chaos ARGS`: run it from a checkout, installed or not.

    sudo python scripts/chaos.py --seed 20261202 --duration 600 --supervisors 3 --concurrency 4 \
        --executions 5000 --lease-ms 1500 --renew-ms 300 --heartbeat-ms 200 \
        --report docs/chaos-report.json --summary docs/chaos-summary.txt

(as root for `disk_full`, which mounts a tmpfs for the ledger; without root it is left out).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from supervisor.cli.run import chaos  # noqa: E402

if __name__ == "__main__":
    chaos(sys.argv[1:], prog_name="chaos.py")
