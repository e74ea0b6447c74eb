"""Registering workflows and loading a user's app (the CLI's `APP`) by module name or .py path."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests import workflows_sample as sample  # noqa: E402
from worker import AppNotFound, Registry, default_registry  # noqa: E402
from worker._runtime.loading import load_app  # noqa: E402
from worker.testing import run_workflow  # noqa: E402

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True)
def isolated_imports(monkeypatch):
    """Apps loaded by a test leave sys.path, sys.modules and the default registry as they were."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(default_registry, "_workflows", dict(default_registry._workflows))
    sample.reset()
    modules = set(sys.modules)
    yield
    for name in set(sys.modules) - modules:
        del sys.modules[name]


def write_app(folder: Path, name: str, source: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(source))
    return path


def test_load_app_by_module_name_returns_the_modules_own_registry():
    registry = load_app("tests.workflows_sample")

    assert registry is sample.registry
    assert {"abc", "order", "retrying"} <= set(registry.names())
    assert "abc" in registry and "abc" not in default_registry


def test_load_app_by_path_with_its_own_registry_and_a_neighbour_module(tmp_path):
    write_app(tmp_path, "greeting_words.py", """
        WORD = "hello"
    """)
    path = write_app(tmp_path, "greeting_app.py", """
        from greeting_words import WORD
        from worker import Registry

        registry = Registry()

        def say(word, name):
            return f"{word} {name}"

        @registry.workflow("greet")
        def greet(ctx, input):
            return ctx.run("say", say, WORD, input)
    """)

    registry = load_app(str(path))

    assert registry.names() == ["greet"]
    assert load_app(str(path)) is registry  # loading the same file again imports nothing new
    record = run_workflow(registry, "greet", "ada")
    assert record.status == "completed" and json.loads(record.result_json) == "hello ada"


def test_load_app_by_path_with_the_decorator_fills_the_default_registry(tmp_path):
    path = write_app(tmp_path, "decorated_app.py", """
        from worker import workflow

        @workflow("registry_test_decorated")
        def decorated(ctx, input):
            return input * 2
    """)

    registry = load_app(str(path))

    assert registry is default_registry
    assert "registry_test_decorated" in registry
    assert json.loads(run_workflow(registry, "registry_test_decorated", 21).result_json) == 42


def test_a_missing_module_raises_app_not_found():
    with pytest.raises(AppNotFound, match="no_such_yieldstar_app"):
        load_app("no_such_yieldstar_app")


def test_a_missing_file_raises_app_not_found(tmp_path):
    with pytest.raises(AppNotFound, match="does not exist"):
        load_app(str(tmp_path / "missing_app.py"))


def test_an_app_that_cannot_import_a_dependency_raises_app_not_found(tmp_path):
    path = write_app(tmp_path, "needy_app.py", """
        import no_such_dependency_of_the_app
    """)

    with pytest.raises(AppNotFound, match="no_such_dependency_of_the_app"):
        load_app(str(path))
    assert "needy_app" not in sys.modules


def test_an_app_that_failed_to_import_loads_once_fixed(tmp_path):
    path = write_app(tmp_path, "broken_app.py", """
        raise RuntimeError("half written")
    """)
    with pytest.raises((RuntimeError, AppNotFound), match="half written"):
        load_app(str(path))
    assert "broken_app" not in sys.modules  # no half-imported module left behind

    write_app(tmp_path, "broken_app.py", """
        from worker import Registry
        registry = Registry()
        registry.workflow("fixed")(lambda ctx, input: "ok")
    """)
    assert load_app(str(path)).names() == ["fixed"]


@pytest.mark.parametrize("app", ["", None, 3])
def test_an_app_argument_that_is_not_a_name_is_refused(app):
    with pytest.raises(ValueError, match="app"):
        load_app(app)


def test_two_functions_under_one_name_are_refused():
    registry = Registry()

    @registry.workflow("pay")
    def pay(ctx, input):
        return 1

    def other_pay(ctx, input):
        return 2

    with pytest.raises(ValueError, match="'pay'"):
        registry.workflow("pay")(other_pay)
    assert registry.get("pay") is pay


def test_registering_the_same_function_again_is_allowed():
    registry = Registry()

    def pay(ctx, input):
        return 1

    registry.workflow("pay")(pay)
    registry.workflow("pay")(pay)  # e.g. its module imported twice

    assert registry.names() == ["pay"] and registry.get("pay") is pay


@pytest.mark.parametrize("name", ["", "bad\nname", 7])
def test_a_workflow_name_must_be_an_identifier(name):
    with pytest.raises(ValueError):
        Registry().workflow(name)


def test_only_callables_can_be_registered():
    with pytest.raises(ValueError, match="function"):
        Registry().workflow("x")("not a function")
