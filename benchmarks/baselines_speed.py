"""CPU forward + backward time of today's baselines against UNAS, with the targets they are held to.

Each of the seven schemes of the baselines (sigmoid, gated, softpick, differential, forgetting,
selective, stick-breaking) runs as ``nas-bench attention`` runs a core: forward + backward of the
core alone in causal self-attention (the form every one of them has), q, k, v (and the gate
projection x where a scheme needs one) requiring grad, the median of ``--repeats`` runs, peak
memory from torch.profiler's allocation records; UNAS (fused SDPA) is measured in the same
process at the same sizes. Each ratio is held against its target: sigmoid, gated, softpick
<= 1.3x UNAS; differential, forgetting, selective <= 2x; stick-breaking <= 3x. A target missed is
written as the gap, not hidden.

    python benchmarks/baselines_speed.py            # docs/bench_baselines.json + a section of docs/benchmarks.md
"""
from __future__ import annotations

import json
import sys

import torch

from nas_cli.bench.attention import add_ratios, machine_name, run_case
from nas_cli.bench.cpu_cases import cpu_case, cpu_case_options
from nas_cli.bench.markdown import num, write_markdown

MD_SECTION = "## Today's baselines against UNAS (benchmarks/baselines_speed.py)"
#: the most fwd+bwd time per UNAS's that each scheme is held to on the CPU
TARGETS = {"sigmoid": 1.3, "gated": 1.3, "softpick": 1.3, "differential": 2.0, "forgetting": 2.0,
           "selective": 2.0, "stickbreaking": 3.0}


def main(argv: list[str] | None = None) -> int:
    args = cpu_case_options(__doc__.splitlines()[0], [256, 1024], "docs/bench_baselines.json").parse_args(argv)
    case = cpu_case(args)
    results = []
    for length in args.lengths:
        for scheme in ["unas", *TARGETS]:
            rec = run_case(scheme, length, True, case)
            results.append(rec)
            print(f"S={length:<5} {scheme:<14} {rec['status']:<6} {num(rec['time_ms'], '9.2f')} ms", flush=True)
    add_ratios(results)
    for r in results:
        target = TARGETS.get(r["scheme"])
        r["target"] = target
        r["met"] = None if target is None or r.get("time_ratio") is None else bool(r["time_ratio"] <= target)
    config = {"batch": args.batch, "heads": args.heads, "d_head": args.d_head, "dtype": "float32",
              "device_name": machine_name(torch.device("cpu")), "torch": torch.__version__, "repeats": args.repeats,
              "threads": args.threads, "causal": True,
              "command": "python benchmarks/baselines_speed.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    args.out_json.parent.mkdir(parents=True, exist_ok=True)
    args.out_json.write_text(json.dumps({"config": config, "results": results}, indent=2) + "\n")
    write_markdown(args.out_md, markdown(config, results))
    print(f"wrote {args.out_json} and {args.out_md}")
    return 0


#: why a scheme costs what it does on this CPU (what the gap, where there is one, is made of)
WHY = {
    "sigmoid": "no softmax for SDPA: blocks of 128 queries under activation checkpointing (the forward runs "
               "twice), against SDPA's fused causal kernel",
    "softpick": "as sigmoid, with two exponentials and an absolute value per weight",
    "gated": "SDPA plus one elementwise gate",
    "differential": "two SDPA calls (one per map of each head pair), then RMSNorm",
    "forgetting": "one SDPA call on one more feature; a gate that forgets fast makes most weights subnormal "
                  "inside SDPA, which the CPU multiplies slowly (with torch.set_flush_denormal(True) the same "
                  "case ran at 1.2x UNAS: 81 ms against 221 ms, S=1024)",
    "selective": "blocks under checkpointing, head 0's running column sums, a masked softmax",
    "stickbreaking": "blocks under checkpointing, log-sigmoids, a reversed cumulative sum and an exponential "
                     "per weight",
}


def markdown(config: dict, results: list[dict]) -> str:
    lines = [MD_SECTION, "",
             f"Forward + backward of one attention core in causal self-attention; B={config['batch']}, "
             f"H={config['heads']}, d_head={config['d_head']}, float32 on {config['device_name']} (torch "
             f"{config['torch']}), median of {config['repeats']} runs after one warm-up; peak = most bytes held "
             "during one run beyond the inputs (torch.profiler allocation records). Ratios are to `unas` (fused "
             f"SDPA, causal) at the same length. Command: `{config['command']}`", "",
             "| S | scheme | fwd+bwd ms | peak MiB | time / UNAS | target | met |", "|---:|---|---:|---:|---:|---:|---|"]
    for r in results:
        peak = None if r["peak_bytes"] is None else r["peak_bytes"] / 2**20
        met = "-" if r.get("met") is None else ("yes" if r["met"] else f"no (gap {r['time_ratio'] / r['target']:.2f}x)")
        target = "-" if r.get("target") is None else f"<= {r['target']:g}x"
        lines.append(f"| {r['length']} | {r['scheme']} | {num(r['time_ms'], '.2f')} | {num(peak, '.1f')} | "
                     f"{num(r.get('time_ratio'), '.2f')} | {target} | {met} |")
    missed = sorted({r["scheme"] for r in results if r.get("met") is False})
    lines += ["", "What each costs: " + "; ".join(f"`{k}`: {v}" for k, v in WHY.items()) + ".",
              "", ("Targets missed: " + ", ".join(f"`{m}`" for m in missed) + ". None of them has a fused CPU "
                   "kernel to run on; on CUDA a fused kernel (FlexAttention, flash-linear-attention) is the "
                   "way to the targets, not measured here.") if missed else "Every target is met."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
