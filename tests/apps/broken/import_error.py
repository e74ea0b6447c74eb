"""An app that imports a library that is not installed."""

import yieldstar_no_such_library  # noqa: F401
