"""Attention schemes side by side on Multi30k de->en (a benchmark, not a test).

    python benchmarks/scheme_comparison.py                       # the nine schemes below
    python benchmarks/scheme_comparison.py --schemes unas,dnas   # a subset (merged into the results)

Every scheme trains with ``experiment=multi30k_compare`` (same data, seed, model and number of
updates), one after another in fresh ``nas-run`` processes, and is scored on
``test_2016_flickr`` (sacreBLEU, greedy). Mean JSD between heads (Zheng et al. 2021) comes from
the run's diagnostics at the last validation, averaged over layers per attention location
(encoder self-, decoder self-, cross-attention) and over the three locations. tokens/s is the
training throughput nas-run measured in the same run. A run that stops (e.g. the linear kernel
diverging) is recorded with its one-line reason.

Writes docs/bench_schemes.json and the section "## Scheme comparison on Multi30k" of
docs/benchmarks.md, and says whether CODA's JSD ordering (CODA > CODA-CS > RealFormer >
Transformer) holds here.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from nas_cli.bench.markdown import write_markdown

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
RESULTS = DOCS / "bench_schemes.json"
SECTION = "## Scheme comparison on Multi30k (benchmarks/scheme_comparison.py)"
SCHEMES = ["unas", "dnas", "hnas", "coda", "coda_cs", "realformer", "kernel_linear", "kernel_poly", "kernel_rbf"]
LOCATIONS = ("encoder", "decoder", "cross")
ORDER = ("coda", "coda_cs", "realformer", "unas")  # Zheng et al.: JSD decreases along this list


def run_scheme(scheme: str, data: Path, out_root: Path, extra: list[str]) -> dict:
    run_dir = out_root / scheme
    cmd = [str(Path(sys.executable).parent / "nas-run"), "experiment=multi30k_compare", f"task.path={data}",
           f"attention={scheme}", "seed=1", "logger=csv", "progress_bar=false", f"hydra.run.dir={run_dir}", *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    row = {"scheme": scheme, "command": " ".join(["nas-run", *cmd[1:]]), "wall_s": wall,
           "run_dir": str(run_dir.relative_to(ROOT)) if run_dir.is_relative_to(ROOT) else str(run_dir)}
    if proc.returncode != 0 or not (run_dir / "summary.json").exists():
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        lines = [line for line in lines if "HYDRA_FULL_ERROR" not in line]
        reason = next((line for line in lines if line.startswith("nas-run: ")), lines[-1] if lines else "?")
        row.update(status="stopped", reason=reason.removeprefix("nas-run: ").strip())
        return row
    summary = json.loads((run_dir / "summary.json").read_text())
    diag = json.loads((run_dir / "diagnostics" / "summary.json").read_text())
    # None where a location's weights were not distributions (a linear kernel's negative weights)
    jsd = {loc: diag["locations"][loc]["jsd_mean"] for loc in LOCATIONS
           if "jsd_mean" in diag["locations"].get(loc, {})}
    notes = {diag["locations"][loc]["note"] for loc in LOCATIONS if diag["locations"].get(loc, {}).get("note")}
    row.update(status="ok", bleu=summary["test"]["test/bleu"], test_ppl=summary["test"]["test/ppl"],
               tokens_per_s=summary["tokens_per_s"], steps=summary["steps"], parameters=summary["parameters"],
               fit_s=summary["fit_seconds"], jsd=jsd, jsd_mean=sum(jsd.values()) / len(jsd) if jsd and None not in jsd.values() else None,
               jsd_note="; ".join(sorted(notes)) or None, bleu_signature=summary.get("bleu_signature"),
               when=time.strftime("%Y-%m-%d %H:%M"))
    return row


def ordering(rows: dict) -> str:
    have = [s for s in ORDER if rows.get(s, {}).get("status") == "ok"]
    if len(have) < len(ORDER):
        return "not checked (missing: " + ", ".join(s for s in ORDER if s not in have) + ")"
    vals = [rows[s]["jsd_mean"] for s in ORDER]
    pairs = [f"{a} {'>' if x > y else '<='} {b}" for a, b, x, y in zip(ORDER, ORDER[1:], vals, vals[1:])]
    holds = all(x > y for x, y in zip(vals, vals[1:]))
    return ("**holds**" if holds else "**does not hold**") + " (" + ", ".join(pairs) + ")"


def write(results: dict) -> None:
    rows = results["rows"]
    lines = [SECTION, "",
             f"{results['when']}, {results['machine']}. Every scheme: `experiment=multi30k_compare` "
             "(d_model 128, 4 heads, 3+3 layers, FFN 512, joint BPE 8k, ~3,072-token batches, "
             f"{results['steps']} updates, seed 1), test_2016_flickr with greedy decoding. JSD = mean "
             "Jensen-Shannon divergence between the heads' attention distributions (Zheng et al. 2021), "
             "averaged over layers, at the last validation; `mean` averages the three locations. "
             "tokens/s = training tokens (source + target, no padding) per second of training steps, "
             "machine shared with other work, so compare with care. Raw numbers: `docs/bench_schemes.json`.",
             "", "| scheme | status | test sacreBLEU | test ppl | JSD enc | JSD dec | JSD cross | JSD mean | tokens/s |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for scheme in results["order"]:
        r = rows[scheme]
        if r["status"] != "ok":
            lines.append(f"| {scheme} | stopped: {r['reason']} | - | - | - | - | - | - | - |")
            continue
        j = r["jsd"]
        cell = lambda k: "-" if k not in j else "n/a" if j[k] is None else f"{j[k]:.3f}"  # noqa: E731
        mean = "n/a" if r["jsd_mean"] is None else f"{r['jsd_mean']:.3f}"
        lines.append(f"| {scheme} | ok | {r['bleu']:.2f} | {r['test_ppl']:.2f} | {cell('encoder')} | "
                     f"{cell('decoder')} | {cell('cross')} | {mean} | {r['tokens_per_s']:.0f} |")
    notes = [f"{s}: {rows[s]['jsd_note']}" for s in results["order"] if rows[s].get("jsd_note")]
    if notes:
        lines += ["", "n/a: " + "; ".join(notes) + "."]
    lines += ["", f"CODA's ordering of head diversity, CODA > CODA-CS > RealFormer > Transformer (UNAS), by mean "
              f"JSD: {ordering(rows)}.", ""]
    write_markdown(DOCS / "benchmarks.md", "\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "multi30k" / "raw")
    ap.add_argument("overrides", nargs="*", help="extra nas-run overrides for every scheme")
    args = ap.parse_args()
    if not args.data.is_dir():
        raise SystemExit(f"--data {args.data} is not a directory (see ../shared/data/DATA.md)")
    import torch

    old = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"rows": {}}
    out_root = ROOT / "outputs" / "bench" / f"schemes-{time.strftime('%Y%m%d-%H%M%S')}"
    for scheme in args.schemes.split(","):
        row = run_scheme(scheme, args.data, out_root, args.overrides)
        old["rows"][scheme] = row
        print(json.dumps({k: v for k, v in row.items() if k != "command"}), flush=True)
        results = {**old, "when": time.strftime("%Y-%m-%d %H:%M"), "steps": 450 if not args.overrides else
                   next((o.split("=")[1] for o in args.overrides if o.startswith("trainer.max_steps=")), 450),
                   "machine": f"{platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}",
                   "order": [s for s in SCHEMES if s in old["rows"]] + [s for s in old["rows"] if s not in SCHEMES]}
        DOCS.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps(results, indent=2))
        write(results)


if __name__ == "__main__":
    main()
