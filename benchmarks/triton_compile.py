"""Compile every Triton kernel of DNAS's fused forms for an NVIDIA GPU on a machine without one, and
read the compiled code: what a run on the GPU would otherwise find out first, at the cost of the GPU's
time.

Triton compiles for a CUDA target without a GPU (its wheel ships ``ptxas`` and ``cuobjdump``): the
kernels' launch code runs as in training (forward, then backward) with CPU tensors, while a stand-in
driver names the target (``--arch``, default 90: H100/H200) and each launch only compiles. For every
kernel, form, dtype, head dim, mask case and tile candidate (the autotuner's and the prefix tuner's
tables, and the fixed tiles) it records:

- whether it compiles (a kernel that does not would fail the GPU run at its first call);
- registers per thread and the stack (local memory) the compiler had to spill to: a spilling kernel
  is slow, so a candidate that spills is worth dropping from the tables;
- shared memory per program (a Hopper program may use 227 KiB);
- whether its offsets are 64-bit (the batch x head index widened first, so a tensor may pass 2^31 elements);
- from the machine code: the tensor-core instructions (``HGMMA``: Hopper's warpgroup MMA, ``HMMA``:
  mma.sync), the special-function unit's exponentials, reciprocals and logarithms (``MUFU.EX2``,
  ``MUFU.RCP``, ``MUFU.LG2``: ``tl.log`` compiles to a polynomial on the FMA units, the prefix kernels' fast
  logarithm for bf16/fp16 to ``MUFU.LG2``) and all instructions, counted
  statically (each instruction once, loops and untaken branches alike).

    python benchmarks/triton_compile.py --d-heads 64,128 --out-json docs/triton_compile.json --out-md docs/triton_compile.md
    python benchmarks/triton_compile.py --quick      # the fixed tiles only
    python benchmarks/triton_compile.py --tuners     # through the autotuner and the joint tuner, as on a GPU
    python benchmarks/triton_compile.py --arch 80    # an A100

Exit status 1 if a kernel fails to compile. The script clears ``TRITON_INTERPRET`` before Triton is imported.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

FORMS = ("encoder", "hnas-encoder", "sinkhorn3-encoder", "prefix", "hnas-prefix", "prefix-cross")
ENCODER_FORMS = FORMS[:3]
DTYPES = ("bfloat16", "float16", "float32")
_COMPILED: list = []


def _install(arch: int) -> None:
    """A driver that names the target and launches nothing: each kernel call compiles only (in a process
    that has not imported Triton under its interpreter)."""
    os.environ.pop("TRITON_INTERPRET", None)
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    class _CompileOnly:
        target = GPUTarget("cuda", arch, 32)

        def get_current_target(self):
            return self.target

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def is_active(self):
            return True

    driver.set_active(_CompileOnly())
    if getattr(JITFunction, "_nas_compile_only", False):
        return
    run = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        t0 = time.perf_counter()
        kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
        module = self.module.rsplit(".", 1)[-1].removeprefix("triton_").removesuffix("_kernels")
        _COMPILED.append((f"{module}.{self.__name__}", time.perf_counter() - t0, kernel))
        return kernel

    JITFunction.run = compile_only
    JITFunction._nas_compile_only = True
    from nas_cli.attention import triton_encoder, triton_prefix

    triton_prefix.triton_unavailable = triton_encoder.triton_unavailable = lambda device: None


def candidates(form: str, quick: bool = False, tuners: bool = False, tiles=None) -> list:
    """(label, choice) per tile candidate of a form: the fixed tiles (choice None), then the tables' (the
    encoder forms: the i-th forward and backward candidates together; the prefix forms: the joint tuner's);
    only the fixed tiles if ``quick``; one pass through the tuners (choice "tuners") if ``tuners``; or only
    ``tiles`` ((BQ, BK, warps, stages) tuples, every kernel) where given."""
    from nas_cli.attention import triton_tiles as tt

    if tiles:
        return [("x".join(map(str, t)), (t, t) if form in ENCODER_FORMS else t) for t in tiles]
    fixed = [(f"fixed {tt.FIXED_Q}x{tt.FIXED_K}", None)]
    if quick:
        return fixed
    if tuners:
        return [("through the tuners", "tuners")]
    if form in ENCODER_FORMS:
        return fixed + [("x".join(map(str, f)) + " / " + "x".join(map(str, b)), (f, b))
                        for f, b in zip(tt.FORWARD, tt.BACKWARD)]
    return fixed + [("x".join(map(str, t)), t) for t in dict.fromkeys((*tt.PREFIX, tt.PREFIX_FIXED_LOWP))]


def _encoder_launch(choice):
    """triton_tiles.launch with the (forward, backward) tiles ``choice`` (None: the fixed tiles)."""
    from nas_cli.attention import triton_tiles as tt

    def launch(kernel, per, bh, length, bucket, args, kwargs, table=tt.FORWARD, block_q=None, block_k=None):
        tune = tt.tuning_key(bucket, kwargs)
        if choice is None:
            kernel[(bh, 1)](*args, tune, BQ=tt.FIXED_Q, BK=tt.FIXED_K, **kwargs)
            return
        bq, bk, warps, stages = choice[0] if table is tt.FORWARD else choice[1]
        kernel[(bh, 1)](*args, tune, BQ=bq, BK=bk, num_warps=warps, num_stages=stages, **kwargs)

    return launch


def _sass_counts(cubin: bytes, tools: Path) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        usage = subprocess.run([str(tools / "cuobjdump"), "--dump-resource-usage", f.name], capture_output=True,
                               text=True).stdout
        sass = subprocess.run([str(tools / "cuobjdump"), "-sass", f.name], capture_output=True, text=True).stdout
    finally:
        os.unlink(f.name)
    res = dict(re.findall(r"(REG|STACK|LOCAL|SHARED):(\d+)", usage))
    ops = collections.Counter(m.split(".")[0] + ("." + m.split(".")[1] if m.startswith("MUFU") else "")
                              for m in re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", sass))
    return {"regs": int(res.get("REG", -1)), "spill_stack_bytes": int(res.get("STACK", 0)),
            "local_bytes": int(res.get("LOCAL", 0)), "tensor_core_instr": ops["HGMMA"] + ops["HMMA"],
            "wgmma": ops["HGMMA"] > 0, "mufu_ex2": ops["MUFU.EX2"],
            "mufu_rcp": ops["MUFU.RCP"], "mufu_lg2": ops["MUFU.LG2"], "instructions": sum(ops.values())}


def _stand_in_timer(fn, quantiles=None):
    """The tuners' timer under ``--tuners``: runs (here: compiles) the candidate and calls every one 1 ms."""
    fn()
    return [1.0, 1.0, 1.0] if quantiles else 1.0


