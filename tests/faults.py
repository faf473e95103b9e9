"""Fault injection for end-to-end tests: run the real ``nas-run`` entry point in a fresh Python
process that sends itself a real signal at a precise moment (no mocks, no races with a poller).

    run_with_fault("kill@step:25", *overrides, cwd=...)      # SIGKILL before optimizer step 26
    run_with_fault("kill@test", ...)                         # SIGKILL when the final test starts
    run_with_fault("SIGUSR1@test", ...) / ("SIGUSR2@startup", ...)
"""
from __future__ import annotations

import os
import subprocess
import sys

_SCRIPT = r"""
import os, signal, sys
spec = os.environ["NAS_TEST_FAULT"]
what, _, where = spec.partition("@")
sig = signal.SIGKILL if what == "kill" else getattr(signal, what)

def fire():
    os.kill(os.getpid(), sig)

if where.startswith("step:"):
    from nas_cli.infra import fault_tolerance
    at = int(where.split(":")[1])
    before = fault_tolerance.FaultTolerance.on_train_batch_start
    def hooked(self, trainer, *a, **k):
        if trainer.global_step >= at:
            fire()
        return before(self, trainer, *a, **k)
    fault_tolerance.FaultTolerance.on_train_batch_start = hooked
elif where == "test":
    import pytorch_lightning as pl
    before_test = pl.Trainer.test
    def test(self, *a, **k):
        fire()
        return before_test(self, *a, **k)
    pl.Trainer.test = test
elif where == "startup":
    from nas_cli.pipeline import run
    before_task = run.build_task
    def build_task(cfg, task=None):
        fire()
        return before_task(cfg, task)
    run.build_task = build_task
from nas_cli.commands.nas_run import main
sys.argv = ["nas-run", *sys.argv[1:]]
main()
"""


def run_with_fault(fault: str, *args: str, cwd, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
    env.update(NAS_TEST_FAULT=fault, NO_COLOR="1")
    from helpers import run_command  # a process forked after the heavy imports (tests/zygote.py)

    return run_command([sys.executable, "-c", _SCRIPT, *args], cwd=cwd, env=env, timeout=timeout)
