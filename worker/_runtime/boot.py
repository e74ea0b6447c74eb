"""A worker process's first code: `python .../worker/_runtime/boot.py SETTINGS_JSON`, as the
supervisor's pool starts it.

It imports yieldstar's own packages before anything of the app's can be found. Started as
`python -m worker._runtime.child`, a child would look `worker` up on a sys.path that begins with
its working folder: where `supervise` is often started, the app's folder, which may hold a
`worker.py` or a `supervisor.py` of its own, imported then in the runtime's place (and the
child dying before it could say why). Run by its path, Python puts this file's folder first
instead: `main` takes it off, imports `supervisor` and `worker` from the folder that holds them
whatever sys.path says, and only then does `child.main` put the supervisor's sys.path, the
app's folder among it, ahead of the rest. An app that imports a file of its own under one of
those names gets yieldstar's package, and is told so (`loading.load_app`).

No relative imports here: this file runs as `__main__`, outside its package.
"""

import importlib.machinery
import os
import sys

# The folder that holds the `supervisor` and `worker` packages: this file is worker/_runtime/boot.py.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGES = ("supervisor", "worker")


class RuntimeFirst:
    """A finder consulted before sys.path: `supervisor` and `worker` from ROOT."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        return importlib.machinery.PathFinder.find_spec(name, [ROOT]) if name in PACKAGES else None


def main() -> None:
    # This file's folder, which Python puts first (unless told not to, PYTHONSAFEPATH): its
    # modules are the package's, never to be imported bare.
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]
    sys.meta_path.insert(0, RuntimeFirst)
    try:
        from worker._runtime.child import main as serve
    finally:
        sys.meta_path.remove(RuntimeFirst)
    serve(sys.argv)


if __name__ == "__main__":
    main()
