"""docs/study.md is generated from the study's committed runs: on a clean checkout the page's
generated sections and docs/study/runs.csv regenerate identically (issue: results that survive a
fresh checkout). Reads only what git tracks under benchmarks/study/, as a fresh checkout has."""
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


def test_the_study_page_regenerates_from_the_committed_runs(tmp_path):
    if shutil.which("git") is None or subprocess.run(["git", "rev-parse"], cwd=ROOT, capture_output=True).returncode:
        pytest.skip("not a git checkout: the committed runs cannot be listed")
    mod = load_benchmark("study_report")
    study = mod.committed_copy(mod.STUDY, tmp_path / "study")
    assert any(study.glob("multi30k/*/summary.json")), "the study's runs are not committed"
    page = tmp_path / "study.md"
    shutil.copy(ROOT / "docs" / "study.md", page)
    assert mod.generate(study, page, None, tmp_path / "runs.csv") == 0
    assert page.read_text() == (ROOT / "docs" / "study.md").read_text()
    assert (tmp_path / "runs.csv").read_text() == (ROOT / "docs" / "study" / "runs.csv").read_text()


def test_below_cut_reads_the_histograms(tmp_path):
    """The share of keys below -20 (Ding et al. Fig. 1) from the diagnostics' histograms."""
    from nas_cli.report.collect import Run

    mod = load_benchmark("study_report")
    edges = [-21.0 + 0.5 * i for i in range(5)]  # -21 .. -19
    layer = {"explained_away": {"bin_edges": edges, "counts": [[1, 2, 3, 4], [0, 0, 0, 10]]}}
    run = Run(path=tmp_path, summary={}, latest={"locations": {"encoder": {"layers": [layer]}}})
    assert mod.below_cut(run) == pytest.approx(3 / 20)
    with pytest.raises(ValueError, match="not a histogram bin edge"):
        mod.below_cut(run, -20.2)
