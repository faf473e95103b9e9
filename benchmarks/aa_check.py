"""The verdicts on trained runs: an A/A check and a 3-seed sweep.

* **A/A**: one configuration (the sort task, UNAS) trained at 6 seeds, seeds 1-3 in one sweep
  directory and seeds 4-6 in another, compared as two pseudo-schemes with
  ``nas-report first second --group-by source --baseline source=first``: nothing differs but
  the seeds, so every metric must get "no significant difference".
* **A 3-seed sweep**: UNAS, DNAS and HNAS on the sort task at seeds 1-3, compared with
  ``nas-report sort --baseline scheme=unas``; the verdicts are those of a paired t-test over
  the seeds (scipy's ``ttest_rel`` on the runs' own numbers, Holm over the two schemes), and the
  item-level tests of each seed are shown beside them as supporting detail.

The runs are kept (summaries and per-item outputs, no checkpoints) in benchmarks/study/sort*;
running the script again resumes or reuses them.

    python benchmarks/aa_check.py        # writes docs/aa_check.json and its section in docs/comparing.md
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STUDY = ROOT / "benchmarks" / "study"
#: the sort task, short enough for 15 runs in well under an hour on 2 cores
COMMON = ["task=sort", "trainer.max_steps=600", "trainer.val_check_interval=300", "progress_bar=false",
          "logger=csv", "threads=1", "trainer.deterministic=true", "diagnostics.plots=never"]
SWEEPS = {
    "sort": ["attention=unas,dnas,hnas", "seed=1,2,3"],
    "sort_aa/first": ["attention=unas", "seed=1,2,3"],
    "sort_aa/second": ["attention=unas", "seed=4,5,6"],
}


def _bin(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def train() -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for where, args in SWEEPS.items():
        proc = subprocess.run([_bin("nas-run"), "-m", *COMMON, *args, f"hydra.sweep.dir={STUDY / where}"],
                              cwd=ROOT, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"sweep {where} failed: {proc.stderr[-2000:]}")


def report(*args: str) -> dict:
    proc = subprocess.run([_bin("nas-report"), *args, "--format", "json"], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"nas-report {' '.join(args)} failed: {proc.stderr}")
    return json.loads(proc.stdout)


def main() -> None:
    train()
    rel = lambda p: str(p.relative_to(ROOT))  # noqa: E731
    aa = report(rel(STUDY / "sort_aa/first"), rel(STUDY / "sort_aa/second"), "--group-by", "source",
                "--baseline", f"source={rel(STUDY / 'sort_aa/first')}", "--metrics", "exact_match,bleu,ppl,jsd")
    sweep = report(rel(STUDY / "sort"), "--baseline", "scheme=unas", "--metrics", "exact_match,bleu,ppl")
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "command": "python benchmarks/aa_check.py",
              "config": COMMON, "aa": aa["comparison"]["rows"], "sweep": sweep["comparison"]["rows"],
              "sweep_items": sweep.get("test_set", {}).get("rows", [])}
    (ROOT / "docs" / "aa_check.json").write_text(json.dumps(result, indent=1) + "\n")
    from nas_cli.bench.markdown import write_markdown

    def fmt(v):
        return "-" if v is None else f"{v:.3f}" if abs(v) < 10 else f"{v:.2f}"

    lines = ["## The verdicts on trained runs (generated)", "",
             f"Generated {result['date']} by `{result['command']}`: the sort task, "
             f"`{' '.join(COMMON)}`, runs kept in `benchmarks/study/sort*`.", "",
             "**A/A**: UNAS at seeds 1-3 against UNAS at seeds 4-6 (two sweep directories, "
             "`nas-report first second --group-by source --baseline source=first`; unpaired, Welch):", "",
             "| metric | seeds 1-3 | seeds 4-6 | difference [95% CI] | p | verdict |", "|---|---|---|---|---|---|"]
    for r in aa["comparison"]["rows"]:
        lines.append(f"| {r['metric']} | {fmt(r['baseline_mean'])} | {fmt(r['system_mean'])} | {r['difference']:+.3g} "
                     f"[{fmt(r['ci_low'])}, {fmt(r['ci_high'])}] | {fmt(r['p'])} | {r['verdict']} |")
    lines += ["", "**A 3-seed sweep** (`nas-report benchmarks/study/sort --baseline scheme=unas`): the verdict over "
              "seeds, and how many of the per-seed item-level tests alone would have said p < 0.05:", "",
              "| system | metric | difference [95% CI] over seeds | p (Holm) | verdict | seeds with item-level p < 0.05 |",
              "|---|---|---|---|---|---|"]
    items = {}
    for it in result["sweep_items"]:
        items.setdefault((it["system"], it["metric"]), []).append(it["p"] < 0.05)
    for r in sweep["comparison"]["rows"]:
        got = items.get((r["system"], r["metric"]), [])
        lines.append(f"| {r['system']} | {r['metric']} | {r['difference']:+.3g} [{fmt(r['ci_low'])}, {fmt(r['ci_high'])}] "
                     f"| {fmt(r['p_holm'])} | {r['verdict']} | {sum(got)} of {len(got)} |")
    write_markdown(ROOT / "docs" / "comparing.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
