"""docs/messages.md shows real output: the console blocks of its section on forks are one session
on a fresh ledger, the app being the document's `orders.py` block, replayed here in order as
tests/docs/test_docs_operators.py replays the operators' guide. When an output changes on
purpose, rewrite the document's outputs from a new run with

    .venv/bin/python tests/docs/test_docs_messages.py --update
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_docs_operators import ROOT, assert_replayed, code_block, replay, with_outputs  # noqa: E402

MESSAGES = ROOT / "docs" / "messages.md"


def orders_folder(base: Path) -> Path:
    folder = base / "orders"
    folder.mkdir()
    (folder / "orders.py").write_text(code_block(MESSAGES.read_text(), "# orders.py"))
    return folder


def step_lines(output: str) -> dict[str, str]:
    return {line.split("\t")[0]: line for line in output.splitlines()}


@pytest.mark.timeout(120)
def test_the_fork_section_shows_the_real_output_of_every_command(tmp_path):
    done = replay(MESSAGES.read_text(), orders_folder(tmp_path))
    outputs = {command.line: output for command, output in done}
    # The story the section tells, whatever the times: the fork kept the original's reserve and
    # charge (not run again: their times are the same), and shipped again under its own id.
    original = step_lines(outputs["yieldstar steps order-7"])
    forked = [output for command, output in done if command.line == "yieldstar steps order-7-reship"]
    assert list(step_lines(forked[0])) == ["reserve", "charge"]
    ran = step_lines(forked[1])
    assert (ran["reserve"], ran["charge"]) == (original["reserve"], original["charge"])
    assert ran["ship"] != original["ship"]
    result = json.loads(outputs["yieldstar get order-7-reship --json | python3 -m json.tool"])["result"]
    assert result["parcel"] == "order-7-reship/ship"
    assert_replayed(done)


def update() -> None:
    text = MESSAGES.read_text()
    with tempfile.TemporaryDirectory() as base:
        text = with_outputs(text, replay(text, orders_folder(Path(base))))
    MESSAGES.write_text(text)


if __name__ == "__main__":
    if sys.argv[1:] == ["--update"]:
        update()
    else:
        sys.exit(pytest.main([__file__, "-q"]))
