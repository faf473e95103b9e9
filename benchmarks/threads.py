"""CPU threads: the default job's wall and CPU time per step under nas-run's thread policy against fixed
thread counts, on a quiet machine and beside CPU-bound processes, and where a second thread starts to
pay (the model size behind ``ONE_THREAD_BELOW`` in nas_cli/pipeline/trainer.py).

    python benchmarks/threads.py                      # docs/bench_threads.json + a section of docs/benchmarks.md
    python benchmarks/threads.py --steps 60 --quick   # the default job's cases only (the others keep their saved rows)
    python benchmarks/threads.py --steps 100 --quick --repeats 5   # each case 5 times, interleaved

Each case is a real ``nas-run`` (``logger=none diagnostics.enabled=false run_test=false``), timed as a
whole process (wall, and user + system CPU of the process and its children); time per step is the
process's time over the steps, so the start-up (imports, data) is in it, alike for every case of a size.
The busy processes are ``python -c 'while True: pass'``, one per CPU-bound neighbour. With ``--repeats``
the cases run in rounds (every case once per round), so a slow spell of the machine falls on all of them
alike; the spinning-wait cases (``OMP_WAIT_POLICY=ACTIVE``, minutes each beside busy neighbours) run once.
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
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from nas_cli.bench.markdown import write_markdown  # noqa: E402
from nas_cli.bench.timing import timed_run  # noqa: E402

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


def _key(r: dict) -> tuple:
    return (r["model"], r["threads_setting"], r["busy"], r["env"].get("OMP_WAIT_POLICY", "PASSIVE").lower())


def _groups(results: list[dict]) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = {}
    for r in results:
        out.setdefault(_key(r), []).append(r)
    return out


def _spread(values: list[float]) -> str:
    mid = statistics.median(values)
    return f"{mid:.0f} ms" if len(values) == 1 else f"{mid:.0f} ms ({min(values):.0f}-{max(values):.0f})"


def table(results: list[dict]) -> str:
    groups = _groups(results)
    lines = ["| model (parameters) | threads setting (used) | OpenMP wait | busy neighbours | runs | wall / step | "
             "CPU / step | CPU / step vs quiet, 1 thread |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for (model, setting, busy, wait), rs in groups.items():
        ref = groups.get((model, "1", 0, "passive"))
        cpu = statistics.median(r["cpu_per_step_ms"] for r in rs)
        ratio = f"{cpu / statistics.median(r['cpu_per_step_ms'] for r in ref):.2f}x" if ref else "-"
        lines.append(f"| {model} ({rs[0]['parameters']:,}) | {setting} ({rs[0]['threads_used']}) | {wait} | {busy} | "
                     f"{len(rs)} | {_spread([r['wall_per_step_ms'] for r in rs])} | "
                     f"{_spread([r['cpu_per_step_ms'] for r in rs])} | {ratio} |")
    return "\n".join(lines)


def _paired(results: list[dict], a: tuple, b: tuple, field: str) -> list[float]:
    """a / b per round, for the rounds that ran both."""
    by_round = {}
    for r in results:
        by_round.setdefault(r.get("round", 0), {})[_key(r)] = r[field]
    return [v[a] / v[b] for v in by_round.values() if a in v and b in v]


def reading(results: list[dict]) -> str:
    """The default job's three numbers the thread policy answers for, from the tiny model's rows."""
    default_quiet, default_busy = ("tiny", "default policy", 0, "passive"), ("tiny", "default policy", 2, "passive")
    one_busy = ("tiny", "1", 2, "passive")
    groups = _groups(results)
    if not all(k in groups for k in (default_quiet, default_busy, one_busy)):
        return ""
    cpu = [statistics.median(r["cpu_per_step_ms"] for r in groups[k]) for k in (default_busy, default_quiet)]
    walls = _paired(results, default_busy, one_busy, "wall_per_step_ms")
    spread = f" (per round {min(walls):.2f}x-{max(walls):.2f}x)" if len(walls) > 1 else ""
    return (f"The default job (tiny) beside two busy processes: CPU per step {cpu[0] / cpu[1]:.2f}x its quiet "
            f"CPU per step (medians), and wall with the default policy / wall with `threads=1` "
            f"{statistics.median(walls):.2f}x, the median over {len(walls)} round(s){spread}. Both settings train "
            f"with one thread, so the second ratio measures the machine's spread between two identical runs.\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--quick", action="store_true",
                    help="the default job's cases only; the other models keep their rows from --out-json")
    ap.add_argument("--repeats", type=int, default=1, help="rounds: every case once per round")
    ap.add_argument("--out-json", type=Path, default=ROOT / "docs" / "bench_threads.json")
    ap.add_argument("--out-md", type=Path, default=ROOT / "docs" / "benchmarks.md")
    args = ap.parse_args(argv)
    results = []
    for rnd in range(args.repeats):
        for case in cases(args.steps, args.quick):
            if rnd and len(case) > 4 and case[4].get("OMP_WAIT_POLICY") == "ACTIVE":
                continue
            r = {**run_case(*case), "round": rnd}
            print(json.dumps(r), flush=True)
            results.append(r)
    kept = ""
    if args.quick and args.out_json.is_file():
        ran, before = {r["model"] for r in results}, json.loads(args.out_json.read_text())
        old = [r for r in before["results"] if r["model"] not in ran]
        results += old
        sources = sorted({f"`{r.get('command', before['command'])}` ({r.get('date', before['machine']['date'])})"
                          for r in old})
        kept = f" The {', '.join(sorted({r['model'] for r in old}))} rows are kept from {', '.join(sources)}." if old else ""
    machine = {"cpus": os.cpu_count(), "cpus_allowed": len(os.sched_getaffinity(0)), "machine": platform.machine(),
               "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M")}
    command = " ".join(["python", "benchmarks/threads.py", *(argv or sys.argv[1:])])
    results = [{"command": command, "date": machine["date"], **r} for r in results]  # each row says where it is from
    args.out_json.write_text(json.dumps({"machine": machine, "command": " ".join(["python", *sys.argv]),
                                         "results": results}, indent=2))
    section = (f"## CPU threads (benchmarks/threads.py)\n\n`{' '.join(['python', 'benchmarks/threads.py', *(argv or sys.argv[1:])])}`"
               f" on {machine['cpus']} CPUs ({machine['date']}); whole-process times (start-up included), "
               f"the median over the runs with their range; the spinning-wait rows run once.{kept} "
               f"Busy neighbours: CPU-bound processes beside the run.\n\n{table(results)}\n\n{reading(results)}")
    write_markdown(args.out_md, section)
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
