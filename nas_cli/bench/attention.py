"""``nas-bench attention``: time and peak memory of the attention cores alone.

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

from types import MappingProxyType
import argparse
import gc
import json
import platform
import statistics
import subprocess
import sys
import time
from typing import Any

import torch

from nas_cli.bench.markdown import num as _num, write_markdown

MD_SECTION = "## Attention kernels (nas-bench attention)"
DEFAULT_SCHEMES = ("unas", "unas-naive", "dnas", "dnas-naive", "hnas", "sinkhorn")
BASELINE = "unas"
DTYPES = MappingProxyType({"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16})


# --------------------------------------------------------------------------- cases


def valid_schemes() -> list[str]:
    """Registry names, plus ``<name>-naive`` where a naive reference path exists (the
    schemes with an ``impl`` option, and UNAS's eager formula) and ``<name>-flex``
    (FlexAttention, attention/flex.py) and ``<name>-triton`` (the Triton kernels of both forms:
    attention/triton_encoder.py for the non-causal cases, attention/triton_prefix.py for the causal
    ones) for the schemes with an ``impl`` option."""
    from nas_cli.model.choices import available, scheme_config

    names = available("attention")
    naive = [f"{n}-naive" for n in names
             if n == BASELINE or "impl" in scheme_config(n)]
    flex = [f"{n}-flex" for n in names if "impl" in scheme_config(n)]
    triton = [f"{n}-triton" for n in names if "impl" in scheme_config(n)]
    return names + naive + flex + triton


def build_core(scheme: str, heads: int, causal: bool, d_head: int):
    """Core for ``scheme`` (``name`` or ``name-naive``) and a forward callable."""
    from nas_cli.attention.base import AttentionCore
    from nas_cli.model.choices import scheme_config
    from nas_cli.model.plan import make_core_factory

    name, _, variant = scheme.partition("-")
    naive = variant == "naive"
    cfg = scheme_config(name)
    if "impl" in cfg:  # the plain name times the efficient path, whatever the config default (auto)
        cfg.impl = variant if variant in ("naive", "flex", "triton") else "efficient"
    # non-causal: encoder self-attention (full column sums); causal: decoder self-attention
    core = make_core_factory(cfg, heads)("decoder" if causal else "encoder", 0, causal)
    core.set_width(heads * d_head)  # width-dependent parameters, as MultiHeadAttention sets them
    core.eval()  # no dropout: the benchmark measures the kernels
    if naive and "impl" not in cfg:  # e.g. UNAS: the eager formula of the base class
        return core, lambda q, k, v: AttentionCore.forward(core, q, k, v).out
    n = core.input_features(d_head)
    if n:  # gated / forgetting attention: the layer-input projection the model would hand it, fixed per shape
        made: dict = {}

        def with_x(q, k, v):
            key = (q.shape, q.device, q.dtype)
            if key not in made:
                g = torch.Generator().manual_seed(1)
                made[key] = torch.randn(*q.shape[:-1], n, generator=g).to(q.device, q.dtype).requires_grad_()
            return core(q, k, v, x=made[key]).out

        return core, with_x
    return core, lambda q, k, v: core(q, k, v).out


def sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def is_oom(err: BaseException) -> bool:
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

        # warm-up; the first run doubles as the --max-seconds guard (it includes compiling and, for the
        # Triton kernels on a GPU, autotuning their tiles: about 10 s per kernel the first time)
        for w in range(max(1, args.warmup)):
            sync_device(device)
            t0 = time.perf_counter()
            step()
            sync_device(device)
            first = time.perf_counter() - t0
            if w == 0 and first > args.max_seconds:
                rec.update(status="too_slow", time_ms=1e3 * first)
                return rec
        rec["peak_bytes"] = _peak_bytes(step, device)
        rec["time_ms"] = 1e3 * _median_seconds(step, device, args.repeats)
        if scheme.endswith("-triton") and device.type == "cuda":  # the tiles the autotuner kept
            from nas_cli.attention.triton_tiles import chosen_all

            rec["tiles"] = chosen_all()
    except Exception as err:  # noqa: BLE001 - every failure becomes a recorded status
        rec["status"] = "oom" if is_oom(err) else f"error: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
    finally:
        tensors.clear()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rec


def _peak_bytes(step, device: torch.device) -> int:
    """Peak memory of one run of ``step`` above what was allocated before it."""
    if device.type != "cuda":
        return int(_cpu_peak_bytes(step))
    sync_device(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    step()
    sync_device(device)
    return int(torch.cuda.max_memory_allocated(device) - base)


def _median_seconds(step, device: torch.device, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        sync_device(device)
        t0 = time.perf_counter()
        step()
        sync_device(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_case_isolated(scheme: str, length: int, causal: bool, args) -> dict[str, Any]:
    """run_case in a fresh interpreter; a killed process (host OOM) or a hang is recorded."""
    payload = json.dumps({"scheme": scheme, "length": length, "causal": causal,
                          "args": {k: getattr(args, k) for k in _CASE_ARGS}})
    limit = 120 + args.max_seconds * (2 + args.warmup + args.repeats)
    base = {"scheme": scheme, "length": length, "causal": causal, "time_ms": None, "peak_bytes": None}
    try:
        proc = subprocess.run([sys.executable, "-m", "nas_cli.bench.attention", payload], capture_output=True,
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


def machine_name(device: torch.device) -> str:
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
        "device": str(device), "device_name": machine_name(device), "torch": torch.__version__,
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


if __name__ == "__main__":  # one isolated case (see run_case_isolated): its record as one JSON line
    spec = json.loads(sys.argv[1])
    print(json.dumps(run_case(spec["scheme"], spec["length"], spec["causal"], argparse.Namespace(**spec["args"]))),
          flush=True)
