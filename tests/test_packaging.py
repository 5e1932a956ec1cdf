"""Packaging promises: README's two set-up commands, CI running the README test command, the changelog."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block, "README.md must start with a bash block holding the two set-up commands"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_readme_starts_with_two_commands():
    text = (ROOT / "README.md").read_text()
    first_block = text.index("```bash")
    assert text[:first_block].count("\n") <= 3, "the set-up commands must come first in README.md"
    cmds = _readme_commands()
    assert len(cmds) == 2, cmds
    assert "nvfp4compat demo" in cmds[0] and "nox" in cmds[1]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert _readme_commands()[1] in ci, ".ci/run must run README's test command verbatim"


def test_changelog_is_keep_a_changelog():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog")
    assert "## [Unreleased]" in text
    for section in re.findall(r"^### (\w+)", text, re.M):
        assert section in {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}, section
