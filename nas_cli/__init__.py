"""nas-run: an experiment runner for research on Transformer attention.

Importing the package sets one process-wide default before torch loads its OpenMP runtime: waiting
OpenMP threads sleep instead of spinning (``OMP_WAIT_POLICY=PASSIVE``, unless the environment sets
it). Spinning threads of a run beside other busy processes took their cores from them and from
each other: measured on a 2-core machine, 10x the CPU time per step (benchmarks/threads.py).
"""
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
