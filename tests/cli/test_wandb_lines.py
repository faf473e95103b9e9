"""Where a run's W&B files are, said by the run: the sync command at its end, and a WANDB_DIR it does
not use named in one line."""
from __future__ import annotations

import glob
import os

from helpers import NAS_RUN, run_command


def test_the_run_says_where_its_wandb_files_are_and_that_wandb_dir_is_not_used(tmp_path):
    run = tmp_path / "run"
    env = {**{k: v for k, v in os.environ.items() if k != "WANDB_MODE"}, "WANDB_DIR": "/proc/nope", "NO_COLOR": "1",
           "COLUMNS": "400"}
    proc = run_command([NAS_RUN, "debug=fast", "logger=wandb", "diagnostics.plots=never", f"hydra.run.dir={run}"],
                       cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (f"nas-run: note: WANDB_DIR=/proc/nope is not used: a run's W&B files go in {run / 'wandb'}"
            in proc.stderr)
    sync = [line for line in proc.stderr.splitlines() if "upload it with: wandb sync" in line]
    assert len(sync) == 1, proc.stderr[-2000:]
    pattern = sync[0].split("wandb sync ", 1)[1].strip()
    assert glob.glob(pattern) and all(os.path.isdir(p) for p in glob.glob(pattern))  # the command as printed
