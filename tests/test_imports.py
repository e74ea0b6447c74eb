"""The packages' public names, and what a worker process imports to start (its start-up time)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import supervisor
import worker

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("package", [supervisor, worker])
def test_every_public_name_of_a_package_is_importable_from_it(package):
    for name in package.__all__:
        assert getattr(package, name) is not None
    assert set(package.__all__) <= set(dir(package))
    namespace: dict = {}
    exec(f"from {package.__name__} import *", namespace)
    assert set(package.__all__) <= set(namespace)


def test_a_name_a_package_does_not_export_is_an_attribute_error_that_names_it():
    with pytest.raises(AttributeError, match="'supervisor' has no attribute 'open_backends'"):
        supervisor.open_backends  # noqa: B018
    with pytest.raises(ImportError, match="Clients"):
        from worker import Clients  # noqa: F401


def modules_imported_by(code: str) -> set[str]:
    done = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sys.modules))"],
                          capture_output=True, text=True, check=True, timeout=30)
    return set(done.stdout.split())


def test_a_worker_process_imports_neither_the_client_nor_the_supervisor_side():
    loaded = modules_imported_by("import worker.child, worker.bench_app")
    assert "worker.driver" in loaded and "supervisor.ledger.sqlite.backend" in loaded
    for module in ("worker.client", "concurrent.futures", "supervisor.dispatcher", "supervisor.cli", "click"):
        assert module not in loaded


def test_an_app_that_defines_workflows_imports_no_ledger_backend():
    loaded = modules_imported_by("from worker import workflow")
    assert "worker.registry" in loaded
    assert not {"worker.client", "supervisor.ledger.backends", "sqlite3"} & loaded
