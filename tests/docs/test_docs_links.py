"""The docs' links lead somewhere, and the CLI reference says what the commands say.

Every relative link in README.md and docs/*.md must name a file (or folder) of the checkout, and
an anchor (`file.md#heading`, `#heading`) a heading of that Markdown file, as GitHub makes
anchors of headings. No network: links to other sites are not followed. Links inside code
blocks and inline code are not links.
"""

from __future__ import annotations

import difflib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)
INLINE_CODE = re.compile(r"(`+)(?!`)(?:(?!\n[ \t]*\n).)+?(?<!`)\1(?!`)", re.S)  # within a paragraph
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)


def prose(text: str) -> str:
    """The text without its code: fenced blocks, indented blocks after a blank line, inline code."""
    text = FENCE.sub("", text)
    text = re.sub(r"(\n[ \t]*\n)((?:(?: {4}|\t).*(?:\n|$))+)", r"\1", text)
    return INLINE_CODE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text without markup, lower case, punctuation but `-` and
    `_` dropped, spaces made hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor of a Markdown page's headings (a repeated heading gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for match in HEADING.finditer(FENCE.sub("", page.read_text(encoding="utf-8"))):
        base = slug(match.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(page: Path) -> list[str]:
    return [m.group(1) for m in LINK.finditer(prose(page.read_text(encoding="utf-8")))]


def broken(page: Path) -> list[str]:
    """The relative links of `page` that lead nowhere, each with why."""
    found = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            found.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            found.append(f"{target}: no heading of {file.name} has that anchor")
    return found


@pytest.mark.timeout(30)
@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_every_relative_link_leads_to_a_file_and_heading(page):
    assert broken(page) == []


@pytest.mark.timeout(30)
def test_the_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text("# A guide\n\n## What `it` costs: `bench.py`\n\n## Steps\n\n## Steps\n")
    page = tmp_path / "README.md"
    page.write_text(
        "See [the guide](docs/guide.md), [its costs](docs/guide.md#what-it-costs-benchpy),\n"
        "[again](docs/guide.md#steps-1), [the site](https://example.com/none.md), [top](#read-me).\n\n"
        "# Read me\n\nA lone ` backtick opens no code past its paragraph.\n\n"
        "[gone](docs/gone.md) and [no heading](docs/guide.md#nowhere), but not `[code](docs/x.md)`:\n\n"
        "```\n[block](docs/y.md)\n```\n")
    found = [line.split(":")[0] for line in broken(page)]
    assert found == ["docs/gone.md", "docs/guide.md#nowhere"]


@pytest.mark.timeout(60)
def test_the_cli_reference_is_what_the_commands_help_says():
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "scripts" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    differences = [line for line in difflib.unified_diff(page.splitlines(), module.render().splitlines(), lineterm="", n=0)
                   if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert differences == [], "docs/cli.md is out of date: run .venv/bin/python scripts/cli_reference.py"
    assert "## `yieldstar supervise`" in page and "--concurrency INTEGER RANGE" in page
