"""`python scripts/chaos.py ARGS` is `yieldstar chaos ARGS`: run it from a checkout, installed or not.

    python scripts/chaos.py --seed 7 --duration 600 --supervisors 3 --concurrency 4 \
        --executions 5000 --report docs/chaos-report.json --summary docs/chaos-summary.txt
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from supervisor.cli import chaos  # noqa: E402

if __name__ == "__main__":
    chaos(sys.argv[1:], prog_name="chaos.py")
