"""Training on the packed token stream (task=subword_lm): what the data path costs a step, and nas-run's tokens/s
against a plain PyTorch loop over the same model and windows.

The setting is ``experiment=wikipedia_lm_cpu`` on ``../shared/data/wikipedia_en`` (its token cache built once),
one thread, ``--steps`` steps:

* ``nas_run``: the ``nas-run`` command itself (``run_test=false``, one validation batch at the last step), run
  for ``--steps`` and for a third of them; a step's cost is the difference of their training seconds
  (summary.json ``fit_seconds``: data, model, optimizer, Lightning, callbacks) over the difference of their
  steps, so that what every run pays once (start-up, the one validation, the last checkpoints) cancels;
* ``plain``: the same model (nas-run's ``build_model``, the same seed), AdamW with the preset's settings,
  the same warm-up and cosine schedule and gradient clipping, over batches of the same packed windows drawn
  straight from the memory-mapped stream with numpy: a loop with nothing else in it, its step cost measured
  over the same steps (from a third of them to the end);
* ``data``: nas-run's training DataLoader alone (the one the run uses), the same number of batches.

    python benchmarks/subword_train.py     # writes docs/bench_subword_train.json and its table in docs/benchmarks.md
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nas_cli.bench.markdown import add_output_options, run_and_write

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT.parent / "shared" / "data" / "wikipedia_en"


def _overrides(steps: int, run_dir: Path) -> list[str]:
    return ["experiment=wikipedia_lm_cpu", f"task.path={CORPUS}", f"trainer.max_steps={steps}",
            f"trainer.val_check_interval={steps}", "trainer.limit_val_batches=1", "run_test=false", "threads=1",
            "logger=csv", "progress_bar=false", "progress_lines=false", "diagnostics.plots=never",
            f"hydra.run.dir={run_dir}"]


def _nas_run(steps: int, tmp: Path) -> dict:
    run_dir = tmp / f"run{steps}"
    subprocess.run([str(Path(sys.executable).with_name("nas-run")), *_overrides(steps, run_dir)], check=True,
                   capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads((run_dir / "summary.json").read_text())


def _config(steps: int, tmp: Path):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=[o for o in _overrides(steps, tmp / "plain")[:-1]
                                            if not o.startswith("trainer.limit_val_batches")])


def _plain(cfg, task, steps: int, first: int) -> float:
    """Seconds of the plain loop's steps ``first`` .. ``steps``."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from nas_cli.model.plan import AttentionPlan
    from nas_cli.pipeline.lit import build_model

    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, AttentionPlan.for_job(cfg).model_cores(cfg.model), task).train()
    o = cfg.optim
    opt = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay)
    floor = o.min_lr / o.lr

    def factor(step: int) -> float:
        if step < o.warmup:
            return (step + 1) / o.warmup
        done = (step - o.warmup) / max(1, steps - o.warmup)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * done))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    stream, block, batch = np.asarray(task.streams["train"]), task.block, task.batch_size
    starts = np.arange(0, len(stream) - block - 1, block)
    rng = np.random.default_rng(cfg.seed)
    t0 = None
    for step in range(steps):
        if step == first:
            t0 = time.perf_counter()
        picked = rng.choice(starts, size=batch, replace=False)
        rows = torch.from_numpy(np.stack([stream[s:s + block + 1] for s in picked]).astype(np.int64))
        logits, _ = model(rows[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), rows[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.trainer.gradient_clip_val)
        opt.step()
        sched.step()
    return time.perf_counter() - t0


def _data(task, steps: int) -> float:
    """Seconds for nas-run's training DataLoader to hand over ``steps`` batches."""
    loader = iter(task.train_dataloader())
    t0 = time.perf_counter()
    for _ in range(steps):
        next(loader)
    return time.perf_counter() - t0


def measure(steps: int) -> dict:
    import torch

    from nas_cli.pipeline.parts import build_task

    torch.set_num_threads(1)
    first = steps // 3
    with tempfile.TemporaryDirectory(prefix="subword-train-bench-") as tmp:
        full, short = _nas_run(steps, Path(tmp)), _nas_run(first, Path(tmp))
        cfg = _config(steps, Path(tmp))
        task = build_task(cfg)
        task.setup()
        plain_s = _plain(cfg, task, steps, first)
        data_s = _data(task, steps - first)
    counted = steps - first
    tokens = counted * task.batch_size * task.block
    nas_s = float(full["fit_seconds"]) - float(short["fit_seconds"])
    return {"steps": steps, "first": first, "counted": counted, "tokens": tokens, "batch": task.batch_size,
            "window": task.block, "parameters": full["parameters"], "cores": len(os.sched_getaffinity(0)),
            "fit_seconds": [float(full["fit_seconds"]), float(short["fit_seconds"])],
            "nas_run_s": nas_s, "plain_s": plain_s, "data_s": data_s,
            "nas_run_tokens_per_s": tokens / nas_s, "plain_tokens_per_s": tokens / plain_s,
            "ratio": nas_s / plain_s, "data_share": data_s / nas_s}


def table(result: dict) -> str:
    return "\n".join([
        "## Training on the packed token stream (generated)", "",
        f"`{result['command']}` on {result['machine']}, {result['date']} (one thread, {result['cores']} cores): "
        f"`experiment=wikipedia_lm_cpu` ({result['parameters']:,} parameters), batches of {result['batch']} windows "
        f"of {result['window']} tokens; the cost of steps {result['first']} to {result['steps']} ({result['counted']} "
        f"steps, {result['tokens']:,} tokens): nas-run's as the difference of runs of {result['steps']} and "
        f"{result['first']} steps"
        + (f"; {result['load']}" if result.get("load") else "") + ".", "",
        "| what | seconds | tokens/s |", "|---|---:|---:|",
        f"| `nas-run` (summary.json `fit_seconds`: {result['fit_seconds'][0]:.1f} - {result['fit_seconds'][1]:.1f}) | "
        f"{result['nas_run_s']:.1f} | "
        f"{result['nas_run_tokens_per_s']:,.0f} |",
        f"| a plain PyTorch loop, the same model, optimizer, schedule and windows | {result['plain_s']:.1f} | "
        f"{result['plain_tokens_per_s']:,.0f} |",
        f"| nas-run's training DataLoader alone, the same number of batches | {result['data_s']:.2f} | - |", "",
        f"nas-run / plain loop: {result['ratio']:.3f}x the time; the data path: {100 * result['data_share']:.2f}% of "
        "nas-run's training time.", ""])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--load", default=None, help="what else ran on the machine during the measurement, said with it")
    add_output_options(p, ROOT / "docs" / "bench_subword_train.json", ROOT / "docs" / "benchmarks.md")
    args = p.parse_args()
    print(table(run_and_write(args, lambda: {**measure(args.steps), **({"load": args.load} if args.load else {})},
                              table, "python benchmarks/subword_train.py")))


if __name__ == "__main__":
    main()
