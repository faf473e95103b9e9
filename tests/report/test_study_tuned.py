"""docs/study.md's retuned Multi30k section (benchmarks/study_tuned.py) on simulated sweep directories:
each scheme's rate chosen by validation, the verdicts at the shared rate and at each scheme's own rate side
by side, a changed verdict said so, and no comparison while the retuned sweep is unfinished."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from helpers import load_benchmark

SCHEMES = ("unas", "dnas", "hnas", "coda")


@pytest.fixture(scope="module")
def mod():
    return load_benchmark("study_tuned")


def _sweep(root: Path, overrides: list[str]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"overrides": {"task": overrides}}}))


def _run(root: Path, scheme: str, lr: float, seed: int, val: float, bleu: float, ppl: float) -> None:
    d = root / f"{scheme}-{lr}-{seed}"
    (d / ".hydra").mkdir(parents=True)
    config = {"task": {"name": "multi30k"}, "attention": scheme, "optim": {"lr": lr}, "seed": seed,
              "model": {"heads": 4}}
    (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    (d / "summary.json").write_text(json.dumps({
        "task": "multi30k", "scheme": scheme, "heads": 4, "seed": seed,
        "best_val": {"metric": "val/bleu", "mode": "max", "value": val},
        "test": {"test/bleu": bleu, "test/ppl": ppl}}))


#: mean validation BLEU per (scheme, rate): DNAS prefers 4e-3, every other scheme 2e-3
VAL = {"unas": {1e-3: 27.0, 2e-3: 31.0, 4e-3: 29.0}, "dnas": {1e-3: 26.0, 2e-3: 28.0, 4e-3: 31.5},
       "hnas": {1e-3: 28.0, 2e-3: 32.0, 4e-3: 30.0}, "coda": {1e-3: 25.0, 2e-3: 30.0, 4e-3: 26.0}}
#: test BLEU per (scheme, rate): DNAS 3 points below UNAS at 2e-3, level with it at its own 4e-3
BLEU = {"unas": {1e-3: 32.0, 2e-3: 35.0, 4e-3: 33.0}, "dnas": {1e-3: 30.0, 2e-3: 32.0, 4e-3: 35.0},
        "hnas": {1e-3: 33.0, 2e-3: 35.0, 4e-3: 34.0}, "coda": {1e-3: 31.0, 2e-3: 35.0, 4e-3: 32.0}}
#: seed offsets: the same for every scheme except a small wobble, so that paired differences are tight
JITTER = {1: (0.0, 0.05), 2: (0.4, -0.05), 3: (-0.3, 0.02)}


def _study(tmp_path: Path, skip: tuple | None = None, val: dict | None = None) -> list[str]:
    val = val or VAL
    shared, tuned = tmp_path / "multi30k", tmp_path / "multi30k_tuned"
    _sweep(shared, ["seed=1,2,3", "attention=unas,dnas,hnas,coda"])
    _sweep(tuned, ["seed=1,2,3", "attention=unas,dnas,hnas,coda", "optim.lr=1e-3,4e-3"])
    for i, scheme in enumerate(SCHEMES):
        for lr in (1e-3, 2e-3, 4e-3):
            for seed, (shift, wobble) in JITTER.items():
                if (scheme, lr, seed) == skip:
                    continue
                w = wobble * (i + 1) if scheme != "unas" else 0.0
                _run(shared if lr == 2e-3 else tuned, scheme, lr, seed, val[scheme][lr] + shift,
                     BLEU[scheme][lr] + shift + w, 9.0 - 0.01 * BLEU[scheme][lr] + w)
    return [str(shared), str(tuned)]


@pytest.fixture(scope="module")
def complete(mod, tmp_path_factory) -> str:
    """The section of a finished study: every scheme at every rate and seed."""
    return mod.tuned_section(_study(tmp_path_factory.mktemp("study")))


def test_each_scheme_is_compared_at_its_own_rate_beside_the_shared_one_and_a_change_is_said(complete):
    text = complete
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines()
            if line.startswith("| ") and "val BLEU at" not in line and not line.startswith("| scheme")}
    assert rows["DNAS"].split(" | ")[4] == "4e-3"  # chosen by validation
    assert all(rows[name].split(" | ")[4] == "2e-3" for name in ("UNAS", "HNAS", "CODA"))
    dnas = next(line for line in text.splitlines() if line.startswith("| DNAS (4e-3) | BLEU |"))
    cells = [c.strip() for c in dnas.strip("|").split(" | ")]
    shared = sum(BLEU["dnas"][2e-3] + w * 2 - BLEU["unas"][2e-3] for _, w in JITTER.values()) / 3
    assert cells[4].startswith(f"{shared:+.2f} [") and cells[5] == "worse"  # at 2e-3: three points below UNAS
    assert cells[7] == "no significant difference" and cells[8] == "yes: worse -> no significant difference"
    hnas = next(line for line in text.splitlines() if line.startswith("| HNAS (2e-3) | BLEU |"))
    assert hnas.rstrip().endswith("| no |")  # the same runs on both sides: unchanged
    assert "Changed verdicts: DNAS BLEU: worse at the shared rate, no significant difference at its own" in text
    assert ("- **DNAS better than UNAS (Ding et al.)**, in BLEU: worse at the shared rate, no significant difference "
            "with each scheme at its own rate: the claim is not shown at either." in text)


def test_the_difference_at_each_ones_rate_is_the_paired_mean_of_the_chosen_runs(complete):
    """The independent arithmetic: DNAS at 4e-3 minus UNAS at 2e-3, seed by seed, in test BLEU."""
    dnas = next(line for line in complete.splitlines() if line.startswith("| DNAS (4e-3) | BLEU |"))
    diffs = [BLEU["dnas"][4e-3] + shift + wobble * 2 - (BLEU["unas"][2e-3] + shift)
             for shift, wobble in JITTER.values()]
    assert dnas.split(" | ")[6].startswith(f"{sum(diffs) / 3:+.2f} [")


def test_no_comparison_while_the_retuned_sweep_is_unfinished(mod, tmp_path):
    text = mod.tuned_section(_study(tmp_path, skip=("coda", 4e-3, 3)))
    assert "Not compared yet: `multi30k_tuned` 23 of 24 runs finished" in text
    assert "| DNAS" not in text and "Changed verdicts" not in text


def test_when_every_scheme_keeps_the_shared_rate_the_section_says_the_runs_are_the_same(mod, tmp_path):
    val = {**VAL, "dnas": {1e-3: 26.0, 2e-3: 31.5, 4e-3: 28.0}}
    text = mod.tuned_section(_study(tmp_path, val=val))
    assert "Every scheme's own rate is the shared 2e-3" in text
    assert "No verdict changes when each scheme runs at its own rate." in text
