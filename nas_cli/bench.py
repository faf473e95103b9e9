"""``nas-bench``: benchmarks. ``nas-bench attention`` times the attention cores;
``nas-bench train`` measures end-to-end training throughput (see :func:`train_main` and
the section "nas-bench train" below).

For every scheme x sequence length x causal setting it runs forward + backward of the
attention core alone (q, k, v of shape (B, H, S, d_head), all requiring grad, a fixed
upstream gradient) and records

* **time**: median wall-clock of ``--repeats`` runs after ``--warmup`` runs
  (``torch.cuda.synchronize`` around each run on CUDA);
* **peak memory**: the most bytes held at any moment during one forward + backward,
  *beyond* what was allocated before it started (q, k, v and the upstream gradient are
  inputs and not counted; outputs, saved activations, gradients and temporaries are).
  On CUDA: ``torch.cuda.max_memory_allocated`` minus ``memory_allocated`` at the start.
  On CPU: the allocation and free records of ``torch.profiler`` (``profile_memory=True``),
  replayed in time order; these cover every tensor of the PyTorch CPU allocator,
  including temporaries inside fused kernels, but not memory that libraries allocate
  outside it. (Process RSS was not used: the allocator keeps freed pages and the
  interpreter's own footprint would hide the differences.)
* both as ratios to ``unas`` (fused ``scaled_dot_product_attention``) measured in the
  same run with the same sizes; ``unas`` is always run as the baseline.

Schemes are the names in ``conf/attention/`` (efficient path for those that have one)
and ``<name>-naive`` for the materialized reference formula. A case that runs out of
memory, takes longer than ``--max-seconds`` for one forward + backward, or fails is
recorded as such (and the same scheme is not tried at larger lengths), not a crash.
``--isolate`` runs each case in a fresh subprocess, so that even a host out-of-memory
kill is recorded; recommended for large lengths.

Writes JSON (``--out-json``) and a markdown table into the section
"## Attention kernels (nas-bench attention)" of ``--out-md``; other sections of that
file are kept.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import platform
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

MD_SECTION = "## Attention kernels (nas-bench attention)"
DEFAULT_SCHEMES = ["unas", "unas-naive", "dnas", "dnas-naive", "hnas", "sinkhorn"]
BASELINE = "unas"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# --------------------------------------------------------------------------- cases


def valid_schemes() -> list[str]:
    """Registry names, plus ``<name>-naive`` where a naive reference path exists (the
    schemes with an ``impl`` option, and UNAS's eager formula)."""
    from omegaconf import OmegaConf

    from .registry import CONF_DIR, available

    names = available("attention")
    naive = [f"{n}-naive" for n in names
             if n == BASELINE or "impl" in OmegaConf.load(CONF_DIR / "attention" / f"{n}.yaml")]
    return names + naive


def build_core(scheme: str, heads: int, causal: bool, d_head: int):
    """Core for ``scheme`` (``name`` or ``name-naive``) and a forward callable."""
    from omegaconf import OmegaConf

    from .attention.base import AttentionCore
    from .registry import CONF_DIR, make_core_factory

    name, naive = (scheme[: -len("-naive")], True) if scheme.endswith("-naive") else (scheme, False)
    cfg = OmegaConf.load(CONF_DIR / "attention" / f"{name}.yaml")
    if "impl" in cfg:  # the plain name times the efficient path, whatever the config default (auto)
        cfg.impl = "naive" if naive else "efficient"
    # non-causal: encoder self-attention (full column sums); causal: decoder self-attention
    core = make_core_factory(cfg, heads)("decoder" if causal else "encoder", 0, causal)
    if hasattr(core, "set_width"):  # width-dependent parameters, as MultiHeadAttention sets them
        core.set_width(heads * d_head)
    core.eval()  # no dropout: the benchmark measures the kernels
    if naive and "impl" not in cfg:  # e.g. UNAS: the eager formula of the base class
        return core, lambda q, k, v: AttentionCore.forward(core, q, k, v).out
    return core, lambda q, k, v: core(q, k, v).out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _is_oom(err: BaseException) -> bool:
    if isinstance(err, getattr(torch, "OutOfMemoryError", ())):
        return True
    msg = str(err).lower()
    return isinstance(err, (RuntimeError, MemoryError)) and (
        "out of memory" in msg or "can't allocate" in msg or "not enough memory" in msg
        or isinstance(err, MemoryError)
    )


def _cpu_peak_bytes(fn) -> int:
    """Peak of live bytes allocated by ``fn`` (PyTorch CPU allocator), from the profiler's
    allocation records (+size on allocation, -size on free) in time order."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    records: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        ev = stack.pop()
        extra = ev.extra_fields
        if type(extra).__name__ == "_ExtraFields_Allocation" and extra.device.type == "cpu":
            records.append((ev.start_time_ns, extra.alloc_size))
        stack.extend(ev.children)
    records.sort()
    live = peak = 0
    for _, size in records:
        live += size
        peak = max(peak, live)
    return peak


def run_case(scheme: str, length: int, causal: bool, args) -> dict[str, Any]:
    """One forward + backward benchmark; never raises for OOM / slowness."""
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    rec: dict[str, Any] = {"scheme": scheme, "length": length, "causal": causal, "status": "ok",
                           "time_ms": None, "peak_bytes": None}
    tensors: list = []
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    if device.type == "cuda":  # start every case from an empty cache (the last one may have hit OOM)
        gc.collect()
        torch.cuda.empty_cache()
    try:
        torch.manual_seed(0)
        core, fwd = build_core(scheme, args.heads, causal, args.d_head)
        core.to(device)
        shape = (args.batch, args.heads, length, args.d_head)
        q, k, v = (torch.randn(shape, device=device, dtype=dtype).requires_grad_() for _ in range(3))
        grad_out = torch.randn(shape, device=device, dtype=dtype)
        tensors = [q, k, v, grad_out]

        def step():
            for t in (q, k, v):
                t.grad = None
            out = fwd(q, k, v)
            out.backward(grad_out)
            for t in (q, k, v):  # gradients are outputs of the step; drop them afterwards
                t.grad = None

        # warm-up; the first run doubles as the --max-seconds guard
        for w in range(max(1, args.warmup)):
            _sync(device)
            t0 = time.perf_counter()
            step()
            _sync(device)
            first = time.perf_counter() - t0
            if w == 0 and first > args.max_seconds:
                rec.update(status="too_slow", time_ms=1e3 * first)
                return rec
        # peak memory of one run
        if device.type == "cuda":
            _sync(device)
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
            step()
            _sync(device)
            rec["peak_bytes"] = int(torch.cuda.max_memory_allocated(device) - base)
        else:
            rec["peak_bytes"] = int(_cpu_peak_bytes(step))
        times = []
        for _ in range(args.repeats):
            _sync(device)
            t0 = time.perf_counter()
            step()
            _sync(device)
            times.append(time.perf_counter() - t0)
        rec["time_ms"] = 1e3 * statistics.median(times)
    except Exception as err:  # noqa: BLE001 - every failure becomes a recorded status
        rec["status"] = "oom" if _is_oom(err) else f"error: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
    finally:
        tensors.clear()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rec


def run_case_isolated(scheme: str, length: int, causal: bool, args) -> dict[str, Any]:
    """run_case in a fresh interpreter; a killed process (host OOM) or a hang is recorded."""
    payload = json.dumps({"scheme": scheme, "length": length, "causal": causal,
                          "args": {k: getattr(args, k) for k in _CASE_ARGS}})
    limit = 120 + args.max_seconds * (2 + args.warmup + args.repeats)
    base = {"scheme": scheme, "length": length, "causal": causal, "time_ms": None, "peak_bytes": None}
    try:
        proc = subprocess.run([sys.executable, "-m", "nas_cli.bench", "_case", payload], capture_output=True,
                              text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return {**base, "status": "too_slow"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    if proc.returncode in (-9, 137):
        return {**base, "status": "oom"}  # killed by the kernel's out-of-memory killer
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
    return {**base, "status": f"error: exit {proc.returncode}: {tail}"}


_CASE_ARGS = ("heads", "d_head", "batch", "dtype", "device", "repeats", "warmup", "max_seconds", "threads")


# --------------------------------------------------------------------------- output


def add_ratios(results: list[dict]) -> None:
    base = {(r["length"], r["causal"]): r for r in results if r["scheme"] == BASELINE and r["status"] == "ok"}
    for r in results:
        b = base.get((r["length"], r["causal"]))
        ok = r["status"] == "ok" and b is not None
        r["time_ratio"] = r["time_ms"] / b["time_ms"] if ok and b["time_ms"] else None
        r["mem_ratio"] = r["peak_bytes"] / b["peak_bytes"] if ok and b["peak_bytes"] else None


def _num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def markdown_section(config: dict, results: list[dict]) -> str:
    lines = [
        MD_SECTION,
        "",
        f"Forward + backward of one attention core; B={config['batch']}, H={config['heads']}, "
        f"d_head={config['d_head']}, {config['dtype']} on {config['device_name']} "
        f"(torch {config['torch']}); time = median of {config['repeats']} runs after {config['warmup']} warm-up; "
        f"peak = most bytes held during one run beyond the inputs ({config['memory_method']}). "
        f"Ratios are to `{BASELINE}` (fused SDPA) at the same length and causal setting. "
        f"Command: `{config['command']}`",
        "",
        "| causal | S | scheme | status | fwd+bwd ms | peak MiB | time / UNAS | memory / UNAS |",
        "|---|---:|---|---|---:|---:|---:|---:|",
    ]
    for r in results:
        peak = None if r["peak_bytes"] is None else r["peak_bytes"] / 2**20
        lines.append(
            f"| {'yes' if r['causal'] else 'no'} | {r['length']} | {r['scheme']} | {r['status']} | "
            f"{_num(r['time_ms'], '.2f')} | {_num(peak, '.1f')} | {_num(r.get('time_ratio'), '.2f')} | "
            f"{_num(r.get('mem_ratio'), '.2f')} |"
        )
    return "\n".join(lines) + "\n"


def write_markdown(path: Path, section: str) -> None:
    """Replace (or append) our section (its heading is the section's first line);
    everything else in the file stays as it was."""
    heading = section.splitlines()[0]
    text = path.read_text() if path.is_file() else "# Benchmarks\n"
    start = text.find(heading + "\n")
    if start < 0 and text.endswith(heading):
        start = len(text) - len(heading)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        nxt = text.find("\n## ", start + len(heading))
        rest = "" if nxt < 0 else text[nxt + 1:]
        text = text[:start] + section + ("\n" + rest if rest else "")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# --------------------------------------------------------------------------- nas-bench train
#
# Training tokens/s (batch x (src len + tgt len) per optimizer step) of
#   * nas-run's own model and loop: NasLitModule in a Lightning Trainer with logger=False, no
#     progress bar, no checkpointing (clipping and log_every_n_steps as conf/trainer/default),
#     per attention scheme (``<name>-naive|efficient|auto`` picks attention.impl);
#   * a plain PyTorch loop over torch.nn.Transformer with the same sizes, pre/post-norm,
#     dropout, tied embeddings, batches (the same DataLoader), Adam, inverse-sqrt schedule,
#     label-smoothed cross entropy and clipping (``reference``).
# Each repeat is a fresh run of warm-up + timed steps (clock read after every optimizer
# step, synchronized on CUDA); repeats go round-robin over the loops, so a change in machine
# load affects them alike; tokens/s is the median over repeats. Ratios are time per token:
# nas-run UNAS / reference, every other scheme / nas-run UNAS, with issue #6's targets.

TRAIN_MD_SECTION = "## End-to-end training (nas-bench train)"
TRAIN_DEFAULT_SCHEMES = ["unas", "dnas", "hnas"]
REFERENCE = "reference"
IMPL_SUFFIXES = ("naive", "efficient", "auto")
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
    from omegaconf import OmegaConf

    from .registry import CONF_DIR, available

    names = available("attention")
    extra = [f"{n}-{suffix}" for n in names if "impl" in OmegaConf.load(CONF_DIR / "attention" / f"{n}.yaml")
             for suffix in IMPL_SUFFIXES]
    return names + extra


def _split_scheme(scheme: str) -> tuple[str, str | None]:
    name, _, suffix = scheme.rpartition("-")
    return (name, suffix) if name and suffix in IMPL_SUFFIXES else (scheme, None)


def _attention_cfg(scheme: str):
    from omegaconf import OmegaConf

    from .registry import CONF_DIR

    name, impl = _split_scheme(scheme)
    cfg = OmegaConf.load(CONF_DIR / "attention" / f"{name}.yaml")
    if impl is not None:
        cfg.impl = impl
    return cfg


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


class ReferenceTransformer(torch.nn.Module):
    """The plain-PyTorch reference: ``torch.nn.Transformer`` with nas-run's sizes and
    layout (token embeddings scaled by sqrt(d_model) plus sinusoidal or learned positions,
    pre- or post-norm, final LayerNorms only with pre-norm, shared embeddings and tied
    output projection, dropout on embeddings / sublayer outputs / FFN hidden units and
    ``attention_dropout`` on the attention weights), so the parameter count equals
    nas-run's model."""

    def __init__(self, vocab: int, m, pad_id: int):
        super().__init__()
        from torch import nn

        from .model import sinusoids

        d, nf = int(m.d_model), bool(m.norm_first)
        self.pad_id, self.scale = pad_id, math.sqrt(d)
        self.src_tokens = nn.Embedding(vocab, d, padding_idx=pad_id)
        self.tgt_tokens = self.src_tokens if m.share_embeddings else nn.Embedding(vocab, d, padding_idx=pad_id)
        if m.positions == "learned":
            self.positions = nn.Parameter(torch.randn(int(m.max_len), d) * d**-0.5)
        else:
            self.register_buffer("positions", sinusoids(torch.arange(int(m.max_len)), d), persistent=False)
        layer_args = dict(d_model=d, nhead=int(m.heads), dim_feedforward=int(m.ffn), dropout=float(m.dropout),
                          batch_first=True, norm_first=nf)
        encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(**layer_args), int(m.encoder_layers),
                                        norm=nn.LayerNorm(d) if nf else None, enable_nested_tensor=False)
        decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(**layer_args), int(m.decoder_layers),
                                        norm=nn.LayerNorm(d) if nf else None)
        self.transformer = nn.Transformer(d_model=d, nhead=int(m.heads), custom_encoder=encoder,
                                          custom_decoder=decoder, batch_first=True)
        for mod in self.modules():  # nas-run: model.attention_dropout on the weights (0 by default)
            if isinstance(mod, nn.MultiheadAttention):
                mod.dropout = float(m.get("attention_dropout", 0.0))
        self.dropout = nn.Dropout(float(m.dropout))

    def forward(self, src, tgt_in):
        src_pad, tgt_pad = src == self.pad_id, tgt_in == self.pad_id
        x = self.dropout(self.src_tokens(src) * self.scale + self.positions[: src.size(1)])
        y = self.dropout(self.tgt_tokens(tgt_in) * self.scale + self.positions[: tgt_in.size(1)])
        t = tgt_in.size(1)  # boolean like the padding masks: True = may not attend
        causal = torch.ones(t, t, dtype=torch.bool, device=src.device).triu(1)
        h = self.transformer(x, y, tgt_mask=causal, tgt_is_causal=True, src_key_padding_mask=src_pad,
                             tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=src_pad)
        return torch.nn.functional.linear(h, self.tgt_tokens.weight)


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

    from .registry import CONF_DIR

    main = OmegaConf.load(CONF_DIR / "config.yaml")
    return (OmegaConf.load(CONF_DIR / "model" / f"{model_name}.yaml"), main.optim,
            OmegaConf.load(CONF_DIR / "trainer" / "default.yaml"), int(main.log_u_every))


