"""``nas-bench train``: end-to-end training throughput.


Training tokens/s (batch x (src len + tgt len) per optimizer step) of
  * nas-run's own model and loop: NasLitModule in a Lightning Trainer with logger=False, no
    progress bar, no checkpointing (clipping and log_every_n_steps as conf/trainer/default),
    per attention scheme (``<name>-naive|efficient|auto`` picks attention.impl);
  * a plain PyTorch loop over torch.nn.Transformer with the same sizes, pre/post-norm,
    dropout, tied embeddings, batches (the same DataLoader), Adam, inverse-sqrt schedule,
    label-smoothed cross entropy and clipping (``reference``).
Each repeat is a fresh run of warm-up + timed steps (clock read after every optimizer
step, synchronized on CUDA); repeats go round-robin over the loops, so a change in machine
load affects them alike; tokens/s is the median over repeats. Ratios are time per token:
nas-run UNAS / reference, every other scheme / nas-run UNAS, with issue #6's targets.
"""
from __future__ import annotations

import gc
import json
import statistics
import time
import warnings
from pathlib import Path

import torch

from nas_cli.bench.markdown import num as _num, write_markdown
from nas_cli.bench.attention import _device_name, _is_oom, _sync
from nas_cli.bench.reference import ReferenceTransformer

TRAIN_MD_SECTION = "## End-to-end training (nas-bench train)"
TRAIN_DEFAULT_SCHEMES = ["unas", "dnas", "hnas"]
REFERENCE = "reference"
IMPL_SUFFIXES = ("naive", "efficient", "auto", "flex", "triton")
#: issue #6's targets, as time per token: (scheme, compared with, at most). They are stated
#: for CPU training at Transformer-base sizes with sequence lengths 64-128 (TARGET_SETTING).
TRAIN_TARGETS = {"unas": (REFERENCE, 1.05), "dnas": ("unas", 1.15), "hnas": ("unas", 1.25)}
TARGET_SETTING = {"device": "cpu", "model": "base", "lengths": (64, 128)}
TRAIN_PRECISIONS = ("32-true", "bf16-mixed")


def train_variant(device: str, precision: str) -> str:
    """'' for the CPU float32 setting of the targets, else e.g. 'cpu, bf16-mixed': other settings
    get their own section of the markdown and their own JSON, so they never replace it."""
    return "" if (device, precision) == ("cpu", "32-true") else f"{device}, {precision}"


def train_md_section(device: str, precision: str) -> str:
    variant = train_variant(device, precision)
    return TRAIN_MD_SECTION if not variant else TRAIN_MD_SECTION[:-1] + f", {variant})"


def train_schemes() -> list[str]:
    """Registry names, plus ``<name>-naive|efficient|auto`` for the schemes with ``impl``."""

    from nas_cli.choices import available, scheme_config

    names = available("attention")
    extra = [f"{n}-{suffix}" for n in names if "impl" in scheme_config(n)
             for suffix in IMPL_SUFFIXES]
    return names + extra


def _split_scheme(scheme: str) -> tuple[str, str | None]:
    name, _, suffix = scheme.rpartition("-")
    return (name, suffix) if name and suffix in IMPL_SUFFIXES else (scheme, None)


#: ``<scheme>@<location>[+<location>...]``: that scheme at those locations, UNAS at the others
#: (e.g. ``dnas@encoder``: DNAS in the encoder only, as Ding et al. ran it)
LOCATION_SEP = "@"


def _attention_cfg(scheme: str):
    from nas_cli.choices import scheme_config

    spec, _, where = scheme.partition(LOCATION_SEP)
    name, impl = _split_scheme(spec)
    cfg = scheme_config(name)
    if impl is not None:
        cfg.impl = impl
    if not where:
        return cfg
    plan = scheme_config("unas")
    for loc in where.split("+"):
        plan[loc] = cfg
    return plan


def check_scheme(scheme: str, valid: list[str]) -> str | None:
    """Why ``scheme`` is not a valid ``--schemes`` entry (None: it is)."""
    from nas_cli.plan import LOCATIONS

    spec, sep, where = scheme.partition(LOCATION_SEP)
    if spec not in valid:
        return f"unknown scheme {spec!r}"
    bad = [loc for loc in where.split("+") if loc not in LOCATIONS] if sep else []
    if bad:
        return f"{scheme!r}: unknown location {bad[0]!r} (use {', '.join(LOCATIONS)}, joined by '+')"
    return None


def _bench_task(vocab: int):
    """The little NasLitModule needs from a task (kind, vocabulary, special ids)."""
    from tasks.base import Task

    class BenchTask(Task):
        kind = "seq2seq"
        name = "bench"

        @property
        def src_vocab_size(self) -> int:
            return vocab

    return BenchTask()


