"""The README's grid-and-compare runs as written (at small sizes): the grid over schemes,
heads and seeds, then both ``nas-report ... --baseline scheme=unas`` lines and the ``nas-eval``
line; the baseline is read as ``seed=auto`` reads it (each configuration against the baseline
scheme at the same number of heads)."""
import json
import re
import shlex
from pathlib import Path

import pytest

from helpers import NAS_RUN, nas_run, run_command
from nas_cli.report.collect import find_runs
from nas_cli.report.compare import select_baselines
from nas_cli.report.table import group_runs
from nas_cli.sweeps.design import grid, pair_up

README = Path(__file__).resolve().parents[2] / "README.md"
#: the README's commands at small sizes: a few steps on a small training set, without the diagnostics'
#: figures (what is checked here reads the numbers; drawing them was a quarter of each 4-step job)
SMALL = ["debug=fast", "trainer.max_steps=4", "trainer.val_check_interval=2", "trainer.limit_val_batches=1",
         "task.train_size=64", "task.test_size=24", "logger=csv", "diagnostics.plots=never"]


def readme_line(start: str) -> list[str]:
    """The README's command line that starts with ``start``, as argv (its comment dropped)."""
    found = [ln for ln in README.read_text().splitlines() if ln.startswith(start)]
    assert found, f"the README has no line starting with {start!r}"
    return shlex.split(found[0].split("#")[0])


@pytest.fixture(scope="module")
def readme_sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("readme")
    argv = readme_line("nas-run -m attention=unas,dnas,hnas model.heads=4,8 seed=1,2,3")
    assert argv[0] == "nas-run"
    proc = nas_run(*argv[1:], *SMALL, "hydra.sweep.dir=outputs/sweeps/grid", cwd=root, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "setup plugin" not in proc.stdout + proc.stderr  # no alembic noise from Hydra's plugin scan
    assert re.search(r"┃ heads ┃ seed ┃", proc.stdout), proc.stdout[-2000:]  # the seeds told apart
    # the sweep's terminal: what runs, one line per finished job, the table, the folder and how to compare
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    assert len(lines) <= 45, "\n".join(lines)
    assert len([ln for ln in lines if ln.startswith("done: outputs/sweeps/grid/")]) == 18
    said = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert said[0].startswith("nas-run: sweep outputs/sweeps/grid: attention=unas,dnas,hnas x model.heads=4,8 x seed=1,2,3")
    assert "compare them: nas-report outputs/sweeps/grid --baseline scheme=unas" in proc.stdout
    assert "Launching" not in proc.stdout + proc.stderr and "nas-run result" not in proc.stdout
    return root


def _run_readme(line: str, root: Path, **subst) -> "subprocess.CompletedProcess":  # noqa: F821
    argv = readme_line(line)
    text = shlex.join(argv)
    for key, value in subst.items():
        text = text.replace(f"<{key}>", value)
    argv = shlex.split(text)
    return run_command([str(Path(NAS_RUN).with_name(argv[0])), *argv[1:]], cwd=root, timeout=600)


def test_the_readme_grid_and_both_report_lines_run_as_written(readme_sweep):
    proc = _run_readme("nas-report outputs/sweeps/<sweep> --baseline scheme=unas      #", readme_sweep,
                       sweep="grid")
    assert proc.returncode == 0, proc.stderr
    # each scheme against unas at its own number of heads, never a refusal for two matching groups
    for scheme in ("dnas", "hnas"):
        for h in (4, 8):
            assert re.search(rf"{scheme} h{h}\s*│\s*unas h{h}\s*│", proc.stdout), proc.stdout[-3000:]
    assert not re.search(r"dnas h4\s*│\s*unas h8", proc.stdout)
    detect = _run_readme("nas-report outputs/sweeps/<sweep> --baseline scheme=unas --detect bleu=0.5", readme_sweep,
                         sweep="grid")
    assert detect.returncode == 0, detect.stderr
    assert "seeds for ±detect" in detect.stdout and "±0.5" in detect.stdout
    equivalence = _run_readme("nas-report outputs/sweeps/<sweep> --baseline scheme=unas --equivalence bleu=1",
                              readme_sweep, sweep="grid")
    assert equivalence.returncode == 0, equivalence.stderr
    assert "equivalence (TOST, Holm)" in equivalence.stdout and "equivalent within ±1" in equivalence.stdout
    tables = _run_readme("nas-report outputs/sweeps/<sweep> --baseline scheme=unas --out tables", readme_sweep,
                         sweep="grid")
    assert tables.returncode == 0, tables.stderr
    import pandas as pd

    comparison = pd.read_csv(readme_sweep / "tables" / "comparison.csv")
    assert set(zip(comparison["system"], comparison["baseline_group"])) == {
        ("dnas h4", "unas h4"), ("dnas h8", "unas h8"), ("hnas h4", "unas h4"), ("hnas h8", "unas h8")}
    assert pd.api.types.is_numeric_dtype(comparison["p_holm"])


def test_report_and_seed_auto_name_the_same_baseline_pairs(readme_sweep):
    argv = readme_line("nas-run -m attention=unas,dnas,hnas model.heads=4,8 seed=1,2,3")
    axes = [(a.split("=")[0], a.split("=")[1].split(",")) for a in argv[2:] if not a.startswith("seed=")]
    configs = grid(axes, [])
    sequential = {(configs[s].values["attention"], configs[s].values["model.heads"]):
                  (configs[b].values["attention"], configs[b].values["model.heads"])
                  for s, b in pair_up(configs, ("attention", "unas")).items()}
    groups = group_runs(find_runs([str(readme_sweep / "outputs" / "sweeps" / "grid")]))
    chosen = select_baselines(groups, "scheme=unas")
    report = {(g.runs[0].scheme, str(g.runs[0].heads)): (b.runs[0].scheme, str(b.runs[0].heads))
              for g, b in chosen.pairs}
    assert report == sequential and len(report) == 4 and chosen.matched_on == ["heads"]
    assert all(g.n == 3 for g, _ in chosen.pairs) and not chosen.unmatched
    # a selector that names one group keeps its meaning: every other group against it
    one = select_baselines(groups, "scheme=unas,heads=8")
    assert len(one.groups) == 1 and len(one.pairs) == 5 and {b.label for _, b in one.pairs} == {"unas h8"}


def test_the_readme_nas_eval_line_works_on_a_run_the_readme_made(readme_sweep):
    run = next((readme_sweep / "outputs" / "sweeps" / "grid").glob("*_reverse_dnas-h4"))
    line = readme_line("nas-eval outputs/runs/")
    assert re.fullmatch(r"outputs/runs/<task>/<scheme>-h<heads>/<time>", line[1])  # the run directories' layout
    proc = run_command([str(Path(NAS_RUN).with_name("nas-eval")), str(run), *line[2:]], cwd=readme_sweep,
                       timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((run / "eval" / "test-beam5.json").read_text())
    assert result["decoding"]["beam"] == 5 and result["metrics"]["test/bleu"] >= 0