def run_nas_loop(scheme: str, loader, total_steps: int, args, cfgs) -> tuple[list[float], int]:
    """nas-run's own loop: NasLitModule + a Lightning Trainer (no logger, progress bar or
    checkpointing), as train() configures it otherwise (clipping, log_every_n_steps)."""
    import pytorch_lightning as pl

    from .lit import NasLitModule

    model_cfg, optim_cfg, trainer_cfg, log_u_every = cfgs
    pl.seed_everything(args.seed, verbose=False)
    module = NasLitModule(model_cfg, _attention_cfg(scheme), optim_cfg, _bench_task(args.vocab),
                          log_u_every=log_u_every)
    clock = _StepClock(torch.device(args.device))
    trainer = pl.Trainer(accelerator="gpu" if args.device == "cuda" else "cpu", devices=1,
                         precision=args.precision, max_steps=total_steps, max_epochs=-1, logger=False,
                         enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
                         callbacks=[_clock_callback(clock)], gradient_clip_val=trainer_cfg.gradient_clip_val,
                         log_every_n_steps=int(trainer_cfg.log_every_n_steps), num_sanity_val_steps=0,
                         limit_val_batches=0, deterministic=False)
    trainer.fit(module, train_dataloaders=loader)
    from .run import count_parameters

    return clock.stamps, count_parameters(module.model)


