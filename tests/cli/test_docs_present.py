"""The docs state the present: what the code does and what was measured, with each measurement's machine,
command and date; never how the project came to be (who worked on what, which issue asked, what changed). A phrase of
that kind in README.md or docs/ is named here with its file and line."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: phrases that tell history rather than the present (a library's own issue may be cited: "the library's issue")
HISTORY = re.compile(r"\b(no longer|used to be|previously|formerly|renovation|"
                     r"until now|was added|were added|has been (?:added|fixed|moved|changed))\b|"
                     r"(?<!library's )\bissue #\d+", re.IGNORECASE)


def test_readme_and_docs_tell_no_history():
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if HISTORY.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {HISTORY.search(line).group(0)}")
    assert found == []


def test_code_tests_and_configs_name_no_issue_they_came_from():
    """Comments, docstrings and tests say what the code does: an ``issue #N`` of this project is history (a library's
    issue cited as the source of a fact, "the library's issue #N", is not)."""
    pattern = re.compile(r"(?<!library's )\bissue #\d+", re.IGNORECASE)
    found = []
    for folder in ("nas_cli", "tasks", "conf", "tests", "benchmarks", "hydra_plugins"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in (".py", ".yaml", ".sh") and "study" not in path.relative_to(ROOT).parts[1:2]:
                found += [f"{path.relative_to(ROOT)}:{n}" for n, line in enumerate(path.read_text().splitlines(), 1)
                          if pattern.search(line) and path.name != "test_docs_present.py"]
    assert found == []
