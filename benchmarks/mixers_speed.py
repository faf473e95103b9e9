"""CPU time of the linear-attention and state-space mixers against UNAS: forward + backward over a sequence, and one
decoding step after a prefix of that length.

Each mixer (linear attention, GLA, DeltaNet, Gated DeltaNet, Mamba-2) runs as ``nas-bench attention`` runs a core:
the core alone in causal self-attention, q, k, v (and the layer-input projection x a mixer reads) requiring grad,
forward + backward, the median of ``--repeats`` runs. The step is ``core.step`` for the newest position: UNAS reads
the cached keys and values of every earlier position, a mixer its state (built by running the prefix once; the
state, not the prefix, is what the step reads). UNAS (fused SDPA) is measured in the same process at the same sizes.

    python benchmarks/mixers_speed.py            # docs/bench_mixers.json + a section of docs/benchmarks.md
"""
from __future__ import annotations

import json
import sys
import time

import torch

from nas_cli.bench.attention import add_ratios, build_core, machine_name, run_case
from nas_cli.bench.cpu_cases import cpu_case, cpu_case_options
from nas_cli.bench.markdown import num, write_markdown

MD_SECTION = "## Linear-attention and state-space mixers against UNAS (benchmarks/mixers_speed.py)"
MIXERS = ("linear_attention", "gla", "deltanet", "gated_deltanet", "mamba2")


def step_ms(scheme: str, length: int, case) -> float | None:
    """Median time of one decoding step after ``length - 1`` positions (no gradients). A mixer's step reads a state
    of fixed size (made by one step here: its size, not its content, sets the step's time); UNAS's reads every
    cached key and value."""
    torch.manual_seed(0)
    core, _ = build_core(scheme, case.heads, True, case.d_head)
    shape = (case.batch, case.heads, length, case.d_head)
    q, k, v = (torch.randn(shape) for _ in range(3))
    n = core.input_features(case.d_head)
    new = {"x": torch.randn(*shape[:-2], 1, n)} if n else {}
    with torch.no_grad():
        state = core.step(q[:, :, :1], k[:, :, :1], v[:, :, :1], None, None, **new)[1] if core.recurrent else None
        keys, values = (k[:, :, -1:], v[:, :, -1:]) if core.recurrent else (k, v)
        times = []
        for _ in range(case.repeats + 1):
            t0 = time.perf_counter()
            core.step(q[:, :, -1:], keys, values, None, state, **new)
            times.append(time.perf_counter() - t0)
    kept = sorted(times[1:])
    return 1e3 * kept[len(kept) // 2]


def main(argv: list[str] | None = None) -> int:
    args = cpu_case_options(__doc__.splitlines()[0], [256, 1024, 4096], "docs/bench_mixers.json").parse_args(argv)
    case = cpu_case(args)
    results = []
    for length in args.lengths:
        for scheme in ["unas", *MIXERS]:
            rec = run_case(scheme, length, True, case)
            rec["step_ms"] = step_ms(scheme, length, case)
            results.append(rec)
            print(f"S={length:<5} {scheme:<16} {rec['status']:<6} fwd+bwd {num(rec['time_ms'], '9.2f')} ms  "
                  f"step {num(rec['step_ms'], '7.3f')} ms", flush=True)
    add_ratios(results)
    base = {r["length"]: r["step_ms"] for r in results if r["scheme"] == "unas"}
    for r in results:
        r["step_ratio"] = None if not base.get(r["length"]) or r["step_ms"] is None else r["step_ms"] / base[r["length"]]
    config = {"batch": args.batch, "heads": args.heads, "d_head": args.d_head, "dtype": "float32",
              "device_name": machine_name(torch.device("cpu")), "torch": torch.__version__, "repeats": args.repeats,
              "threads": args.threads, "causal": True,
              "command": "python benchmarks/mixers_speed.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    args.out_json.parent.mkdir(parents=True, exist_ok=True)
    args.out_json.write_text(json.dumps({"config": config, "results": results}, indent=2) + "\n")
    write_markdown(args.out_md, markdown(config, results))
    print(f"wrote {args.out_json} and {args.out_md}")
    return 0


def markdown(config: dict, results: list[dict]) -> str:
    lines = [MD_SECTION, "",
             f"One core in causal self-attention; B={config['batch']}, H={config['heads']}, d_head={config['d_head']}, "
             f"float32 on {config['device_name']} (torch {config['torch']}), median of {config['repeats']} runs after "
             "one warm-up. fwd+bwd: the whole sequence of S positions; step: one decoding step after S - 1 "
             "positions (UNAS reads S cached keys and values, a mixer its state). Ratios are to `unas` (fused SDPA) "
             f"at the same S. Command: `{config['command']}`", "",
             "| S | scheme | fwd+bwd ms | peak MiB | fwd+bwd / UNAS | step ms | step / UNAS |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for r in results:
        peak = None if r["peak_bytes"] is None else r["peak_bytes"] / 2**20
        lines.append(f"| {r['length']} | {r['scheme']} | {num(r['time_ms'], '.2f')} | {num(peak, '.1f')} | "
                     f"{num(r.get('time_ratio'), '.2f')} | {num(r.get('step_ms'), '.3f')} | "
                     f"{num(r.get('step_ratio'), '.2f')} |")
    lines += ["", "The mixers' sequence forward is the chunked PyTorch form (64 positions a chunk), not a fused "
              "kernel: on the CPU it runs matrix products per chunk and a Python loop over the chunks. GLA's decay per "
              "key feature makes a (chunk x chunk x d_head) tensor of decays in each chunk, which is where its time "
              "goes. Their step "
              "reads a state of fixed size, so its time does not grow with S, while UNAS's grows with the cache. "
              "On CUDA, flash-linear-attention's kernels are the fast path; not measured here."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
