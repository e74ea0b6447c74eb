"""`python -m supervisor.chaos LEDGER [--folder WORKDIR] [--json]`: the invariant checker on its own,
on any ledger (and, given a chaos run's work folder, its evidence). Exit 0 iff everything holds."""

import sys

from .checker import main

sys.exit(main())
