"""Loading a user's app by module name or .py path, and saying plainly why it would not load.

The supervisor checks an APP name before it starts any process (`check_app_name`); each child
imports the app once, at start (`load_app`), and reports a failure in one line
(`describe_load_failure`). A child imports yieldstar's own packages before the app (`boot`): a
file of the app's called `worker.py` or `supervisor.py` never takes their place, and an app that
imports one under that name is told so, the file named (`_hidden_by_runtime`).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
import types

from supervisor.ledger.errors import InvalidArgument, YieldstarError

from ..registry import AppNotFound, Registry, default_registry


def load_app(app: str) -> Registry:
    """Import the user's app (a module name, or a path to a .py file) and return its registry.

    The app's workflows are those registered with `@workflow` while it was imported. A module
    may instead expose its own `Registry` as a module attribute named `registry`.
    """
    check_app_name(app)
    try:
        if is_app_path(app):
            module = _import_path(app)
        else:
            module = importlib.import_module(app)
    except AppNotFound:
        raise
    except ImportError as exc:
        if isinstance(exc, ModuleNotFoundError) and exc.name is not None and (app + ".").startswith(exc.name + "."):
            raise AppNotFound(f"no module named {exc.name!r}: a module name is imported from the current"
                              " folder or the Python path; a file needs a path ending in .py") from exc
        raise AppNotFound(f"{type(exc).__name__}: {exc}{_where(exc)}{_hidden_by_runtime(exc, app)}") from exc
    except AttributeError as exc:
        hidden = _hidden_by_runtime(exc, app)
        if not hidden:
            raise
        raise AppNotFound(f"{type(exc).__name__}: {exc}{_where(exc)}{hidden}") from exc
    own = getattr(module, "registry", None)
    return own if isinstance(own, Registry) else default_registry


def is_app_path(app: str) -> bool:
    """Whether APP names a file (a .py path) rather than a module."""
    return app.endswith(".py") or os.sep in app


def check_app_name(app: str) -> None:
    """What can be told of APP without importing it: a file that is not there, or a string that
    cannot be a module name. Cheap, so that a supervisor refuses a mistyped APP at once."""
    if not isinstance(app, str) or not app:
        raise InvalidArgument(f"app must be a module name or a .py path, got {app!r}")
    if is_app_path(app):
        _check_app_file(app)
    elif not all(part.isidentifier() for part in app.split(".")):
        raise AppNotFound(f"{app!r} is neither a module name (like shop.workflows) nor a path to a .py file")


def _check_app_file(path: str) -> None:
    """Raise `AppNotFound` unless `path` is a file: saying whether it is missing or a folder."""
    if os.path.isdir(path):
        raise AppNotFound(f"{os.path.abspath(path)} is a folder, not a Python file (give a .py file's path or a"
                          " module name)")
    if not os.path.isfile(path):
        raise AppNotFound(f"app file {os.path.abspath(path)} does not exist")


def describe_load_failure(exc: BaseException) -> str:
    """One line saying why importing the app failed: what a newcomer needs, without a traceback."""
    if isinstance(exc, YieldstarError):  # ours (a missing app, two workflows under one name): says it all
        return str(exc)
    if isinstance(exc, SystemExit):
        return f"it called sys.exit({exc.code!r}) while being imported{_where(exc)}"
    if isinstance(exc, SyntaxError):  # its message names the file and line already
        return f"{type(exc).__name__}: {exc}"
    return f"{type(exc).__name__}: {exc}{_where(exc)}"


def _where(exc: BaseException) -> str:
    """` (file.py, line N)`: the innermost frame of the traceback outside Python's import machinery."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "importlib" not in f.filename
              and not f.filename.startswith("<frozen")]
    if not frames or os.path.abspath(frames[-1].filename) == os.path.abspath(__file__):
        return ""
    return f" ({os.path.basename(frames[-1].filename)}, line {frames[-1].lineno})"


# The top-level packages of the runtime: imported before the app, so an app's own file of one of
# these names is never imported under it.
RUNTIME_PACKAGES = ("supervisor", "worker")


def _hidden_by_runtime(exc: ImportError | AttributeError, app: str) -> str:
    """`: FILE cannot be imported as NAME, ...` when `exc` is the app missing something of a
    module named like one of yieldstar's packages, and the app's folder (or one on the path)
    holds a file of that name: the app meant its own file, and got yieldstar's package. Else ""."""
    if isinstance(exc, ImportError):
        name = exc.name or ""
    else:
        name = exc.obj.__name__ if isinstance(getattr(exc, "obj", None), types.ModuleType) else ""
    package = name.partition(".")[0]
    if package not in RUNTIME_PACKAGES:
        return ""
    ours = os.path.dirname(os.path.abspath(sys.modules[package].__file__ or ""))
    folders = [os.path.dirname(os.path.abspath(app))] if is_app_path(app) else []
    for folder in folders + [os.path.abspath(entry or os.curdir) for entry in sys.path]:
        for own in (os.path.join(folder, package + ".py"), os.path.join(folder, package, "__init__.py")):
            if os.path.isfile(own) and os.path.dirname(own) != ours:
                return (f": {own} cannot be imported as {package!r}, which is yieldstar's own package;"
                        " rename it")
    return ""


def _import_path(path: str):
    path = os.path.abspath(path)
    _check_app_file(path)
    name = os.path.splitext(os.path.basename(path))[0]
    existing = sys.modules.get(name)
    if existing is not None and os.path.abspath(getattr(existing, "__file__", "") or "") == path:
        return existing
    # Its own folder goes on sys.path, so the app can import its neighbours, as `python app.py` would.
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise AppNotFound(f"cannot load app file {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module
