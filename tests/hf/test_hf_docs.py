"""docs/huggingface.md's example runs as written and prints what the page shows."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

DOC = Path(__file__).resolve().parents[2] / "docs" / "huggingface.md"


def test_the_ten_line_example_runs_and_prints_what_the_page_shows(tmp_path):
    text = DOC.read_text()
    section = text[text.index("## In ten lines"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    shown = re.search(r"prints .*?\n\n```\n(.*?)```", section, re.S).group(1)
    (tmp_path / "example.py").write_text(code)
    proc = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == shown
    assert len([ln for ln in code.splitlines() if ln.strip() and not ln.startswith(("import", "from"))]) <= 10
