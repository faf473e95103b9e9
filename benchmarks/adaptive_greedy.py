"""The adaptive softmax's greedy words: PyTorch's ``AdaptiveLogSoftmaxWithLoss.predict``, which builds the
full (positions x vocabulary) log-probabilities for every position whose head prefers a cluster, against
``nas_cli.model.scoring.adaptive_greedy``, which scores a cluster only where it can beat the best word
found so far, in cache-sized chunks. WikiText-2's setting (33,278 words, cutoffs 2,000 and 10,000,
div_value 4, d_model 128), 4,096 positions, one thread; the head's cluster logits raised along the mean
hidden state by ``favour`` so that a growing share of the greedy words comes from the tails, as in a
trained model. Both must give the same tokens (checked on every row).

    python benchmarks/adaptive_greedy.py          # docs/bench_adaptive_greedy.json + docs/benchmarks.md
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "bench_adaptive_greedy.json"
MARKDOWN = ROOT / "docs" / "benchmarks.md"
VOCAB, CUTOFFS, D_MODEL, POSITIONS = 33278, [2000, 10000], 128, 4096


def _timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(favour: float, repeats: int) -> dict:
    from nas_cli.model.scoring import adaptive_greedy

    torch.manual_seed(0)
    layer = torch.nn.AdaptiveLogSoftmaxWithLoss(D_MODEL, VOCAB, CUTOFFS, div_value=4.0)
    h = torch.randn(POSITIONS, D_MODEL)
    with torch.no_grad():
        layer.head.weight[CUTOFFS[0]:] += favour * h.mean(0) / h.mean(0).norm() ** 2
        reference, ours = layer.predict(h), adaptive_greedy(layer, h)
        if not torch.equal(reference, ours):
            raise SystemExit(f"favour {favour}: adaptive_greedy's tokens differ from predict's")
        return {"favour": favour, "tail_share": float((reference >= CUTOFFS[0]).float().mean()),
                "predict_s": _timed(lambda: layer.predict(h), repeats),
                "greedy_s": _timed(lambda: adaptive_greedy(layer, h), repeats)}


def markdown(data: dict) -> str:
    lines = ["## The adaptive softmax's greedy words (benchmarks/adaptive_greedy.py)", "",
             f"`{data['command']}` on {data['machine']}, torch {data['torch']}, one thread, {data['date']}: "
             f"{POSITIONS:,} positions, {VOCAB:,} words, cutoffs {CUTOFFS}, d_model {D_MODEL}; median of "
             f"{data['repeats']} runs. Same tokens on every row in every case.", "",
             "| words from the tails | PyTorch's predict | adaptive_greedy | speed-up |", "|---:|---:|---:|---:|"]
    for r in data["rows"]:
        lines.append(f"| {100 * r['tail_share']:.0f}% | {r['predict_s']:.3f} s | {r['greedy_s']:.3f} s | "
                     f"{r['predict_s'] / r['greedy_s']:.1f}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--markdown", default=str(MARKDOWN))
    args = parser.parse_args(argv)
    from nas_cli.bench.markdown import write_markdown

    torch.set_num_threads(1)
    typed = argv if argv is not None else sys.argv[1:]
    data = {"command": " ".join(["python benchmarks/adaptive_greedy.py", *typed]),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M"), "repeats": args.repeats,
            "rows": [measure(favour, args.repeats) for favour in (0.0, 2.0, 5.0)]}
    Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    write_markdown(Path(args.markdown), markdown(data))
    print(markdown(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
