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
nas-run UNAS / reference, every other scheme / nas-run UNAS, with the CPU targets below.
"""
from __future__ import annotations

import gc
import json
import statistics
import warnings
from pathlib import Path
from types import MappingProxyType

import torch

from nas_cli.bench.markdown import num as _num, write_markdown
from nas_cli.bench.attention import machine_name, is_oom
from nas_cli.bench.train_loops import (Batches, bench_configs, quiet_lightning, run_nas_loop,
                                       run_reference_loop)

TRAIN_MD_SECTION = "## End-to-end training (nas-bench train)"
TRAIN_DEFAULT_SCHEMES = ("unas", "dnas", "hnas")
REFERENCE = "reference"
IMPL_SUFFIXES = ("naive", "efficient", "auto", "flex", "triton")
#: the CPU targets, as time per token: (scheme, compared with, at most). They are stated
#: for CPU training at Transformer-base sizes with sequence lengths 64-128 (TARGET_SETTING).
TRAIN_TARGETS = MappingProxyType({"unas": (REFERENCE, 1.05), "dnas": ("unas", 1.15), "hnas": ("unas", 1.25)})
TARGET_SETTING = MappingProxyType({"device": "cpu", "model": "base", "lengths": (64, 128)})
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

    from nas_cli.model.choices import available, scheme_config

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
    from nas_cli.model.choices import scheme_config

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
    from nas_cli.model.plan import LOCATIONS

    spec, sep, where = scheme.partition(LOCATION_SEP)
    if spec not in valid:
        return f"unknown scheme {spec!r}"
    bad = [loc for loc in where.split("+") if loc not in LOCATIONS] if sep else []
    if bad:
        return f"{scheme!r}: unknown location {bad[0]!r} (use {', '.join(LOCATIONS)}, joined by '+')"
    return None


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
        f"`vs` loop. Targets ({TARGET_SETTING['device'].upper()}, model `{TARGET_SETTING['model']}`, "
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
    from nas_cli.model.choices import available

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
    cfgs = bench_configs(args.model)
    model_cfg = cfgs[0]
    too_long = [n for n in args.src_len + tgt_lens if n > int(model_cfg.max_len)]
    if too_long:
        parser.error(f"length {max(too_long)} exceeds model {args.model}'s max_len={model_cfg.max_len}")
    if args.vocab < 4:
        parser.error("argument --vocab: must be >= 4 (three special ids plus tokens)")
    if args.threads:
        torch.set_num_threads(args.threads)
    with warnings.catch_warnings():
        quiet_lightning()
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
            Batches(args.batch, src_len, tgt_len, args.vocab, total, seed=args.seed), batch_size=None,
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
                        stamps, n_params = run_nas_loop(_attention_cfg(loop), loader, total, args, cfgs)
                    if len(stamps) != total + 1:
                        raise RuntimeError(f"ran {len(stamps) - 1} steps, expected {total}")
                    times[loop].append(stamps[-1] - stamps[args.warmup_steps])
                    params[loop] = n_params
                except Exception as err:  # noqa: BLE001 - a failing loop is recorded, the others go on
                    status[loop] = "oom" if is_oom(err) else \
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
        "device_name": machine_name(device), "threads": torch.get_num_threads() if device.type == "cpu" else None,
        "torch": torch.__version__, "lightning": pl.__version__, "seed": args.seed, "parameters": params,
        "targets": {n: {"vs": vs, "max_time_ratio": t} for n, (vs, t) in TRAIN_TARGETS.items()},
        "target_setting": dict(TARGET_SETTING),
    }
    return results, config


