"""A CPU sweep's wall time against the ideal: the README's grid
``nas-run -m attention=unas,dnas,hnas model.heads=4,8 seed=1,2,3`` (18 jobs of the default job's size).

    python benchmarks/sweep_parallel.py                  # docs/bench_sweep.json + a section of docs/benchmarks.md
    python benchmarks/sweep_parallel.py --steps 300 --repeats 2
    python benchmarks/sweep_parallel.py --steps 300 --more   # one more repeat, added to the file's

Three launches of the same grid, each a real ``nas-run -m`` timed as a whole process (wall, and user +
system CPU of it and its children):

* ``default``: what ``nas-run -m`` does (on the CPU: the jobs several at a time, one thread each);
* ``one at a time, 1 thread``: ``hydra/launcher=basic threads=1``: its wall is the sum of the jobs'
  single-thread times (and one start-up), so the ideal is that wall divided by the CPUs allowed;
* ``one at a time, every CPU``: ``hydra/launcher=basic threads=<CPUs>``, the sequential launcher with
  every core per job, as nas-run ran sweeps before.

``logger=none diagnostics.enabled=false run_test=false progress_bar=false`` and ``--steps`` steps per job
(the default job's model and task; its validation every 100 steps).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from nas_cli.bench.markdown import write_markdown  # noqa: E402
from nas_cli.bench.timing import timed_run  # noqa: E402

NAS_RUN = shutil.which("nas-run") or str(Path(sys.executable).parent / "nas-run")
GRID = ("attention=unas,dnas,hnas", "model.heads=4,8", "seed=1,2,3")
COMMON = ("logger=none", "diagnostics.enabled=false", "run_test=false", "progress_bar=false")


def cpus() -> int:
    return len(os.sched_getaffinity(0))


def launches() -> dict[str, list[str]]:
    return {"default": [], "one at a time, 1 thread": ["hydra/launcher=basic", "threads=1"],
            "one at a time, every CPU": ["hydra/launcher=basic", f"threads={cpus()}"]}


def run_sweep(extra: list[str], steps: int) -> dict:
    """One ``nas-run -m`` of the grid; its wall and CPU seconds and what the jobs recorded."""
    env = {k: v for k, v in os.environ.items() if k not in ("NAS_RUN_SWEEP_JOBS", "OMP_NUM_THREADS")}
    with tempfile.TemporaryDirectory() as tmp:
        args = [NAS_RUN, "-m", *GRID, f"trainer.max_steps={steps}", *COMMON, *extra, f"hydra.sweep.dir={tmp}/s"]
        proc, wall, cpu = timed_run(args, env, tmp)
        summaries = [json.loads(p.read_text()) for p in Path(tmp, "s").glob("*/summary.json")]
    at_a_time = next((ln for ln in proc.stdout.splitlines() + proc.stderr.splitlines() if "at a time on" in ln), "")
    return {"extra": extra, "jobs": len(summaries), "wall_s": wall,
            "cpu_s": cpu,
            "threads": sorted({s["environment"]["threads"] for s in summaries}), "said": at_a_time.strip(),
            "fit_s_sum": sum(s["fit_seconds"] for s in summaries)}


def table(rows: dict[str, list[dict]]) -> str:
    ideal = statistics.mean(r["wall_s"] for r in rows["one at a time, 1 thread"]) / cpus()
    lines = ["| launch | jobs | threads per job | wall (each repeat) | wall / ideal | CPU |",
             "|---|---:|---:|---|---:|---:|"]
    for name, rs in rows.items():
        wall = statistics.mean(r["wall_s"] for r in rs)
        each = ", ".join(f"{r['wall_s']:.0f} s" for r in rs)
        lines.append(f"| {name} | {rs[0]['jobs']} | {', '.join(map(str, rs[0]['threads']))} | "
                     f"{each} | {wall / ideal:.2f}x | "
                     f"{statistics.mean(r['cpu_s'] for r in rs):.0f} s |")
    mean = {name: {k: statistics.mean(r[k] for r in rs) for k in ("wall_s", "cpu_s")} for name, rs in rows.items()}
    default, one, every = mean["default"], mean["one at a time, 1 thread"], mean["one at a time, every CPU"]
    return "\n".join(lines) + (
        f"\n\nIdeal: the one-thread sequential wall / {cpus()} CPUs = {ideal:.0f} s. The default used "
        f"{default['cpu_s'] / one['cpu_s'] - 1:+.0%} CPU against the one-thread sequential sweep (the rest of its "
        f"distance to the ideal: each joblib worker imports torch and Lightning once, and jobs side by side share "
        f"the memory bandwidth); the sequential launcher with every core per job, as before, took "
        f"{every['wall_s'] / default['wall_s']:.2f}x the default's wall and {every['cpu_s'] / default['cpu_s'] - 1:+.0%} CPU.")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out-json", type=Path, default=ROOT / "docs" / "bench_sweep.json")
    ap.add_argument("--out-md", type=Path, default=ROOT / "docs" / "benchmarks.md")
    ap.add_argument("--more", action="store_true", help="add the repeats to those --out-json holds (same --steps)")
    args = ap.parse_args(argv)
    rows: dict[str, list[dict]] = {name: [] for name in launches()}
    command = " ".join(["python", "benchmarks/sweep_parallel.py", *(argv if argv is not None else sys.argv[1:])])
    done = 0
    if args.more and args.out_json.is_file():
        earlier = json.loads(args.out_json.read_text())
        if earlier["steps"] != args.steps:
            ap.error(f"--more: {args.out_json} holds sweeps of {earlier['steps']} steps a job, not {args.steps}")
        rows, done, command = earlier["rows"], earlier["repeats_done"], earlier["command"]
    for repeat in range(done, done + args.repeats):  # interleaved: a slow patch of the machine hits every launch alike
        for name, extra in launches().items():
            r = run_sweep(extra, args.steps)
            print(json.dumps({"launch": name, **r}), flush=True)
            rows[name].append(r)
        write(args, command, rows, repeat + 1)  # each finished repeat is kept
    print(table(rows))
    return 0


def write(args, command: str, rows: dict[str, list[dict]], repeats: int) -> None:
    machine = {"cpus": os.cpu_count(), "cpus_allowed": cpus(), "machine": platform.machine(),
               "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M")}
    args.out_json.write_text(json.dumps({"machine": machine, "command": command, "grid": GRID, "steps": args.steps,
                                         "repeats_done": repeats, "rows": rows}, indent=2))
    section = (f"## A CPU sweep against the ideal (benchmarks/sweep_parallel.py)\n\n`{command}` on {cpus()} CPUs "
               f"({machine['date']}, {repeats} repeat{'s' * (repeats > 1)}): the README's grid "
               f"`nas-run -m {' '.join(GRID)}`, {args.steps} steps per job, whole-process times. The default launch "
               f"said: \"{rows['default'][0]['said']}\".\n\n{table(rows)}\n")
    write_markdown(args.out_md, section)


if __name__ == "__main__":
    raise SystemExit(main())
