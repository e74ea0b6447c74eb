"""docs/async.md's parallel-steps example works as written: its app's unit test passes."""

import os
import subprocess
import sys

import pytest
from test_docs_operators import code_block

ASYNC_MD = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs",
                        "async.md")


@pytest.mark.timeout(60)
def test_the_parallel_steps_example_runs_as_written(tmp_path):
    with open(ASYNC_MD) as f:
        text = f.read()
    (tmp_path / "quotes.py").write_text(code_block(text, "# quotes.py"))
    (tmp_path / "test_quotes.py").write_text(code_block(text, "# test_quotes.py"))
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_quotes.py"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=50)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout
