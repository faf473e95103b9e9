"""CPU threads: the default job's wall and CPU time per step under nas-run's thread policy against fixed
thread counts, on a quiet machine and beside CPU-bound processes, and where a second thread starts to
pay (the model size behind ``ONE_THREAD_BELOW`` in nas_cli/pipeline/trainer.py).

    python benchmarks/threads.py                      # docs/bench_threads.json + a section of docs/benchmarks.md
    python benchmarks/threads.py --steps 60 --quick   # fewer cases

Each case is a real ``nas-run`` (``logger=none diagnostics.enabled=false run_test=false``), timed as a
whole process (wall, and user + system CPU of the process and its children); time per step is the
process's time over the steps, so the start-up (imports, data) is in it, alike for every case of a size.
The busy processes are ``python -c 'while True: pass'``, one per CPU-bound neighbour.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.markdown import write_markdown  # noqa: E402
from benchmarks.timing import timed_run  # noqa: E402

NAS_RUN = shutil.which("nas-run") or str(Path(sys.executable).parent / "nas-run")
COMMON = ("logger=none", "diagnostics.enabled=false", "run_test=false", "progress_bar=false",
          "trainer.val_check_interval=null", "trainer.check_val_every_n_epoch=1000")


def run_case(model: str, steps: int, threads: str | None, busy: int, env_extra: dict | None = None) -> dict:
    """One nas-run, beside ``busy`` CPU-bound processes; its wall and CPU seconds."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        time.sleep(0.5 if busy else 0)
        with tempfile.TemporaryDirectory() as tmp:
            args = [NAS_RUN, f"model={model}", f"trainer.max_steps={steps}", *COMMON, f"hydra.run.dir={tmp}/run"]
            if threads is not None:
                args.append(f"threads={threads}")
            env = {**os.environ, **(env_extra or {})}
            _, wall, cpu = timed_run(args, env, tmp)
            summary = json.loads((Path(tmp) / "run" / "summary.json").read_text())
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    return {"model": model, "steps": steps, "threads_setting": threads or "default policy", "busy": busy,
            "threads_used": summary["environment"]["threads"], "parameters": summary["parameters"],
            "wall_s": wall, "cpu_s": cpu, "wall_per_step_ms": 1000 * wall / steps, "cpu_per_step_ms": 1000 * cpu / steps,
            "env": env_extra or {}}


def cases(steps: int, quick: bool) -> list[tuple]:
    out = [("tiny", steps, None, 0), ("tiny", steps, "1", 0), ("tiny", steps, "2", 0),
           ("tiny", steps, None, 1), ("tiny", steps, "2", 1),
           ("tiny", steps, None, 2), ("tiny", steps, "1", 2), ("tiny", steps, "2", 2)]
    active = {"OMP_WAIT_POLICY": "ACTIVE"}  # OpenMP's spinning wait, as before nas-run chose PASSIVE
    out += [("tiny", steps, "2", 2, active)]
    if not quick:
        small, base = max(10, steps // 3), max(5, steps // 10)
        out += [("small", small, "1", 0), ("small", small, "2", 0), ("small", small, "2", 0, active),
                ("base", base, "1", 0), ("base", base, "2", 0), ("base", base, "2", 0, active),
                ("base", base, "2", 1), ("base", base, "2", 1, active)]
    return out


def table(results: list[dict]) -> str:
    quiet = {(r["model"], r["threads_setting"]): r for r in results if r["busy"] == 0 and not r["env"]}
    lines = ["| model (parameters) | threads setting (used) | OpenMP wait | busy neighbours | wall / step | CPU / step | "
             "CPU / step vs quiet, 1 thread |", "|---|---|---|---:|---:|---:|---:|"]
    for r in results:
        ref = quiet.get((r["model"], "1"))
        ratio = f"{r['cpu_per_step_ms'] / ref['cpu_per_step_ms']:.2f}x" if ref else "-"
        wait = r["env"].get("OMP_WAIT_POLICY", "PASSIVE").lower()
        lines.append(f"| {r['model']} ({r['parameters']:,}) | {r['threads_setting']} ({r['threads_used']}) | {wait} | "
                     f"{r['busy']} | {r['wall_per_step_ms']:.0f} ms | {r['cpu_per_step_ms']:.0f} ms | {ratio} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--quick", action="store_true", help="the default job's cases only")
    ap.add_argument("--out-json", type=Path, default=ROOT / "docs" / "bench_threads.json")
    ap.add_argument("--out-md", type=Path, default=ROOT / "docs" / "benchmarks.md")
    args = ap.parse_args(argv)
    results = []
    for case in cases(args.steps, args.quick):
        r = run_case(*case)
        print(json.dumps(r), flush=True)
        results.append(r)
    machine = {"cpus": os.cpu_count(), "cpus_allowed": len(os.sched_getaffinity(0)), "machine": platform.machine(),
               "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M")}
    args.out_json.write_text(json.dumps({"machine": machine, "command": " ".join(["python", *sys.argv]),
                                         "results": results}, indent=2))
    section = (f"## CPU threads (benchmarks/threads.py)\n\n`{' '.join(['python', 'benchmarks/threads.py', *(argv or sys.argv[1:])])}`"
               f" on {machine['cpus']} CPUs ({machine['date']}); one run per case, whole-process times "
               f"(start-up included). Busy neighbours: CPU-bound processes beside the run.\n\n{table(results)}\n")
    write_markdown(args.out_md, section)
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