class _Batches(torch.utils.data.Dataset):
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


class _StepClock:
    """Wall-clock stamps: one before the first step, one after every optimizer step."""

    def __init__(self, device: torch.device):
        self.device, self.stamps = device, []

    def start(self):
        _sync(self.device)
        self.stamps.append(time.perf_counter())

    def step(self):
        _sync(self.device)
        self.stamps.append(time.perf_counter())


def _clock_callback(clock: _StepClock):
    import pytorch_lightning as pl

    class Clock(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx == 0:
                clock.start()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            clock.step()

    return Clock()


def _bench_configs(model_name: str):
    from omegaconf import OmegaConf

    from nas_cli.choices import CONF_DIR

    main = OmegaConf.load(CONF_DIR / "config.yaml")
    return (OmegaConf.load(CONF_DIR / "model" / f"{model_name}.yaml"), main.optim,
            OmegaConf.load(CONF_DIR / "trainer" / "default.yaml"), int(main.log_learned_every))


def run_nas_loop(scheme: str, loader, total_steps: int, args, cfgs) -> tuple[list[float], int]:
    """nas-run's own loop: NasLitModule + a Lightning Trainer (no logger, progress bar or
    checkpointing), as train() configures it otherwise (clipping, log_every_n_steps)."""
    import pytorch_lightning as pl

    from nas_cli.lit import NasLitModule

    model_cfg, optim_cfg, trainer_cfg, log_learned_every = cfgs
    pl.seed_everything(args.seed, verbose=False)
    from nas_cli.plan import AttentionPlan

    module = NasLitModule(model_cfg, AttentionPlan.from_config(_attention_cfg(scheme)), optim_cfg, _bench_task(args.vocab),
                          log_learned_every=log_learned_every)
    clock = _StepClock(torch.device(args.device))
    trainer = pl.Trainer(accelerator="gpu" if args.device == "cuda" else "cpu", devices=1,
                         precision=args.precision, max_steps=total_steps, max_epochs=-1, logger=False,
                         enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
                         callbacks=[_clock_callback(clock)], gradient_clip_val=trainer_cfg.gradient_clip_val,
                         log_every_n_steps=int(trainer_cfg.log_every_n_steps), num_sanity_val_steps=0,
                         limit_val_batches=0, deterministic=False)
    trainer.fit(module, train_dataloaders=loader)
    from nas_cli.run import count_parameters

    return clock.stamps, count_parameters(module.model)


def run_reference_loop(loader, total_steps: int, args, cfgs) -> tuple[list[float], int]:
    """The plain PyTorch loop: same batches, Adam, inverse-sqrt schedule, label-smoothed
    cross entropy, gradient clipping and precision as nas-run's loop."""
    from contextlib import nullcontext

    from tasks.base import PAD

    from nas_cli.lit import inverse_sqrt
    from nas_cli.run import count_parameters

    model_cfg, o, trainer_cfg, _ = cfgs
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    model = ReferenceTransformer(args.vocab, model_cfg, PAD).to(device).train()
    opt = torch.optim.Adam(model.parameters(), lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, inverse_sqrt(o.warmup))
    clip = trainer_cfg.gradient_clip_val
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if args.precision == "bf16-mixed" else nullcontext()
    clock = _StepClock(device)
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


def _quiet_lightning():
    import logging
    import warnings

    for name in ("pytorch_lightning", "pytorch_lightning.utilities.rank_zero", "pytorch_lightning.accelerators.cuda",
                 "lightning", "lightning.pytorch", "lightning.pytorch.utilities.rank_zero", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # Lightning's advice about loader workers and the missing validation loop: by design here
    warnings.filterwarnings("ignore", message=".*(does not have many workers|val_dataloader|Skipping val loop|"
                                              "LeafSpec).*")


def add_train_ratios(results: list[dict], model_name: str, device: str) -> None:
    """time per token relative to the loop each row is compared with, and the targets."""
    lo, hi = TARGET_SETTING["lengths"]
    by = {(r["src_len"], r["tgt_len"], r["loop"]): r for r in results}
    for r in results:
        r.update(time_ratio=None, ratio_to=None, target=None, target_applies=False, met=None)
        if r["loop"] == REFERENCE:
            continue
        name, _ = _split_scheme(r["loop"])
        vs = REFERENCE if r["loop"] == "unas" else "unas"
        r["ratio_to"] = vs
        base = by.get((r["src_len"], r["tgt_len"], vs))
        if r["status"] == "ok" and base and base["status"] == "ok":
            r["time_ratio"] = base["tokens_per_s"] / r["tokens_per_s"]
        if name in TRAIN_TARGETS and TRAIN_TARGETS[name][0] == vs:
            r["target"] = TRAIN_TARGETS[name][1]
            r["target_applies"] = (device == TARGET_SETTING["device"] and model_name == TARGET_SETTING["model"]
                                   and lo <= r["src_len"] <= hi and lo <= r["tgt_len"] <= hi)
            if r["target_applies"] and r["time_ratio"] is not None:
                r["met"] = r["time_ratio"] <= r["target"]


def _loop_label(loop: str) -> str:
    return "reference (torch.nn.Transformer)" if loop == REFERENCE else f"nas-run {loop}"


def train_markdown_section(config: dict, results: list[dict]) -> str:
    lo, hi = TARGET_SETTING["lengths"]
    targets = ", ".join(f"{n} <= {t:.2f} x {'reference' if vs == REFERENCE else vs}"
                        for n, (vs, t) in TRAIN_TARGETS.items())
    lines = [
        train_md_section(config["device"].split(":")[0], config["precision"]),
        "",
        f"Training throughput of whole steps (forward, loss, backward, clipping, Adam, schedule, and the "
        f"loop around them), model `{config['model']}` (d_model {config['d_model']}, {config['heads']} heads, "
        f"{config['encoder_layers']}+{config['decoder_layers']} layers, FFN {config['ffn']}, "
        f"{'pre' if config['norm_first'] else 'post'}-norm, dropout {config['dropout']}), vocabulary "
        f"{config['vocab']}, batch {config['batch']}, {config['precision']} on {config['device_name']} "
        f"(torch {config['torch']}, Lightning {config['lightning']}). Parameters: reference "
        f"{_num(config['parameters'].get(REFERENCE), ',')}, nas-run unas {_num(config['parameters'].get('unas'), ',')}. "
        f"tokens/s = batch x (src len + tgt len) per step, median of {config['repeats']} repeats of "
        f"{config['steps']} timed steps after {config['warmup_steps']} warm-up steps; each repeat is a fresh run, "
        f"and repeats go round-robin over the loops so that changes in machine load hit all of them. "
        f"nas-run = NasLitModule in a Lightning Trainer (no logger, progress bar or checkpoints); reference = "
        f"a plain PyTorch loop over `torch.nn.Transformer` with the same sizes, batches (same DataLoader), "
        f"Adam, schedule, label-smoothed cross entropy and clipping. time ratio = time per token / that of the "
        f"`vs` loop. Targets (issue #6; {TARGET_SETTING['device'].upper()}, model `{TARGET_SETTING['model']}`, "
        f"lengths {lo}-{hi}): {targets}; `n/a` where this run is not that setting. "
        f"Command: `{config['command']}`",
        "",
        "| src len | tgt len | loop | status | tokens/s | ms / step | time ratio | vs | target | met |",
        "|---:|---:|---|---|---:|---:|---:|---|---:|---|",
    ]
    for r in results:
        target = "-" if r["target"] is None else f"<= {r['target']:.2f}"
        met = "-" if r["target"] is None else ("n/a" if not r["target_applies"] else
                                               "-" if r["met"] is None else ("yes" if r["met"] else "no"))
        vs = "-" if r["ratio_to"] is None else _loop_label(r["ratio_to"])
        lines.append(f"| {r['src_len']} | {r['tgt_len']} | {_loop_label(r['loop'])} | {r['status']} | "
                     f"{_num(r['tokens_per_s'], ',.0f')} | {_num(r['ms_per_step'], '.1f')} | "
                     f"{_num(r['time_ratio'], '.3f')} | {vs} | {target} | {met} |")
    return "\n".join(lines) + "\n"


def train_main(args, parser, argv: list[str]) -> int:
    from nas_cli.choices import available

    valid = train_schemes()
    bad = [why for why in (check_scheme(s, valid) for s in args.schemes) if why]
    if bad:
        parser.error(f"argument --schemes: {'; '.join(bad)}; valid: {', '.join(valid)}, each optionally "
                     "followed by @<location>[+<location>] (e.g. dnas@encoder: UNAS elsewhere)")
    if args.model not in available("model"):
        parser.error(f"argument --model: unknown model {args.model!r}; valid: {', '.join(available('model'))}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("argument --device: CUDA is not available on this machine")
    if args.precision == "bf16-mixed" and args.device == "cuda" and not torch.cuda.is_bf16_supported():
        parser.error("argument --precision: this GPU does not support bf16")
    tgt_lens = args.tgt_len or args.src_len
    if len(tgt_lens) == 1:
        tgt_lens = tgt_lens * len(args.src_len)
    if len(tgt_lens) != len(args.src_len):
        parser.error("argument --tgt-len: give one length, or as many as --src-len (they are paired)")
    if args.warmup_steps < 0:
        parser.error("argument --warmup-steps: must be >= 0")
    cfgs = _bench_configs(args.model)
    model_cfg = cfgs[0]
    too_long = [n for n in args.src_len + tgt_lens if n > int(model_cfg.max_len)]
    if too_long:
        parser.error(f"length {max(too_long)} exceeds model {args.model}'s max_len={model_cfg.max_len}")
    if args.vocab < 4:
        parser.error("argument --vocab: must be >= 4 (three special ids plus tokens)")
    if args.threads:
        torch.set_num_threads(args.threads)
    with warnings.catch_warnings():
        _quiet_lightning()
        results, config = _train_runs(args, cfgs, tgt_lens)
    config["command"] = "nas-bench " + " ".join(argv)
    if args.out_json is None:
        variant = train_variant(args.device, args.precision).replace(", ", "_")
        args.out_json = Path(f"docs/bench_train{'_' + variant if variant else ''}.json")
    args.out_json.parent.mkdir(parents=True, exist_ok=True)
    args.out_json.write_text(json.dumps({"config": config, "results": results}, indent=2) + "\n")
    write_markdown(args.out_md, train_markdown_section(config, results))
    print(f"wrote {args.out_json} and {args.out_md}")
    return 0


def _train_runs(args, cfgs, tgt_lens) -> tuple[list[dict], dict]:
    import pytorch_lightning as pl

    model_cfg = cfgs[0]
    device = torch.device(args.device)
    loops = [REFERENCE] + list(dict.fromkeys(["unas"] + args.schemes))  # the baselines run first
    total = args.warmup_steps + args.steps
    results: list[dict] = []
    params: dict[str, int] = {}  # per loop (HNAS has its u parameters on top)
    for src_len, tgt_len in zip(args.src_len, tgt_lens):
        tokens = args.batch * (src_len + tgt_len)
        loader = torch.utils.data.DataLoader(
            _Batches(args.batch, src_len, tgt_len, args.vocab, total, seed=args.seed), batch_size=None,
            shuffle=False, num_workers=0, pin_memory=device.type == "cuda")
        times: dict[str, list[float]] = {loop: [] for loop in loops}
        status: dict[str, str] = {loop: "ok" for loop in loops}
        for rep in range(args.repeats):
            for loop in loops:
                if status[loop] != "ok":
                    continue
                if device.type == "cuda":
                    gc.collect()
                    torch.cuda.empty_cache()
                try:
                    if loop == REFERENCE:
                        stamps, n_params = run_reference_loop(loader, total, args, cfgs)
                    else:
                        stamps, n_params = run_nas_loop(loop, loader, total, args, cfgs)
                    if len(stamps) != total + 1:
                        raise RuntimeError(f"ran {len(stamps) - 1} steps, expected {total}")
                    times[loop].append(stamps[-1] - stamps[args.warmup_steps])
                    params[loop] = n_params
                except Exception as err:  # noqa: BLE001 - a failing loop is recorded, the others go on
                    status[loop] = "oom" if _is_oom(err) else \
                        f"error: {type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}"
                per = times[loop][-1] if times[loop] and status[loop] == "ok" else None
                print(f"S={src_len:<5} T={tgt_len:<5} repeat {rep + 1}/{args.repeats} {loop:<16} {status[loop]:<8} "
                      f"{_num(None if per is None else tokens * args.steps / per, '12,.0f')} tokens/s", flush=True)
        for loop in loops:
            ok = status[loop] == "ok" and times[loop]
            med = statistics.median(times[loop]) if ok else None
            results.append({
                "src_len": src_len, "tgt_len": tgt_len, "batch": args.batch, "loop": loop, "status": status[loop],
                "tokens_per_s": tokens * args.steps / med if ok else None,
                "ms_per_step": 1e3 * med / args.steps if ok else None,
                "repeat_tokens_per_s": [tokens * args.steps / t for t in times[loop]] if ok else [],
                "steps_per_repeat": total, "parameters": params.get(loop),
            })
    add_train_ratios(results, args.model, device.type)
    config = {
        "model": args.model, **{k: model_cfg[k] for k in ("d_model", "heads", "encoder_layers", "decoder_layers",
                                                           "ffn", "dropout", "norm_first")},
        "vocab": args.vocab, "batch": args.batch, "steps": args.steps, "warmup_steps": args.warmup_steps,
        "repeats": args.repeats, "precision": args.precision, "device": str(device),
        "device_name": _device_name(device), "threads": torch.get_num_threads() if device.type == "cpu" else None,
        "torch": torch.__version__, "lightning": pl.__version__, "seed": args.seed, "parameters": params,
        "targets": {n: {"vs": vs, "max_time_ratio": t} for n, (vs, t) in TRAIN_TARGETS.items()},
        "target_setting": TARGET_SETTING,
    }
    return results, config


