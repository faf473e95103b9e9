"""``debug=fast`` on every preset in conf/experiment whose data this machine has: the wall time of the
whole command as a user types it (start, data, 20 training steps, 2 validations, the test), against
the budget the README promises.

A preset is run when its data is here: a task that generates its data (the built-in tasks), or a
task that reads files whose preset documents a ``task.path=`` under the project's shared data
(``#   nas-run experiment=multi30k_cpu task.path=../shared/data/multi30k/raw``) that exists. The
others (IWSLT14, WMT14, WikiText-103, Gigaword: data not shipped) are listed with the reason.

Each preset runs ``--repeats`` times as ``nas-run debug=fast experiment=<preset> [task.path=...]``
in a fresh directory (W&B offline, as by default), one after another; the median wall time is
compared with ``--budget`` and the command exits 1 when a preset is over it.

    python benchmarks/debug_fast.py                     # docs/bench_debug_fast.json + docs/benchmarks.md
    python benchmarks/debug_fast.py --presets multi30k_cpu --repeats 1
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRESETS = ROOT / "conf" / "experiment"
OUT = ROOT / "docs" / "bench_debug_fast.json"
MARKDOWN = ROOT / "docs" / "benchmarks.md"
BUDGET_S = 40.0
_PATH = re.compile(r"task\.path=(\S+)")


def _reads_files(preset: str) -> bool:
    """Whether the preset's task reads its data from files (it has a ``task.path``)."""
    from hydra import compose, initialize_config_dir

    from nas_cli.model.choices import CONF_DIR
    from nas_cli.pipeline.launch.resolvers import register_resolvers

    register_resolvers()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={preset}"])
    return "path" in cfg.task


def documented_path(preset: str) -> str | None:
    """The ``task.path=`` of the preset's own example command (its comment lines), if it names one."""
    for line in (PRESETS / f"{preset}.yaml").read_text().splitlines():
        if line.lstrip().startswith("#") and "nas-run" in line and f"experiment={preset}" in line:
            found = _PATH.search(line)
            if found:
                return found.group(1)
    return None


def local_presets() -> tuple[list[tuple[str, list[str]]], dict[str, str]]:
    """The presets whose data is here, each with the overrides that point it there, and the others
    with the reason: ``([("multi30k_cpu", ["task.path=/abs/.../multi30k/raw"]), ...], {"iwslt14": why})``."""
    runnable, skipped = [], {}
    for file in sorted(PRESETS.glob("*.yaml")):
        preset = file.stem
        if not _reads_files(preset):
            runnable.append((preset, []))
            continue
        path = documented_path(preset)
        if path is None:
            skipped[preset] = "its example command names no task.path (its data is not shipped)"
            continue
        where = (ROOT / path).resolve()
        if not where.is_dir():
            skipped[preset] = f"its data is not on this machine ({path})"
            continue
        runnable.append((preset, [f"task.path={where}"]))
    return runnable, skipped


def command(preset: str, overrides: list[str]) -> list[str]:
    return ["nas-run", "debug=fast", f"experiment={preset}", *overrides]


def run_once(preset: str, overrides: list[str]) -> dict:
    """One ``debug=fast`` run of the preset in a fresh directory: wall seconds and what it did."""
    with tempfile.TemporaryDirectory(prefix="debug-fast-") as tmp:
        cmd = command(preset, overrides) + ["hydra.run.dir=run"]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"{shlex.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        summary = json.loads((Path(tmp) / "run" / "summary.json").read_text())
        items = Path(tmp) / "run" / "test_items.json"
        tested = json.loads(items.read_text())["n"] if items.is_file() else None
    return {"preset": preset, "wall": wall, "fit_seconds": summary["fit_seconds"], "steps": summary["steps"],
            "test_items": tested, "parameters": summary["parameters"]}


def summarise(rows: list[dict], budget: float) -> list[dict]:
    out = []
    for preset in dict.fromkeys(r["preset"] for r in rows):
        mine = [r for r in rows if r["preset"] == preset]
        wall = statistics.median(r["wall"] for r in mine)
        out.append({"preset": preset, "repeats": len(mine), "wall": wall, "max_wall": max(r["wall"] for r in mine),
                    "fit_seconds": statistics.median(r["fit_seconds"] for r in mine), "steps": mine[0]["steps"],
                    "test_items": mine[0]["test_items"], "parameters": mine[0]["parameters"], "met": wall <= budget})
    return out


def markdown(data: dict) -> str:
    lines = ["## debug=fast on every preset with local data (benchmarks/debug_fast.py)", "",
             f"`{data['command']}` on {data['machine']}, {data['date']}: `nas-run debug=fast experiment=<preset>` "
             "(with the preset's documented `task.path`), each in a fresh directory with W&B offline, the whole "
             "command timed (start, data, tokenizer, 20 training steps of at most 16 items, 2 validations and the "
             f"test of at most 2 batches of 16). Median of {data['summary'][0]['repeats'] if data['summary'] else 0} "
             f"runs; budget {data['budget']:.0f} s.", "",
             "| preset | wall (median) | slowest | training | test items | parameters | within budget |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for s in data["summary"]:
        lines.append(f"| {s['preset']} | {s['wall']:.1f} s | {s['max_wall']:.1f} s | {s['fit_seconds']:.1f} s | "
                     f"{s['test_items'] if s['test_items'] is not None else '-'} | {s['parameters']:,} | "
                     f"{'yes' if s['met'] else '**no**'} |")
    if data["skipped"]:
        lines += ["", "Not run here: " + "; ".join(f"{k}: {v}" for k, v in data["skipped"].items()) + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", help="comma-separated presets (default: every one whose data is here)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds a preset may take (median)")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--markdown", default=str(MARKDOWN))
    parser.add_argument("--table-only", action="store_true", help="rewrite the table from --out's JSON, no run")
    args = parser.parse_args(argv)
    from nas_cli.bench.markdown import write_markdown

    out = Path(args.out)
    if args.table_only:
        data = json.loads(out.read_text())
        write_markdown(Path(args.markdown), markdown(data))
        return 0 if all(s["met"] for s in data["summary"]) else 1
    runnable, skipped = local_presets()
    if args.presets:
        wanted = args.presets.split(",")
        unknown = sorted(set(wanted) - {p for p, _ in runnable})
        if unknown:
            parser.error(f"--presets: {', '.join(unknown)} cannot run here (known here: "
                         f"{', '.join(p for p, _ in runnable)})")
        runnable = [(p, o) for p, o in runnable if p in wanted]
    rows: list[dict] = []
    data = {"command": "python benchmarks/debug_fast.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "date": time.strftime("%Y-%m-%d %H:%M"),
            "budget": args.budget, "rows": rows, "summary": [], "skipped": skipped}
    for _ in range(args.repeats):
        for preset, overrides in runnable:
            rows.append(run_once(preset, overrides))
            print(json.dumps(rows[-1]), flush=True)
            data["summary"] = summarise(rows, args.budget)
            out.write_text(json.dumps(data, indent=1) + "\n")  # each finished run is kept
    write_markdown(Path(args.markdown), markdown(data))
    over = [s["preset"] for s in data["summary"] if not s["met"]]
    if over:
        print(f"over the {args.budget:.0f} s budget: {', '.join(over)}", file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
