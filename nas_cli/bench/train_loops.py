"""The timed loops of ``nas-bench train`` (nas_cli/bench/train.py): nas-run's own loop (NasLitModule in a
Lightning Trainer) and the plain PyTorch reference loop, over the same synthetic batches, each
reading a clock after every optimizer step."""
from __future__ import annotations

import time

import torch

from nas_cli.bench.attention import sync_device
from nas_cli.bench.reference import ReferenceTransformer


def bench_task(vocab: int):
    """The little NasLitModule needs from a task (kind, vocabulary, special ids)."""
    from tasks.base import Task

    class BenchTask(Task):
        kind = "seq2seq"
        name = "bench"

        @property
        def src_vocab_size(self) -> int:
            return vocab

    return BenchTask()


class Batches(torch.utils.data.Dataset):
    """``length`` items cycling over a few fixed synthetic batches (no padding: every
    position is a real token, ids drawn uniformly from the non-special ids)."""

    def __init__(self, batch: int, src_len: int, tgt_len: int, vocab: int, length: int, distinct: int = 4,
                 seed: int = 0):
        from tasks.base import EOS

        g = torch.Generator().manual_seed(seed)
        self.batches = []
        for _ in range(max(1, min(distinct, length))):
            src = torch.randint(EOS + 1, vocab, (batch, src_len), generator=g)
            tgt = torch.randint(EOS + 1, vocab, (batch, tgt_len + 1), generator=g)
            self.batches.append({"src": src, "tgt_in": tgt[:, :-1].contiguous(), "tgt_out": tgt[:, 1:].contiguous()})
        self.length = length

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        return self.batches[i % len(self.batches)]


class StepClock:
    """Wall-clock stamps: one before the first step, one after every optimizer step."""

    def __init__(self, device: torch.device):
        self.device, self.stamps = device, []

    def start(self):
        sync_device(self.device)
        self.stamps.append(time.perf_counter())

    def step(self):
        sync_device(self.device)
        self.stamps.append(time.perf_counter())


def clock_callback(clock: StepClock):
    import pytorch_lightning as pl

    class Clock(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx == 0:
                clock.start()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            clock.step()

    return Clock()


def bench_configs(model_name: str):
    from omegaconf import OmegaConf

    from nas_cli.model.choices import CONF_DIR

    main = OmegaConf.load(CONF_DIR / "config.yaml")
    return (OmegaConf.load(CONF_DIR / "model" / f"{model_name}.yaml"), main.optim,
            OmegaConf.load(CONF_DIR / "trainer" / "default.yaml"), int(main.log_learned_every))


def run_nas_loop(attention_cfg, loader, total_steps: int, args, cfgs) -> tuple[list[float], int]:
    """nas-run's own loop: NasLitModule + a Lightning Trainer (no logger, progress bar or
    checkpointing), as train() configures it otherwise (clipping, log_every_n_steps)."""
    import pytorch_lightning as pl

    from nas_cli.pipeline.lit import NasLitModule

    model_cfg, optim_cfg, trainer_cfg, log_learned_every = cfgs
    pl.seed_everything(args.seed, verbose=False)
    from nas_cli.model.plan import AttentionPlan

    module = NasLitModule(model_cfg, AttentionPlan.from_config(attention_cfg).model_cores(model_cfg), optim_cfg, bench_task(args.vocab),
                          log_learned_every=log_learned_every)
    clock = StepClock(torch.device(args.device))
    trainer = pl.Trainer(accelerator="gpu" if args.device == "cuda" else "cpu", devices=1,
                         precision=args.precision, max_steps=total_steps, max_epochs=-1, logger=False,
                         enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
                         callbacks=[clock_callback(clock)], gradient_clip_val=trainer_cfg.gradient_clip_val,
                         log_every_n_steps=int(trainer_cfg.log_every_n_steps), num_sanity_val_steps=0,
                         limit_val_batches=0, deterministic=False)
    trainer.fit(module, train_dataloaders=loader)
    from nas_cli.pipeline.run import count_parameters

    return clock.stamps, count_parameters(module.model)


def run_reference_loop(loader, total_steps: int, args, cfgs) -> tuple[list[float], int]:
    """The plain PyTorch loop: same batches, Adam, inverse-sqrt schedule, label-smoothed
    cross entropy, gradient clipping and precision as nas-run's loop."""
    from contextlib import nullcontext

    from tasks.base import PAD

    from nas_cli.pipeline.optim import inverse_sqrt
    from nas_cli.pipeline.run import count_parameters

    model_cfg, o, trainer_cfg, _ = cfgs
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    model = ReferenceTransformer(args.vocab, model_cfg, PAD).to(device).train()
    opt = torch.optim.Adam(model.parameters(), lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, inverse_sqrt(o.warmup))
    clip = trainer_cfg.gradient_clip_val
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if args.precision == "bf16-mixed" else nullcontext()
    clock = StepClock(device)
    clock.start()
    for step, batch in enumerate(loader):
        if step == total_steps:
            break
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        opt.zero_grad(set_to_none=True)
        with autocast:
            logits = model(batch["src"], batch["tgt_in"])
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), batch["tgt_out"].flatten(),
                                                 ignore_index=PAD, label_smoothing=float(o.label_smoothing))
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        sched.step()
        clock.step()
    return clock.stamps, count_parameters(model)


def quiet_lightning():
    import logging
    import warnings

    for name in ("pytorch_lightning", "pytorch_lightning.utilities.rank_zero", "pytorch_lightning.accelerators.cuda",
                 "lightning", "lightning.pytorch", "lightning.pytorch.utilities.rank_zero", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # Lightning's advice about loader workers and the missing validation loop: by design here
    warnings.filterwarnings("ignore", message=".*(does not have many workers|val_dataloader|Skipping val loop|"
                                              "LeafSpec).*")
