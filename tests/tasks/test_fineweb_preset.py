"""experiment=fineweb_edu_cpu: FineWeb-Edu's sample files (Parquet with the dataset's columns) train a subword
language model from a local folder; an hf:// path that cannot be read is one line, exit 2, nothing made."""
from __future__ import annotations

import json
import os
import subprocess

import numpy as np
from helpers import NAS_RUN, nas_run

WORDS = "the model reads a long text about rivers cities and music in many places over years".split()


def test_the_preset_trains_on_sample_files_of_fineweb_edus_form(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    folder = tmp_path / "fineweb_edu"
    folder.mkdir()
    for i in range(2):
        texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(40, 90)))) + "." for _ in range(120)]
        pq.write_table(pa.table({"text": texts, "id": [f"<urn:{i}:{j}>" for j in range(120)],
                                 "url": ["https://example.org"] * 120, "score": rng.uniform(3, 5, 120),
                                 "int_score": [3] * 120}), folder / f"00{i}_00000.parquet")
    run = tmp_path / "run"
    proc = nas_run("experiment=fineweb_edu_cpu", f"task.path={folder}", "task.vocab_size=300",
                   f"task.cache_dir={tmp_path / 'cache'}", "debug=fast", f"hydra.run.dir={run}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["task"] == "subword_lm" and summary["test"]["test/bpb"] > 0
    meta = next((tmp_path / "cache" / "subword").glob("*/meta.json"))
    splits = json.loads(meta.read_text())["splits"]
    assert sum(s["documents"] for s in splits.values()) == 240  # every row's text a document


def test_an_unreadable_hub_path_is_one_line(tmp_path):
    # the hub offline, as on a machine without network (there the hub library's retries take some 20 s more);
    # the installed script in a process of its own: the hub library reads HF_HUB_OFFLINE when it is imported
    proc = subprocess.run([NAS_RUN, "experiment=fineweb_edu_cpu",
                           "task.path=hf://datasets/nas-run-tests/no-such-dataset/a.parquet", "debug=fast",
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, timeout=120, capture_output=True,
                          text=True, env={**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"})
    assert proc.returncode == 2, proc.stderr
    assert "cannot read it from the Hugging Face hub" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "run" / "checkpoints").exists()
