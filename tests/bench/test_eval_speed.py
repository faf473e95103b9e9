"""benchmarks/eval_speed.py: both sides score the same windows, and the section reports their ratios."""
from __future__ import annotations

import json

import pytest

from datafiles import write_lm
from helpers import load_benchmark

eval_speed = load_benchmark("eval_speed")


def test_both_sides_score_the_same_windows_and_the_table_gives_the_ratios(tmp_path):
    data = write_lm(tmp_path / "lm", n=(200, 120, 20))
    out, page = tmp_path / "bench_eval.json", tmp_path / "benchmarks.md"
    eval_speed.main(["--path", str(data), "--models", "tiny", "--repeats", "1", "--threads", "1", "--out", str(out),
                     "--markdown", str(page)])
    saved = json.loads(out.read_text())
    project, plain = (next(r for r in saved["rows"] if r["side"] == side) for side in ("project", "plain"))
    assert project["windows"] == plain["windows"] > 1 and project["tokens"] == plain["tokens"] > 100
    assert project["peak_mb"] > 50 and plain["wall"] > 0 and project["cpu"] > 0
    (row,) = saved["summary"]
    assert row["ratios"]["wall"] == pytest.approx(project["wall"] / plain["wall"])
    assert row["ratios"]["peak_mb"] == pytest.approx(project["peak_mb"] / plain["peak_mb"])
    text = page.read_text()
    assert "## Evaluation against a plain PyTorch loop" in text and f"**{row['ratios']['cpu']:.2f}x**" in text
