"""In-process runs: the decoder-only LM path with the CSV logger, atomic checkpoints."""
import csv
import json

import pytest
import torch

from nas_cli.infra.checkpoints import AtomicCheckpointIO
from nas_cli.infra.loggers import public_config
from nas_cli.pipeline.run import train
from nas_cli.model.plan import AttentionPlan
from helpers import compose_cfg




def test_lm_task_trains_with_csv_logger(tmp_path):
    cfg = compose_cfg("task=copy_lm", "attention=dnas", "logger=csv", "debug=fast", "trainer.max_steps=40",
                      "optim.lr=3e-3")
    summary = train(cfg, AttentionPlan.for_job(cfg), tmp_path, group="t")
    rows = list(csv.DictReader(open(tmp_path / "csv" / "metrics.csv")))
    losses = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    assert len(losses) >= 4 and losses[-1] < losses[0]  # it learns
    assert summary["test"]["test/ppl"] == pytest.approx(float(torch.exp(torch.tensor(summary["test"]["test/loss"]))), rel=1e-4)
    assert summary["test"]["test/ppl"] < 19  # below uniform over the 19-token vocabulary
    assert json.loads((tmp_path / "summary.json").read_text())["scheme"] == "dnas"


def test_public_config_drops_secrets():
    cfg = compose_cfg("+logger.api_key=abc123", "+logger.nested.token=xyz")
    text = json.dumps(public_config(cfg, AttentionPlan.for_job(cfg), "abc"))
    assert "abc123" not in text and "xyz" not in text and "nas-run" in text


def test_hydra_files_keep_their_help_text_and_exclude_keys_while_secrets_go():
    """A saved hydra.yaml / multirun.yaml: Hydra's help template shows ``key=value`` as an example and
    override_dirname's ``exclude_keys`` lists key names; neither is a secret. A user's override is."""
    from nas_cli.infra.redaction import redact

    saved = {"hydra": {"help": {"template": "nas-run [key=value ...]"},
                       "hydra_help": {"template": "Hydra: key=value"},
                       "job": {"config": {"override_dirname": {"exclude_keys": ["seed"]}}},
                       "overrides": {"task": ["+logger.api_key=abc123", "seed=1"]}},
             "logger": {"api_key": "abc123", "keys": ["a"]}}
    clean = redact(saved)
    assert clean["hydra"]["help"]["template"] == "nas-run [key=value ...]"
    assert clean["hydra"]["hydra_help"]["template"] == "Hydra: key=value"
    assert clean["hydra"]["job"]["config"]["override_dirname"]["exclude_keys"] == ["seed"]
    assert clean["hydra"]["overrides"]["task"] == ["+logger.api_key=***", "seed=1"]
    assert clean["logger"] == {}  # a user's secret keys, dropped as before
    assert redact({"logger": {"exclude_keys": "x"}}) == {"logger": {}}  # kept only where Hydra puts it


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("disk full (simulated by an object that cannot be saved)")


def test_checkpoint_write_is_atomic(tmp_path):
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"step": 1, "w": torch.ones(3)}, path)
    with pytest.raises(RuntimeError, match="disk full"):
        io.save_checkpoint({"step": 2, "w": torch.zeros(3), "bad": Unpicklable()}, path)
    # the earlier complete checkpoint is untouched and still loads safely
    ckpt = torch.load(path, weights_only=True)
    assert ckpt["step"] == 1 and torch.equal(ckpt["w"], torch.ones(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # no half-written leftovers