def run_reference_loop(loader, total_steps: int, args, cfgs) -> tuple[list[float], int]:
    """The plain PyTorch loop: same batches, Adam, inverse-sqrt schedule, label-smoothed
    cross entropy, gradient clipping and precision as nas-run's loop."""
    from contextlib import nullcontext

    from tasks.base import PAD

    from .lit import inverse_sqrt
    from .run import count_parameters

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
    from .registry import available

    valid = train_schemes()
    bad = [s for s in args.schemes if s not in valid]
    if bad:
        parser.error(f"unknown scheme(s) {', '.join(bad)}; valid: {', '.join(valid)}")
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


# --------------------------------------------------------------------------- CLI


def _csv(kind):
    def parse(text: str) -> list:
        try:
            items = [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {kind.__name__}, got {text!r}")
        if not items:
            raise argparse.ArgumentTypeError("empty list")
        return items

    return parse


def _positive(kind):
    def parse(text: str):
        try:
            x = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}")
        if x <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return x

    return parse


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nas-bench", description="Micro-benchmarks of nas-run components.")
    sub = parser.add_subparsers(dest="command", required=True)
    att = sub.add_parser(
        "attention", help="forward+backward time and peak memory of the attention cores",
        description="Time and peak memory of forward+backward per attention scheme, length and causal setting, "
                    "with ratios to UNAS (fused SDPA).")
    att.add_argument("--schemes", type=_csv(str), default=DEFAULT_SCHEMES,
                     help=f"comma-separated; names in conf/attention/ or <name>-naive (default: {','.join(DEFAULT_SCHEMES)})")
    att.add_argument("--lengths", type=_csv(_positive(int)), default=[256, 512, 1024],
                     help="comma-separated sequence lengths S (default: 256,512,1024)")
    att.add_argument("--heads", type=_positive(int), default=8)
    att.add_argument("--d-head", type=_positive(int), default=64)
    att.add_argument("--batch", type=_positive(int), default=1)
    att.add_argument("--causal", choices=["off", "on", "both"], default="off",
                     help="off: encoder self-attention; on: causal decoder self-attention; both")
    att.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    att.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (cuda if available)")
    att.add_argument("--repeats", type=_positive(int), default=5)
    att.add_argument("--warmup", type=int, default=1)
    att.add_argument("--max-seconds", type=_positive(float), default=60.0,
                     help="a case whose first forward+backward takes longer is recorded as too_slow")
    att.add_argument("--isolate", action="store_true", help="run every case in a fresh subprocess")
    att.add_argument("--threads", type=_positive(int), default=None,
                     help="torch CPU threads (default: torch's choice); 1 avoids OpenMP oversubscription on "
                          "shared machines")
    att.add_argument("--out-json", type=Path, default=Path("docs/bench_attention.json"))
    att.add_argument("--out-md", type=Path, default=Path("docs/benchmarks.md"))
    att.set_defaults(subparser=att)  # option errors name the subcommand

    from .gpucheck import add_parser as add_gpu_check

    add_gpu_check(sub)
    tr = sub.add_parser(
        "train", help="end-to-end training throughput: nas-run's model and loop vs a plain torch.nn.Transformer loop",
        description="Training tokens/s of nas-run (NasLitModule + Lightning Trainer) per attention scheme and of "
                    "a plain PyTorch loop over torch.nn.Transformer with the same sizes, batches, optimizer and "
                    "loss, with time ratios and issue #6's targets.")
    tr.add_argument("--model", default="base", help="a model config in conf/model/ (tiny, small, base, ...; "
                                                    "default: base)")
    tr.add_argument("--src-len", type=_csv(_positive(int)), default=[128],
                    help="comma-separated source lengths (default: 128)")
    tr.add_argument("--tgt-len", type=_csv(_positive(int)), default=None,
                    help="target lengths: one for all, or one per --src-len (default: = --src-len)")
    tr.add_argument("--batch", type=_positive(int), default=8)
    tr.add_argument("--vocab", type=_positive(int), default=10000,
                    help="joint vocabulary size (default: 10000)")
    tr.add_argument("--steps", type=_positive(int), default=5, help="timed steps per repeat (default: 5)")
    tr.add_argument("--warmup-steps", type=int, default=1,
                    help="untimed steps at the start of each repeat (default: 1)")
    tr.add_argument("--repeats", type=_positive(int), default=3)
    tr.add_argument("--schemes", type=_csv(str), default=TRAIN_DEFAULT_SCHEMES,
                    help="comma-separated; names in conf/attention/, or <name>-naive|efficient|auto for the "
                         f"schemes with an impl option (default: {','.join(TRAIN_DEFAULT_SCHEMES)}; unas always runs)")
    tr.add_argument("--precision", choices=TRAIN_PRECISIONS, default="32-true",
                    help="32-true, or bf16-mixed (autocast in both loops)")
    tr.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    tr.add_argument("--threads", type=_positive(int), default=None,
                    help="torch CPU threads (default: torch's choice)")
    tr.add_argument("--seed", type=int, default=1)
    tr.add_argument("--out-json", type=Path, default=None,
                    help="default: docs/bench_train.json (CPU, 32-true), else docs/bench_train_<device>_<precision>.json")
    tr.add_argument("--out-md", type=Path, default=Path("docs/benchmarks.md"))
    tr.set_defaults(subparser=tr)
    return parser


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, threads={torch.get_num_threads()})"


