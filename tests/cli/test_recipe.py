"""A run as one recipe: from Hydra's task function (``job.run_job``) to ``trainer.fit`` is at most four
calls, and each check runs once per job (a single run, a sweep's jobs, a resumed run), counted in the real
``nas-run`` process."""
from __future__ import annotations

import json
import os
import sys

from helpers import run_command

_SCRIPT = r"""
import json, os, sys, traceback
out = os.environ["NAS_TEST_COUNTS"]

def note(**what):
    with open(out, "a") as f:
        f.write(json.dumps(what) + "\n")

from nas_cli.pipeline import trainer
from nas_cli.pipeline.checks import config as checks
import pytorch_lightning as pl
before_config, before_trainer, before_fit = checks.check_config, trainer.check_trainer, pl.Trainer.fit

def check_config(cfg):
    note(call="check_config")
    return before_config(cfg)

def check_trainer(cfg):
    note(call="check_trainer")
    return before_trainer(cfg)

def fit(self, *a, **k):
    note(call="fit", stack=[f.name for f in traceback.extract_stack()])
    return before_fit(self, *a, **k)

checks.check_config, trainer.check_trainer, pl.Trainer.fit = check_config, check_trainer, fit
from nas_cli.commands.nas_run import main
sys.argv = ["nas-run", *sys.argv[1:]]
main()
"""


def _run(tmp_path, name: str, *args: str, new: bool = True) -> list[dict]:
    counts = tmp_path / f"{name}.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
    env.update(NAS_TEST_COUNTS=str(counts), NO_COLOR="1")
    setup = ["task=copy_lm", "debug=fast", "logger=csv"] if new else []  # a resumed run keeps its own
    proc = run_command([sys.executable, "-c", _SCRIPT, *args, *setup], cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in counts.read_text().splitlines()]


def _calls(events: list[dict], name: str) -> int:
    return sum(e["call"] == name for e in events)


def test_from_the_task_function_to_fit_is_at_most_four_calls_and_each_check_runs_once(tmp_path):
    events = _run(tmp_path, "single", "hydra.run.dir=run")
    assert (_calls(events, "check_config"), _calls(events, "check_trainer")) == (1, 1)
    (fit,) = [e for e in events if e["call"] == "fit"]
    stack = fit["stack"]
    start = len(stack) - 1 - stack[::-1].index("run_job")
    assert len(stack) - 1 - start <= 4, stack[start:]  # run_job -> ... -> Trainer.fit

    resumed = _run(tmp_path, "resume", f"resume={tmp_path / 'run'}", "trainer.max_steps=30", new=False)
    assert (_calls(resumed, "check_config"), _calls(resumed, "check_trainer")) == (1, 1)
    assert _calls(resumed, "fit") == 1


def test_a_sweep_checks_itself_once_and_each_job_once(tmp_path):
    events = _run(tmp_path, "sweep", "-m", "seed=1,2", "hydra.sweep.dir=sweep")
    assert _calls(events, "fit") == 2
    assert _calls(events, "check_config") == 1 + 2  # the sweep's own (before its directory), then each job's values
    assert _calls(events, "check_trainer") == 2
