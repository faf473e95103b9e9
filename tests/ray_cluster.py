"""A real local Ray cluster of two nodes for the tests: ``ray start --head`` in a temporary directory and
``ray start --address=...`` at a second address of this machine, one CPU each (no dashboard, no usage
statistics, workers at the tests' own priority, SIGINT ignored as in a background job), stopped with
``ray stop`` at the end.

    with RayCluster(tmp_path / "ray") as cluster:
        subprocess.run(["nas-run", "-m", "hydra/launcher=ray", "hydra.launcher.ray.init.address=auto", ...],
                       env=cluster.env)

:func:`available` says why a cluster cannot be started here (Ray not installed), so tests can skip
with that reason. Install: ``pip install -e ".[ray]"`` (the README's test section; ``.ci/run`` does it).
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def available() -> str | None:
    """None if a Ray cluster can be started here, else the reason."""
    if importlib.util.find_spec("ray") is None:
        return 'Ray not installed: pip install -e ".[ray]"'
    if _ray_cli() is None:
        return "Ray's command line (ray) not found beside this Python"
    return None


def _ray_cli() -> str | None:
    beside = Path(sys.executable).with_name("ray")
    return str(beside) if beside.exists() else shutil.which("ray")


def _as_a_background_job() -> None:
    """Start the cluster as a script's background job (``ray start ... &``) starts it, and as CI ran it: with
    SIGINT ignored, which every Ray worker then inherits. Ray's cancel is a SIGINT, so the jobs must listen
    for it anyway (nas_cli.sweeps.ray_engine); the tests check it whatever way pytest itself was started."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


#: the head's port (Ray's default): one test cluster at a time (the tests' xdist group "ray")
PORT = 6379


class RayCluster:
    """A head node and ``nodes - 1`` more, each with one CPU; ``env`` is what the tests' commands run with.

    The other nodes run on this machine too, each at an address of its own (127.0.0.2, ...): Ray places
    tasks on them as on other machines, and Ray Train, which tells nodes apart by address, gives their
    workers a node rank of their own. They see the same files, as nodes on shared storage do."""

    def __init__(self, root: Path, nodes: int = 2):
        self.root, self.nodes = Path(root), int(nodes)
        # token authentication is on where ~/.ray/auth_token exists and off elsewhere (a fresh CI machine):
        # off for every process of the test cluster, so the second node joins alike on both
        self.env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "NO_COLOR": "1", "RAY_DEDUP_LOGS": "0",
                    "RAY_AUTH_MODE": "disabled"}
        # Ray starts its workers at nice 15, below every other process: with two busy processes on a 2-CPU
        # machine a Ray job got about 4% of a CPU (over 8 minutes to start), and on the loaded CI machine a
        # job's start took a minute. The test cluster's workers compete with the suite's other worker as equals.
        self.node_env = {**self.env, "RAY_worker_niceness": "0"}

    def __enter__(self) -> "RayCluster":
        self.root.mkdir(parents=True, exist_ok=True)
        # Ray's sockets live under its temp dir, and a socket's path may have at most 107 bytes: a short one
        self.temp = tempfile.mkdtemp(prefix="nasray-", dir="/tmp")
        try:
            self._start("--head", f"--port={PORT}", f"--temp-dir={self.temp}", "--include-dashboard=false",
                        "--disable-usage-stats")
            for n in range(2, self.nodes + 1):
                self._start(f"--address=127.0.0.1:{PORT}", f"--node-ip-address=127.0.0.{n}")
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self, *args: str) -> None:
        proc = subprocess.run([_ray_cli(), "start", "--num-cpus=1", "--num-gpus=0", *args], capture_output=True,
                              text=True, env=self.node_env, timeout=180,
                              cwd=self.root,  # the workers' directory: nothing a job misplaces lands in the checkout
                              preexec_fn=_as_a_background_job)
        if proc.returncode != 0:
            raise RuntimeError(f"ray start {' '.join(args)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")

    def __exit__(self, *exc) -> None:  # every node of the machine: ray stop cannot tell clusters apart
        subprocess.run([_ray_cli(), "stop", "--force"], capture_output=True, text=True, env=self.env, timeout=180)
        shutil.rmtree(self.temp, ignore_errors=True)

    def workers(self) -> list[int]:
        """The process ids of the cluster's Ray worker processes (``ray::...`` in their command line)."""
        found = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                if cmdline.read_bytes().startswith(b"ray::"):
                    found.append(int(cmdline.parent.name))
            except (OSError, ValueError):
                continue
        return found