def compile_case(arch: int, form: str, dtype: str, d: int, masks: str, label: str, choice, s: int = 1024) -> list[dict]:
    """Forward and backward of one case, compile-only: a row per kernel compiled (or one row with the error)."""
    _install(arch)
    import torch
    import triton

    from nas_cli.attention import triton_encoder as te
    from nas_cli.attention import triton_prefix as tp
    from nas_cli.attention import triton_tiles as tt

    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    te.launch = tt.launch if choice == "tuners" else _encoder_launch(choice if form in ENCODER_FORMS else None)
    tt.BENCH = _stand_in_timer if choice == "tuners" else None
    os.environ.pop("NAS_TRITON_PREFIX_TILES", None)
    os.environ["NAS_TRITON_TILES"] = "auto" if choice == "tuners" else "fixed"
    if form not in ENCODER_FORMS and choice not in (None, "tuners"):
        os.environ["NAS_TRITON_PREFIX_TILES"] = "x".join(map(str, choice))
    # s: 1024 by default, a multiple of 16 and of every tile, as the timed lengths: the integer arguments
    # specialize as they will there, and the encoder kernels compile their EVEN case (no bounds test)
    dt = getattr(torch, dtype)
    q, k, v = (torch.zeros(1, 2, s, d, dtype=dt, requires_grad=True) for _ in range(3))
    u = torch.full((2,), 0.5, requires_grad=True)
    mask = torch.ones(1, s, dtype=torch.bool) if masks == "padded" else None
    run = {"encoder": lambda: te.encoder_dnas_triton(q, k, v, mask, mask),
           "hnas-encoder": lambda: te.encoder_hnas_triton(q, k, v, u, mask, mask),
           "sinkhorn3-encoder": lambda: te.encoder_dnas_triton(q, k, v, mask, mask, iterations=3),
           "prefix": lambda: tp.prefix_dnas_triton(q, k, v, mask, mask, causal=True),
           "hnas-prefix": lambda: tp.prefix_hnas_triton(q, k, v, u, mask, mask, causal=True),
           "prefix-cross": lambda: tp.prefix_dnas_triton(q, k, v, mask, mask, causal=False)}[form]
    base = {"arch": f"sm_{arch}", "triton": triton.__version__, "form": form, "dtype": dtype, "d_head": d,
            "seq": s, "masks": masks, "tiles": label}
    _COMPILED.clear()
    try:
        run().float().sum().backward()
    except Exception as exc:  # noqa: BLE001 - a kernel that does not compile is this tool's finding
        failed = str(exc).strip().splitlines()
        rows = [{**base, "kernel": _COMPILED[-1][0] if _COMPILED else "?", "ok": False,
                 "error": " | ".join(x.strip() for x in failed if x.strip())[-600:]}]
        return _rows(base, tools) + rows
    return _rows(base, tools)


