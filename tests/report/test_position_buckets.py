"""nas-report on the loss by position (task=subword_lm's test/pos_loss_<lo>_<hi>): every bucket is compared over
seeds, and the buckets of one length are one Holm family over every bucket and group (checked against Holm's
step-down procedure written out here)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from helpers import holm_adjusted, run_command, script

BUCKETS = ("0_1", "1_2", "2_4", "4_8")


def test_the_buckets_of_a_length_are_one_holm_family(tmp_path):
    rng = np.random.default_rng(0)
    for scheme, shift in (("unas", 0.0), ("dnas", 0.05), ("hnas", 0.0)):
        for seed in (1, 2, 3):
            d = tmp_path / f"{scheme}-{seed}"
            (d / ".hydra").mkdir(parents=True)
            (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"attention": scheme, "seed": seed}))
            test = {f"test/pos_loss_{b}": float(5 - i * 0.3 + shift * (i + 1) + rng.normal(0, 0.02))
                    for i, b in enumerate(BUCKETS)}
            (d / "summary.json").write_text(json.dumps({"task": "subword_lm", "scheme": scheme, "heads": 4,
                                                        "seed": seed, "test": {**test, "test/ppl": 100.0}}))
    metrics = ",".join(f"pos_loss_{b}" for b in BUCKETS)
    out = run_command([script("nas-report"), str(tmp_path), "--baseline", "scheme=unas", "--metrics", metrics,
                       "--format", "json"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    rows = doc["comparison"]["rows"]
    assert len(rows) == 2 * len(BUCKETS)
    p = np.array([r["p"] for r in rows])
    assert [r["p_holm"] for r in rows] == pytest.approx(list(holm_adjusted(p)))
    assert "over every bucket and group at once" in doc["comparison"]["caption"]
