"""Benchmarks of the real-task pipeline on this machine (not tests).

    python benchmarks/real_tasks.py pipeline           # tokenizing + batching, cold vs cached
    python benchmarks/real_tasks.py multi30k           # experiment=multi30k_cpu, BLEU on test_2016_flickr
    python benchmarks/real_tasks.py wikitext2          # experiment=wikitext2_cpu, full test perplexity

Each writes docs/bench_real_tasks.json (merged by key) and the section
"## Real tasks" of docs/benchmarks.md. Data: ../shared/data (see DATA.md) or --data DIR.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nas_cli.bench.markdown import write_markdown

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
RESULTS = DOCS / "bench_real_tasks.json"
SECTION = "## Real tasks (benchmarks/real_tasks.py)"


def machine() -> str:
    import torch

    return f"{platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}, threads {torch.get_num_threads()}"


def pipeline(data: Path) -> dict:
    """Time reading + tokenizer training/loading + encoding + one pass over the train batches."""
    code = r"""
import json, sys, time
from tasks.translation import TranslationTask
from tasks.language_model import LanguageModelTask
data = sys.argv[1]
out = {}
for name, make in (
    ("multi30k", lambda: TranslationTask("multi30k", "de", "en", path=f"{data}/multi30k/raw", vocab_size=8000,
                                          splits={"valid": "val", "test": "test_2016_flickr"}, max_tokens=6144)),
    ("wikitext2", lambda: LanguageModelTask("wikitext2", path=f"{data}/wikitext-2", tokens_per_sample=128, context_window=96, batch_size=16)),
):
    task = make()
    t0 = time.perf_counter(); task.setup(); setup = time.perf_counter() - t0
    t0 = time.perf_counter(); n = sum(1 for _ in task.train_dataloader()); batching = time.perf_counter() - t0
    out[name] = {"setup_s": setup, **task.timings, "tokenizer_cached": task.tokenizer_cached,
                 "train_batches": n, "batching_s": batching}
print(json.dumps(out))
"""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "NAS_RUN_CACHE": cache}
        runs = []
        for _ in range(2):  # cold (trains the tokenizers), then warm (loads them from the cache)
            proc = subprocess.run([sys.executable, "-c", code, str(data)], env=env, capture_output=True, text=True,
                                  cwd=ROOT)
            if proc.returncode:
                raise SystemExit(proc.stderr[-3000:])
            runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return {"cold": runs[0], "warm": runs[1]}


def train_preset(name: str, preset: str, data_path: Path, extra: list[str]) -> dict:
    run_dir = ROOT / "outputs" / "bench" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    cmd = [str(Path(sys.executable).parent / "nas-run"), f"experiment={preset}", f"task.path={data_path}",
           "logger=csv", "progress_bar=false", f"hydra.run.dir={run_dir}", *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"command": " ".join(["nas-run", *cmd[1:]]), "wall_s": wall, "fit_s": summary["fit_seconds"],
            "steps": summary["steps"], "parameters": summary["parameters"], "tokens_per_s": summary["tokens_per_s"],
            "test": summary["test"], "best_val": summary["best_val"], "bleu_signature": summary.get("bleu_signature"),
            "run_dir": str(run_dir.relative_to(ROOT))}


def write(results: dict) -> None:
    DOCS.mkdir(exist_ok=True)
    old = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    old.update(results)
    old["machine"] = machine()
    RESULTS.write_text(json.dumps(old, indent=2))
    lines = [SECTION, "", f"Machine: {old['machine']}. Raw numbers: `docs/bench_real_tasks.json`.", ""]
    if "pipeline" in old:
        lines += ["| data pipeline | cold: setup s (read / tokenizer / encode) | warm: setup s (tokenizer cached) | "
                  "train batches (pass s) |", "|---|---|---|---|"]
        for task in ("multi30k", "wikitext2"):
            c, w = old["pipeline"]["cold"][task], old["pipeline"]["warm"][task]
            lines.append(f"| {task} | {c['setup_s']:.1f} ({c['read_s']:.1f} / {c['tokenizer_s']:.1f} / {c['encode_s']:.1f}) "
                         f"| {w['setup_s']:.1f} ({w['tokenizer_cached']}) | {c['train_batches']} ({c['batching_s']:.1f}) |")
        lines.append("")
    rows = [(k, old[k]) for k in ("multi30k", "multi30k_epoch0_order", "wikitext2", "wikitext2_epoch0_order")
            if k in old]
    if rows:
        lines += ["| run | target | result | training time | steps | tokens/s | command |", "|---|---|---|---|---|---|---|"]
        for key, r in rows:
            if key.startswith("multi30k"):
                target, result = "sacreBLEU >= 30 in <= 45 min", (f"sacreBLEU {r['test']['test/bleu']:.2f} "
                                                                 f"(tok. BLEU {r['test']['test/bleu_tok']:.2f})")
            else:
                target, result = "test ppl <= 170 in <= 30 min", f"test ppl {r['test']['test/ppl']:.1f}"
            lines.append(f"| {key} | {target} | {result} | {r['fit_s'] / 60:.1f} min | {r['steps']} | "
                         f"{r['tokens_per_s']:.0f} | `{r['command']}` |")
        lines += ["", "`*_epoch0_order`: trained by a trainer whose every epoch replayed epoch 0's batch order (the "
                  "code of 2026-11-23); budget `trainer.max_time`. The rows without the suffix are from today's "
                  "trainer, which draws a new order each epoch, with the same number of optimizer steps "
                  "(`trainer.max_steps` = the other row's steps, `trainer.max_time=null`), so the two differ only in "
                  "the data order; their training time is wall clock on a machine that was also running the test suite."]
        lines.append("")
    write_markdown(DOCS / "benchmarks.md", "\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["pipeline", "multi30k", "wikitext2", "render"],
                    help="render: rewrite the markdown section from docs/bench_real_tasks.json")
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("overrides", nargs="*", help="extra nas-run overrides")
    args = ap.parse_args()
    if not args.data.is_dir():
        raise SystemExit(f"--data {args.data} is not a directory (see DATA.md)")
    if args.what == "render":
        write({})
    elif args.what == "pipeline":
        write({"pipeline": pipeline(args.data)})
    elif args.what == "multi30k":
        write({"multi30k": train_preset("multi30k", "multi30k_cpu", args.data / "multi30k" / "raw", args.overrides)})
    else:
        write({"wikitext2": train_preset("wikitext2", "wikitext2_cpu", args.data / "wikitext-2", args.overrides)})


if __name__ == "__main__":
    main()
