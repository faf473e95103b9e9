"""A command timed as a whole process, shared by the benchmarks that time nas-run itself."""
from __future__ import annotations

import resource
import subprocess
import time


def timed_run(args: list[str], env: dict, cwd: str) -> tuple[subprocess.CompletedProcess, float, float]:
    """Run ``args``; (the finished process, wall seconds, user + system CPU seconds of it and its
    children). A failed command raises with the end of its stderr."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, env=env, cwd=cwd)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return proc, wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
