"""Markdown output shared by the benchmarks: one section of docs/benchmarks.md each."""
from __future__ import annotations

from pathlib import Path


def num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def write_markdown(path: Path, section: str) -> None:
    """Replace (or append) our section (its heading is the section's first line);
    everything else in the file stays as it was."""
    heading = section.splitlines()[0]
    text = path.read_text() if path.is_file() else "# Benchmarks\n"
    start = text.find(heading + "\n")
    if start < 0 and text.endswith(heading):
        start = len(text) - len(heading)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        nxt = text.find("\n## ", start + len(heading))
        rest = "" if nxt < 0 else text[nxt + 1:]
        text = text[:start] + section + ("\n" + rest if rest else "")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


