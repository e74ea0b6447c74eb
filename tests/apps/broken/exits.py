"""An app that calls sys.exit while it is imported (a script's `main()` run on import)."""

import sys

sys.exit(3)
