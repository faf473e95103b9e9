"""One training step of a Llama-style Hugging Face model with nas-run's schemes against the
library's own ``sdpa``, with ``use_cache=False`` and with the library's default call (``use_cache``
from the config: True), on the CPU or a GPU.

A forward with ``use_cache=True`` computes no per-query ``step`` in a cached prefill (the state a
continuation needs comes from one vectorized pass when one comes; one call per query and layer would
be 180x HF's ``sdpa`` for ``unas`` on an H200), and UNAS is the library's SDPA function. Each cell: the median of ``--reps`` timed steps (forward,
backward, optimizer step) after ``--warmup`` untimed ones, the same random batch; on CUDA with
``torch.cuda.synchronize``, bf16 autocast with ``--bf16``.

    python benchmarks/hf_step.py                          # CPU, small (docs/hf_step.json + docs/speed.md)
    python benchmarks/hf_step.py --device cuda --layers 8 --hidden 512 --heads 8 --seq 2048 --batch 4 --bf16 \\
        --tag H200 --out gpu_out/hf_step.json             # the issue's shape on a GPU
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from nas_cli.bench.markdown import write_markdown

ROOT = Path(__file__).resolve().parent.parent
IMPLS = ("sdpa", "unas", "dnas", "hnas")


def model_for(impl: str, args):
    import nas_cli.hf as nh
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.heads,
                      max_position_embeddings=max(2048, args.seq), pad_token_id=0)
    torch.manual_seed(0)
    model = LlamaForCausalLM._from_config(cfg, attn_implementation=impl)
    if impl != "sdpa":
        nh.attach(model)
    return model.to(args.device).train()


def time_step(model, ids, use_cache: bool | None, args) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    kw = {} if use_cache is None else {"use_cache": use_cache}
    times = []
    for i in range(args.warmup + args.reps):
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast(args.device.split(":")[0], dtype=torch.bfloat16, enabled=args.bf16):
            loss = model(ids, labels=ids, **kw).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    return times


def run(args) -> dict:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, args.vocab, (args.batch, args.seq), generator=g).to(args.device)
    cells = []
    for impl in IMPLS:
        model = model_for(impl, args)
        for use_cache, label in ((False, "use_cache=False"), (None, "default call (use_cache=True)")):
            t = time_step(model, ids, use_cache, args)
            cells.append({"impl": impl, "call": label, "median_ms": 1000 * statistics.median(t),
                          "min_ms": 1000 * min(t), "max_ms": 1000 * max(t), "reps": len(t)})
            print(json.dumps(cells[-1]), flush=True)
        del model
    return {"cells": cells}


def table(r: dict) -> str:
    a = r["args"]
    base = {c["call"]: c["median_ms"] for c in r["cells"] if c["impl"] == "sdpa"}
    lines = [f"## Hugging Face Llama-style training step{' (' + r['tag'] + ')' if r.get('tag') else ''} (generated)", "",
             f"Generated {r['date']} by `{r['command']}` on {r['machine']}. One training step (forward, backward, "
             f"AdamW) of a Llama-style model: {a['layers']} layers, hidden {a['hidden']}, {a['heads']} heads, "
             f"sequence {a['seq']}, batch {a['batch']}, {'bf16 autocast' if a['bf16'] else 'float32'}; median of "
             f"{a['reps']} steps (min-max in brackets) after {a['warmup']} untimed; ratio: against HF's `sdpa` with "
             "the same call.", "",
             "| attn_implementation | use_cache=False | ratio | HF's default call (use_cache=True) | ratio |",
             "|---|---|---|---|---|"]
    for impl in IMPLS:
        row = [f"`{impl}`" if impl != "sdpa" else "HF `sdpa`"]
        for call in ("use_cache=False", "default call (use_cache=True)"):
            c = next(x for x in r["cells"] if x["impl"] == impl and x["call"] == call)
            row += [f"{c['median_ms']:.1f} ms [{c['min_ms']:.1f}-{c['max_ms']:.1f}]",
                    f"{c['median_ms'] / base[call]:.2f}x"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="CPU threads (torch.set_num_threads)")
    p.add_argument("--tag", default="", help="a words in the heading (e.g. H200): one section per tag")
    p.add_argument("--out", default=str(ROOT / "docs" / "hf_step.json"))
    p.add_argument("--markdown", default=str(ROOT / "docs" / "speed.md"))
    return p


def main() -> None:
    p = make_parser()
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    result = run(args)
    machine = (torch.cuda.get_device_name(0) if args.device.startswith("cuda")
               else f"{platform.machine()} CPU, {args.threads} thread(s)")
    import transformers

    result.update(args=vars(args), date=time.strftime("%Y-%m-%d"), tag=args.tag,
                  machine=f"{machine}, torch {torch.__version__}, transformers {transformers.__version__}",
                  command="python benchmarks/hf_step.py " + " ".join(
                      f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
                      if k not in ("out", "markdown") and v not in (False, "") and p.get_default(k) != v))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    write_markdown(Path(args.markdown), table(result))


if __name__ == "__main__":
    main()
