"""What a worker process imports to start: what it has no use for would only delay its start."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)


def modules_imported_by(code: str) -> set[str]:
    done = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sys.modules))"],
                          capture_output=True, text=True, check=True, timeout=30)
    return set(done.stdout.split())


def test_a_worker_process_imports_neither_the_async_client_nor_the_supervisor_side():
    loaded = modules_imported_by("import worker._runtime.child, worker.apps.bench")
    assert "worker._runtime.driver" in loaded and "supervisor.ledger.sqlite.backend" in loaded
    for module in ("asyncio", "concurrent.futures", "supervisor.dispatcher", "supervisor.cli", "click",
                   "multiprocessing",  # its end of the pipe is worker._runtime.pipe
                   "opentelemetry"):  # installed here, but imported only by an app that sets a provider
        assert module not in loaded, module


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="elsewhere the watch asks psutil")
def test_a_worker_process_on_linux_watches_its_supervisor_without_psutil():
    assert "psutil" not in modules_imported_by("import worker._runtime.child, worker.apps.bench")
