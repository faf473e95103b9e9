"""How long ``nas-report --baseline`` takes on a WMT-sized sweep, against scoring each run once.

Builds a synthetic sweep the size of a WMT14 study (12 configurations = 4 schemes x 3 head
counts, x 5 seeds = 60 runs, 3,000 test sentences of WMT-like length per run, with per-sentence
NLLs), with the files a real run leaves (``summary.json`` with sacreBLEU's corpus BLEU, and
``test_items.json``), then times, as whole processes:

* **score once**: sacreBLEU's corpus BLEU of every run's test set, once (what making the table costs);
* **nas-report**: ``nas-report SWEEP --baseline scheme=unas,heads=4 --format json`` (verdicts over
  seeds, and each paired seed's item-level tests: approximate randomization and bootstrap for
  BLEU and perplexity), with its peak memory (``ru_maxrss``).

    python benchmarks/report_speed.py       # writes docs/bench_report.json and its table in docs/benchmarks.md
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SCHEMES = ("unas", "dnas", "hnas", "coda")
HEADS = (4, 8, 16)


def build(root: Path, seeds: int = 5, sentences: int = 3000, vocab: int = 8000, seed: int = 0) -> list[Path]:
    """The synthetic sweep: one directory per run, each with summary.json and test_items.json."""
    import sacrebleu

    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(vocab)]
    zipf = 1 / np.arange(1, vocab + 1)
    zipf /= zipf.sum()
    lengths = rng.integers(8, 50, size=sentences)
    refs = [" ".join(words[j] for j in rng.choice(vocab, size=n, p=zipf)) for n in lengths]
    ref_tokens = [r.split() for r in refs]
    runs = []
    for c, (scheme, heads) in enumerate((s, h) for s in SCHEMES for h in HEADS):
        for s in range(1, seeds + 1):
            keep = 0.55 + 0.01 * c + rng.normal(0, 0.01)
            hyps = []
            for toks in ref_tokens:
                out = [t if rng.random() < keep else words[rng.integers(vocab)] for t in toks]
                if rng.random() < 0.3 and len(out) > 3:
                    del out[rng.integers(len(out))]
                hyps.append(" ".join(out))
            tokens = [len(t) + 1 for t in ref_tokens]
            nll = [float(n * rng.normal(2.0 - 0.005 * c, 0.3)) for n in tokens]
            run = root / f"{len(runs)}_wmt14_{scheme}-h{heads}"
            run.mkdir(parents=True)
            bleu = sacrebleu.corpus_bleu(hyps, [refs]).score
            ppl = float(np.exp(sum(nll) / sum(tokens)))
            (run / "summary.json").write_text(json.dumps({
                "task": "wmt14", "scheme": scheme, "heads": heads, "seed": s, "steps": 1000,
                "best_val": {"metric": "val/bleu", "value": bleu}, "test": {"test/bleu": bleu, "test/ppl": ppl}}))
            (run / "test_items.json").write_text(json.dumps({
                "task": "wmt14", "kind": "seq2seq", "n": sentences, "index": list(range(sentences)), "nll": nll,
                "tokens": tokens, "hyps": hyps, "refs": refs, "exact": [int(h == r) for h, r in zip(hyps, refs)],
                "text": "as scored", "refs_sha256": "synthetic"}))
            runs.append(run)
    return runs


SCORE_ONCE = """
import json, sys
from pathlib import Path
import sacrebleu
for d in sorted(Path(sys.argv[1]).iterdir()):
    items = json.loads((d / "test_items.json").read_text())
    sacrebleu.corpus_bleu(items["hyps"], [items["refs"]], force=True).score
"""


def timed(cmd: list[str]) -> tuple[float, float, subprocess.CompletedProcess]:
    """(seconds, peak resident MB of the child, result)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {proc.stderr[-2000:]}")
    return seconds, max(peak, before) / 1024, proc


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=str(ROOT / "docs" / "bench_report.json"))
    p.add_argument("--markdown", default=str(ROOT / "docs" / "benchmarks.md"))
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="nas-report-bench-"))
    try:
        load = os.getloadavg()[0]
        t0 = time.time()
        runs = build(tmp / "sweep")
        built = time.time() - t0
        report = str(Path(sys.executable).with_name("nas-report"))
        once, rep, mem = [], [], []
        for _ in range(args.repeats):
            once.append(timed([sys.executable, "-c", SCORE_ONCE, str(tmp / "sweep")])[0])
            s, _, proc = timed([report, str(tmp / "sweep"), "--baseline", "scheme=unas,heads=4", "--format", "json"])
            rep.append(s)
            doc = json.loads(proc.stdout)
        # peak memory of nas-report alone, in a fresh process (ru_maxrss of children is a running max)
        probe = subprocess.run([sys.executable, "-c",
                                "import resource,subprocess,sys; subprocess.run(sys.argv[1:], capture_output=True); "
                                "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)",
                                report, str(tmp / "sweep"), "--baseline", "scheme=unas,heads=4", "--format", "json"],
                               capture_output=True, text=True)
        mem = int(probe.stdout.strip()) / 1024
        result = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                  "python": platform.python_version(), "command": "python benchmarks/report_speed.py",
                  "runs": len(runs), "sentences_per_run": 3000, "load_average_at_start": load, "build_seconds": built,
                  "score_once_seconds": once, "nas_report_seconds": rep, "nas_report_peak_mb": mem,
                  "ratio_median": float(np.median(rep) / np.median(once)),
                  "comparisons": len(doc["comparison"]["rows"]), "item_level_tests": len(doc["test_set"]["rows"])}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    from nas_cli.bench.markdown import write_markdown

    med_once, med_rep = float(np.median(once)), float(np.median(rep))
    section = "\n".join([
        "## nas-report on a WMT-sized sweep (generated)", "",
        f"Generated {result['date']} by `{result['command']}` on {result['machine']} (Python {result['python']}), "
        f"median of {args.repeats} runs each, alternating; 1-minute load average {result['load_average_at_start']:.1f} "
        "at the start (2.0 = both cores busy). "
        f"A synthetic sweep of {len(runs)} runs (4 schemes x 3 head counts x 5 seeds), 3,000 test sentences each: "
        f"nas-report makes {result['comparisons']} verdicts over seeds and {result['item_level_tests']} item-level "
        "comparisons (approximate randomization up to 10,000 trials and a 1,000-resample bootstrap each).", "",
        "| what | seconds (min / median / max) | peak memory |", "|---|---|---|",
        f"| sacreBLEU corpus BLEU of every run once | {min(once):.1f} / {med_once:.1f} / {max(once):.1f} | - |",
        f"| `nas-report <sweep> --baseline scheme=unas,heads=4 --format json` | {min(rep):.1f} / {med_rep:.1f} / "
        f"{max(rep):.1f} | {mem:.0f} MB |", "",
        f"nas-report takes **{result['ratio_median']:.2f}x** the time of scoring each run once (target: within 2x, "
        "under 500 MB).", ""])
    write_markdown(Path(args.markdown), section)
    print(section)


if __name__ == "__main__":
    main()