def _offsets_int64(ttir: str) -> bool:
    """Whether the kernel widens its first program id (the batch x head index its offsets start from) to
    64 bits before any arithmetic: then B x H x S x D may pass 2^31 elements without its offsets wrapping."""
    pid = re.search(r"(%[\w.]+) = tt.get_program_id x : i32", ttir)
    return bool(pid) and f"arith.extsi {pid.group(1)} : i32 to i64" in ttir


def _rows(base: dict, tools: Path) -> list[dict]:
    rows = []
    for name, seconds, kernel in _COMPILED:
        meta = kernel.metadata
        rows.append({**base, "kernel": name, "ok": True, "compile_s": round(seconds, 2),
                     "num_warps": meta.num_warps, "num_stages": meta.num_stages, "shared_bytes": meta.shared,
                     "offsets_int64": _offsets_int64(kernel.asm["ttir"]), **_sass_counts(kernel.asm["cubin"], tools)})
    return rows


def markdown(rows: list[dict], command: str = "") -> str:
    """A summary per (form, head dim, tiles), then a row per kernel."""
    first = rows[0] if rows else {}
    out = ["# Triton kernels compiled for an NVIDIA GPU (generated)", "",
           f"Compiled for {first.get('arch', '?')} with Triton {first.get('triton', '?')} on a machine without a GPU"
           + (f": `{command}`" if command else "") + ". Registers per thread (at most 255), the bytes per thread"
           " spilled to local memory, shared memory per program, and static instruction counts from the cubin (each"
           " instruction once: a loop's body once, untaken branches too).", "",
           "| form | dtype | d | masks | tiles | kernels | compile | max regs | spills (kernel: bytes) | max shared "
           "(KiB) |", "|---|---|---|---|---|---|---|---|---|---|"]
    cases: dict = {}
    for r in rows:
        cases.setdefault((r["form"], r["dtype"], r["d_head"], r["masks"], r["tiles"]), []).append(r)
    for (form, dtype, d, masks, tiles), got in cases.items():
        ok = [r for r in got if r["ok"]]
        spills = ", ".join(f"{r['kernel'].split('.')[-1]}: {r['spill_stack_bytes']}" for r in ok
                           if r["spill_stack_bytes"]) or "none"
        out.append(f"| {form} | {dtype} | {d} | {masks} | {tiles} | {len(ok)} | "
                   f"{'ok' if len(ok) == len(got) else '**failed**'} | {max((r['regs'] for r in ok), default='-')} | "
                   f"{spills} | {max((r['shared_bytes'] for r in ok), default=0) / 1024:.0f} |")
    head = ("| form | dtype | d | masks | tiles | kernel | compiles | warps | regs | spill (bytes) | shared (KiB) "
            "| tensor-core instr | MUFU ex2/rcp | instr |")
    out += ["", head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if not r["ok"]:
            out.append(f"| {r['form']} | {r['dtype']} | {r['d_head']} | {r['masks']} | {r['tiles']} | {r['kernel']} "
                       f"| **no**: {r['error'][:160]} | | | | | | | |")
            continue
        out.append(f"| {r['form']} | {r['dtype']} | {r['d_head']} | {r['masks']} | {r['tiles']} | {r['kernel']} | "
                   f"yes | {r['num_warps']} | {r['regs']} | {r['spill_stack_bytes']} | "
                   f"{r['shared_bytes'] / 1024:.0f} | {r['tensor_core_instr']}{' (wgmma)' if r['wgmma'] else ''} | "
                   f"{r['mufu_ex2']}/{r['mufu_rcp']} | {r['instructions']} |")
    return "\n".join(out) + "\n"


def main() -> int:
    os.environ.pop("TRITON_INTERPRET", None)  # before Triton is imported: compile, do not interpret
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", type=int, default=90, help="CUDA compute capability x 10 (90: H100/H200, 80: A100)")
    p.add_argument("--forms", default=",".join(FORMS), help=f"comma-separated, of {', '.join(FORMS)}")
    p.add_argument("--dtypes", default="bfloat16", help=f"comma-separated, of {', '.join(DTYPES)}")
    p.add_argument("--d-heads", default="64,128")
    p.add_argument("--masks", default="none", help="comma-separated, of none, padded (query and key masks)")
    p.add_argument("--seq", type=int, default=1024,
                   help="the length every case compiles at (default 1024: every tile divides it, so the encoder "
                        "kernels compile without their bounds test; e.g. 1000 compiles them with it, as padded "
                        "training batches of any length run them)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--quick", action="store_true", help="fixed tiles only")
    which.add_argument("--tuners", action="store_true",
                       help="each case once through the tuners as on a GPU (Triton's autotuner for the encoder forms, the "
                            "joint tuner for the prefix forms), with a stand-in timer: every candidate compiles")
    which.add_argument("--tiles", help="compile these tiles instead of the tables: comma-separated BQxBKxWARPSxSTAGES")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--out-json")
    p.add_argument("--out-md")
    a = p.parse_args()
    forms, dtypes, masks = a.forms.split(","), a.dtypes.split(","), a.masks.split(",")
    for name, got, allowed in (("--forms", forms, FORMS), ("--dtypes", dtypes, DTYPES),
                               ("--masks", masks, ("none", "padded"))):
        if set(got) - set(allowed):
            p.error(f"{name}: unknown {', '.join(sorted(set(got) - set(allowed)))} (choose from {', '.join(allowed)})")
    try:
        tiles = [tuple(int(x) for x in t.split("x")) for t in a.tiles.split(",")] if a.tiles else None
        assert tiles is None or all(len(t) == 4 for t in tiles)
    except (ValueError, AssertionError):
        p.error(f"--tiles {a.tiles}: expected BQxBKxWARPSxSTAGES, comma-separated (e.g. 64x64x8x2)")
    if a.seq < 16:
        p.error(f"--seq {a.seq}: at least 16")
    cases = [(a.arch, form, dtype, int(d), m, label, choice, a.seq) for form in forms for dtype in dtypes
             for d in a.d_heads.split(",") for m in masks for label, choice in candidates(form, a.quick, a.tuners, tiles)]
    rows = []
    t0 = time.time()
    with ProcessPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        for got in pool.map(compile_case, *zip(*cases)):
            rows += got
            for r in got:
                print(json.dumps(r), flush=True)
    print(f"{len(cases)} cases, {len(rows)} kernels, {sum(not r['ok'] for r in rows)} failed, {time.time() - t0:.0f} s",
          file=sys.stderr)
    if a.out_json:
        Path(a.out_json).write_text(json.dumps(rows, indent=1) + "\n")
    if a.out_md:
        argv = sys.argv[1:]
        for i in reversed(range(len(argv))):  # --jobs changes how long it takes, not what it finds
            if argv[i] == "--jobs":
                del argv[i:i + 2]
            elif argv[i].startswith("--jobs="):
                del argv[i]
        command = "python benchmarks/triton_compile.py " + " ".join(argv)
        Path(a.out_md).write_text(markdown(rows, command))
    return 1 if any(not r["ok"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
