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


def _reading(page: str) -> str:
    """The Reading's own statements: its prose, and of a table only the last column (a table's first
    columns name what its last column decides)."""
    text = page[page.index("## Reading"):page.index("## The claims, measured")]
    lines = []
    for line in text.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            line = line.strip().strip("|").split(" | ")[-1]
        lines.append(line)
    return "\n".join(lines)


def _numbers(sources: str) -> tuple[list[tuple[float, float]], list[float], list[float]]:
    """The intervals, the Holm-adjusted p-values and all p-values that ``sources`` give: the
    claims table's ``[a, b]`` and ``p(Holm)=x``, nas-report's tables' ``CI a..b``, ``p`` and
    ``p (Holm)`` columns and verdicts (``p=x``, Holm-adjusted there)."""
    import re

    num = r"([+-]?\d+(?:\.\d+)?(?:e-?\d+)?)"
    intervals = [(float(a), float(b)) for a, b in re.findall(rf"\[{num}, {num}\]", sources)]
    intervals += [(float(a), float(b)) for a, b in re.findall(rf"CI {num}\.\.{num}", sources)]
    holm = [float(v) for v in re.findall(rf"p\(Holm\)\s*[=<]\s*{num}", sources)]
    plain = [float(v) for v in re.findall(rf"\bp\s*[=<]\s*{num}", sources)]
    holm += [float(v) for v in re.findall(rf"(?:better|worse|difference) \((?:n=\d+, CI [^,]+, )?p={num}\)", sources)]
    head = None
    for line in sources.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else None
        if cells is None:
            head = None
        elif head is None:
            head = cells
        elif not line.startswith("|---") and len(cells) == len(head):
            for name, values in (("p (Holm)", holm), ("p", plain)):
                if name in head and re.fullmatch(num, cells[head.index(name)]):
                    values.append(float(cells[head.index(name)]))
    return intervals, holm, holm + plain


def _stale_numbers(reading: str, sources: str) -> list[str]:
    """Every interval ``[a, b]`` and p-value of ``reading`` that ``sources`` do not give, at the
    reading's precision: an interval as written or negated (the reverse comparison), ``Holm p``
    as a Holm-adjusted p, a plain ``p`` as any p-value (an unadjusted link or trend p, or
    docs/speed.md's)."""
    import re

    def near(value: str, x: float) -> bool:
        decimals = len(value.split(".")[1]) if "." in value else 0
        return abs(float(value) - x) <= 0.5 * 10 ** -decimals + 1e-12

    intervals, holm, any_p = _numbers(sources)
    stale = []
    for m in re.finditer(r"\[([+-]?\d+\.\d+), ([+-]?\d+\.\d+)\]", reading):
        lo, hi = m.groups()
        if not any((near(lo, a) and near(hi, b)) or (near(lo, -b) and near(hi, -a)) for a, b in intervals):
            stale.append(m.group(0))
    for m in re.finditer(r"(Holm )?p\s*([=<])\s*(\d\.\d+)((?: and \d\.\d+)*)", reading):
        for value in [m.group(3), *re.findall(r"\d\.\d+", m.group(4))]:
            given = holm if m.group(1) else any_p
            if m.group(2) == "<" and not any(x <= float(value) for x in given) or \
                    m.group(2) == "=" and not any(near(value, x) for x in given):
                stale.append(f"{m.group(0)} ({value})")
    return stale


def test_the_readings_numbers_are_the_generated_ones():
    """The Reading is written by hand, so a Holm family that grew with a new sweep, or a re-run,
    leaves its numbers behind the generated tables; each interval and p it gives must be one the
    generated sections (or docs/speed.md, for the GPU runs) give."""
    page = (ROOT / "docs" / "study.md").read_text()
    sources = page[page.index("## The claims, measured"):] + (ROOT / "docs" / "speed.md").read_text()
    assert _stale_numbers(_reading(page), sources) == []


def test_the_reading_check_finds_a_stale_number():
    sources = ("| +0.47 [-0.31, +1.24], p=0.121 | RealFormer: -2.51 [-3.38, -1.64], p(Holm)=0.006; p(Holm)<0.001\n\n"
               "| system | difference [95% CI] | p | p (Holm) | verdict |\n|---|---|---|---|---|\n"
               "| coda_cs h4 | -1.69 [-3.3, -0.0749] | 0.0460 | 0.276 | no significant difference (n=3, CI -3.3..-0.0749, p=0.276) |\n")
    assert _stale_numbers("+2.51 [+1.64, +3.38], Holm p = 0.006; p = 0.121; Holm p < 0.001; [-3.30, -0.07], "
                          "p = 0.046, Holm p = 0.28", sources) == []
    assert _stale_numbers("[-0.31, +1.25]; Holm p = 0.121; p = 0.007; Holm p = 0.006 and 0.010; Holm p = 0.046",
                          sources) == ["[-0.31, +1.25]", "Holm p = 0.121 (0.121)", "p = 0.007 (0.007)",
                                       "Holm p = 0.006 and 0.010 (0.010)", "Holm p = 0.046 (0.046)"]


def test_single_paired_tests_are_not_labelled_holm():
    """The claims table marks a p-value ``p(Holm)`` only where Holm adjusted it over the schemes
    compared with UNAS; the single paired tests (Sinkhorn against DNAS, one against two additive
    layers, the WikiText-2 and Llama-style rows) are marked ``p``, as its preamble says."""
    page = (ROOT / "docs" / "study.md").read_text()
    table = page[page.index("## The claims, measured"):page.index("## The heads axis")]
    single = ("| More Sinkhorn iterations", "| One-layer additive attention", "| Causal DNAS")
    rows = [line for line in table.splitlines() if line.startswith(single)]
    assert len(rows) == 4
    for row in rows:
        difference = row.strip("|").split("|")[3]
        assert "p(Holm)" not in difference and ("p=" in difference or "p<" in difference), row
    holm_rows = [line for line in table.splitlines() if line.startswith("| CODA beats the Transformer")]
    assert holm_rows and all("p(Holm)" in line for line in holm_rows)
