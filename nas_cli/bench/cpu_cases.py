"""The command line of the CPU benchmarks that time attention cores against UNAS (benchmarks/baselines_speed.py,
benchmarks/mixers_speed.py): their options and the case every timing runs under."""
from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

import torch


def cpu_case_options(description: str, lengths: list[int], out_json: str) -> argparse.ArgumentParser:
    """The options: the lengths, the heads and their size, the batch, the repeats, the threads, the outputs."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--lengths", type=lambda s: [int(x) for x in s.split(",")], default=lengths)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--d-head", type=int, default=64)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out-json", type=Path, default=Path(out_json))
    p.add_argument("--out-md", type=Path, default=Path("docs/benchmarks.md"))
    return p


def cpu_case(args) -> SimpleNamespace:
    """The case of ``nas_cli.bench.attention.run_case`` for these options (float32 on the CPU, one warm-up, a
    120 s guard), with torch's thread count set to ``--threads``."""
    torch.set_num_threads(args.threads)
    return SimpleNamespace(heads=args.heads, d_head=args.d_head, batch=args.batch, dtype="float32", device="cpu",
                           repeats=args.repeats, warmup=1, max_seconds=120.0, threads=args.threads)
