"""docs/flow-control.md shows real output: its console blocks are one session on a fresh ledger,
the app being the document's python block, replayed here in order as
tests/docs/test_docs_operators.py replays the operators' guide. When an output changes on
purpose, rewrite the document's outputs from a new run with

    .venv/bin/python tests/docs/test_docs_flow.py --update
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_docs_operators import ROOT, assert_replayed, code_block, replay, with_outputs  # noqa: E402

FLOW = ROOT / "docs" / "flow-control.md"


def flow_folder(base: Path) -> Path:
    folder = base / "flow"
    folder.mkdir()
    (folder / "flow.py").write_text(code_block(FLOW.read_text(), "# flow.py"))
    return folder


@pytest.mark.timeout(120)
def test_the_flow_control_guide_shows_the_real_output_of_every_command(tmp_path):
    done = replay(FLOW.read_text(), flow_folder(tmp_path))
    outputs = {command.line: output for command, output in done}
    # The story the guide tells, whatever the wording: the urgent charge ran first, the charges
    # moved to their workflow's queue, whose limits the supervisor recorded; the report timed
    # out before it ran, and the quote's step twice.
    supervised = [output for command, output in done if command.line.startswith("yieldstar supervise")]
    assert supervised[0].index("execution=charge-3") < supervised[0].index("execution=charge-1")
    assert "execution=report-7" not in supervised[1]
    assert "WorkflowTimedOut" in outputs["yieldstar get report-7"]
    assert "StepTimeout after 2 attempts" in outputs["yieldstar get quote-1"]
    listed = {queue["name"]: queue for queue in json.loads(outputs["yieldstar queues --json"])}
    assert (listed["provider"]["concurrency"], listed["provider"]["per_key"], listed["provider"]["rate"]) == (
        2, 1, [5, 1.0])
    assert "provider" in outputs["yieldstar get charge-2"]
    assert_replayed(done)


def update() -> None:
    text = FLOW.read_text()
    with tempfile.TemporaryDirectory() as base:
        text = with_outputs(text, replay(text, flow_folder(Path(base))))
    FLOW.write_text(text)


if __name__ == "__main__":
    if sys.argv[1:] == ["--update"]:
        update()
    else:
        sys.exit(pytest.main([__file__, "-q"]))
