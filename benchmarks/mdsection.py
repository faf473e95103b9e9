"""Replace one '## ' section of docs/benchmarks.md (or append it), keeping the others."""
from __future__ import annotations

from pathlib import Path


def replace_section(md: Path, section: str, lines: list[str]) -> None:
    text = md.read_text() if md.exists() else "# Benchmarks\n\n"
    start = text.find(section)
    if start >= 0:
        end = text.find("\n## ", start + len(section))
        text = text[:start] + text[end + 1 if end >= 0 else len(text):]
    md.write_text(text.rstrip() + "\n\n" + "\n".join(lines) + "\n")
