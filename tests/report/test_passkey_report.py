"""nas-report on passkey retrieval (eval/passkey.json from nas-eval --passkey): a verdict over seeds for each
length's share and each cell of the length x depth grid, Holm-adjusted over all of them at once (checked against
Holm's step-down procedure written out here), and per seed McNemar's exact test on the probes (checked against
scipy's binomial test on the discordant probes); the metrics and items are made by the same function nas-eval
uses (nas_cli.pipeline.passkey.grid_metrics)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from helpers import holm_adjusted, run_command, script

from nas_cli.pipeline.passkey import grid_metrics

LENGTHS, DEPTHS, SAMPLES = (128, 256), (0.0, 50.0, 100.0), 40


def _write_run(d, scheme, seed, rng, rate):
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"attention": scheme, "seed": seed,
                                                              "task": {"name": "subword_lm"}}))
    (d / "summary.json").write_text(json.dumps({"task": "subword_lm", "scheme": scheme, "heads": 4, "seed": seed,
                                                "test": {"test/ppl": 100.0 + seed}}))
    hits = [[(rng.random(SAMPLES) < rate / (i + 1)).astype(int).tolist() for _ in DEPTHS] for i in range(len(LENGTHS))]
    grid = {"lengths": list(LENGTHS), "depths": list(DEPTHS), "samples": SAMPLES, "seed": 1, "retrieved": hits,
            "accuracy": [[float(np.mean(c)) for c in row] for row in hits], "probes_sha256": "same-probes"}
    metrics, declared, per_probe = grid_metrics(grid)
    (d / "eval").mkdir()
    (d / "eval" / "passkey.json").write_text(json.dumps({"split": "test", "checkpoints": ["best.ckpt"],
                                                         "metrics": metrics, "declared": declared, "passkey": grid}))
    (d / "eval" / "passkey.items.json").write_text(json.dumps({"split": "test", "refs_sha256": "same-probes",
                                                               "passkey": per_probe}))
    return per_probe


def test_passkey_verdicts_are_one_holm_family_with_mcnemar_per_seed(tmp_path):
    from scipy import stats

    rng = np.random.default_rng(0)
    probes = {}
    for scheme, rate in (("unas", 0.5), ("dnas", 0.8)):
        for seed in (1, 2, 3):
            probes[scheme, seed] = _write_run(tmp_path / f"{scheme}-{seed}", scheme, seed, rng, rate)
    out = run_command([script("nas-report"), str(tmp_path), "--baseline", "scheme=unas", "--format", "json"],
                      cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    rows = [r for r in doc["comparison"]["rows"] if r["metric"].startswith("passkey/")]
    # each length's share and each of its 3 depths, at 2 lengths: 8 numbers, compared over 3 seeds
    assert sorted(r["metric"] for r in rows) == sorted(
        [f"passkey/{n}" for n in LENGTHS] + [f"passkey/{n}/depth{int(d)}" for n in LENGTHS for d in DEPTHS])
    assert {r["baseline_group"] for r in rows} == {"unas h4 [eval:passkey]"} and all(r["seeds"] == [1, 2, 3] for r in rows)
    assert [r["p_holm"] for r in rows] == pytest.approx(list(holm_adjusted(np.array([r["p"] for r in rows]))))
    assert "passkey retrieval: over every length, depth and group at once" in doc["comparison"]["caption"]
    # a length's share is the mean over every probe of its depths, as the table shows it
    group = next(g for g in doc["runs"]["groups"] if g["scheme"] == "dnas" and g["metrics"].get("test/passkey/128"))
    want = np.mean([np.mean(probes["dnas", s]["test/passkey/128"]) for s in (1, 2, 3)])
    assert group["metrics"]["test/passkey/128"]["mean"] == pytest.approx(want)
    # the paired detail of seed 2 at 256 tokens: McNemar's exact test on the discordant probes
    detail = next(d for d in doc["test_set"]["rows"] if d["metric"] == "passkey/256" and d["seed"] == 2)
    assert detail["test"].startswith("McNemar")
    a, b = (np.array(probes[s, 2]["test/passkey/256"]) for s in ("unas", "dnas"))
    only_b, only_a = int(((b == 1) & (a == 0)).sum()), int(((b == 0) & (a == 1)).sum())
    assert detail["p"] == pytest.approx(stats.binomtest(only_b, only_a + only_b, 0.5).pvalue)
    assert detail["difference"] == pytest.approx(b.mean() - a.mean())