def attention_main(args, parser, argv: list[str]) -> int:
    valid = valid_schemes()
    bad = [s for s in args.schemes if s not in valid]
    if bad:
        parser.error(f"unknown scheme(s) {', '.join(bad)}; valid: {', '.join(valid)}")
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(args.device)
    except RuntimeError:
        parser.error(f"argument --device: invalid device {args.device!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("argument --device: CUDA is not available on this machine")
    if args.warmup < 0:
        parser.error("argument --warmup: must be >= 0")
    if args.threads:
        torch.set_num_threads(args.threads)
    schemes = list(dict.fromkeys([BASELINE] + args.schemes))  # the baseline runs first
    causals = {"off": [False], "on": [True], "both": [False, True]}[args.causal]
    results: list[dict] = []
    failed: set[tuple[str, bool]] = set()
    for causal in causals:
        for length in sorted(args.lengths):
            for scheme in schemes:
                if (scheme, causal) in failed:
                    rec = {"scheme": scheme, "length": length, "causal": causal, "status": "skipped",
                           "time_ms": None, "peak_bytes": None}
                else:
                    run = run_case_isolated if args.isolate else run_case
                    rec = run(scheme, length, causal, args)
                    if rec["status"] != "ok":
                        failed.add((scheme, causal))
                results.append(rec)
                print(f"causal={causal!s:5} S={length:<6} {scheme:<15} {rec['status']:<8} "
                      f"{_num(rec['time_ms'], '10.2f')} ms  "
                      f"{_num(None if rec['peak_bytes'] is None else rec['peak_bytes'] / 2**20, '10.1f')} MiB",
                      flush=True)
    add_ratios(results)
    config = {
        "batch": args.batch, "heads": args.heads, "d_head": args.d_head, "dtype": args.dtype,
        "device": str(device), "device_name": _device_name(device), "torch": torch.__version__,
        "repeats": args.repeats, "warmup": args.warmup, "max_seconds": args.max_seconds, "isolate": args.isolate,
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
        "memory_method": "torch.cuda.max_memory_allocated" if device.type == "cuda"
        else "torch.profiler allocation records",
        "command": "nas-bench " + " ".join(argv),
    }
    args.out_json.parent.mkdir(parents=True, exist_ok=True)
    args.out_json.write_text(json.dumps({"config": config, "results": results}, indent=2) + "\n")
    write_markdown(args.out_md, markdown_section(config, results))
    print(f"wrote {args.out_json} and {args.out_md}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_case"]:  # internal: one isolated case (see run_case_isolated)
        spec = json.loads(argv[1])
        args = argparse.Namespace(**spec["args"])
        print(json.dumps(run_case(spec["scheme"], spec["length"], spec["causal"], args)), flush=True)
        return 0
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.command == "attention":
        return attention_main(args, args.subparser, argv)
    if args.command == "gpu-check":
        from .gpucheck import main as gpu_check

        return gpu_check(args)
    if args.command == "train":
        return train_main(args, args.subparser, argv)
    parser.error(f"unknown command {args.command}")  # pragma: no cover - argparse rejects it first
    return 2


if __name__ == "__main__":
    sys.exit(main())
