"""``nas-run``: compose the config, run the job(s), print the result.

The command parses and dispatches: what it does to its arguments before Hydra is
:mod:`nas_cli.pipeline.launch.command_line`, one job is :mod:`nas_cli.pipeline.job`, and a stop signal
to this process is :mod:`nas_cli.sweeps.supervision`'s. The config folder ships with the package,
so it works from any working directory.
"""
from __future__ import annotations

import os
import sys

import hydra
from omegaconf import DictConfig

from nas_cli.errors import UserError, exits, fail, quiet_libraries
from nas_cli.model.choices import CONF_PACKAGE
from nas_cli.pipeline.launch.command_line import hydra_argv
from nas_cli.pipeline.job import run_job
from nas_cli.pipeline.launch.resolvers import register_resolvers
from nas_cli.sweeps.supervision import supervise

#: Lightning's hint on a machine with SLURM's client tools ("The `srun` command is available on your
#: system but is not used"): nas-run's SLURM jobs go through hydra/launcher=slurm, whose jobs submitit
#: starts with srun
SRUN_HINT = "ignore:The `srun` command is available on your system"


@hydra.main(version_base="1.3", config_path=CONF_PACKAGE, config_name="config")
@exits  # a job in a worker process (joblib, SLURM, Ray) says its own outcome there
def _hydra_entry(cfg: DictConfig):
    return run_job(cfg)


def _quiet() -> None:
    if SRUN_HINT not in os.environ.get("PYTHONWARNINGS", ""):  # also in the processes a sweep starts afresh
        os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"), SRUN_HINT]))
    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ.setdefault("WANDB_DISABLE_GIT", "true")
    quiet_libraries()


def _register_plugins(argv: list[str]) -> None:
    """Hydra finds plugins by walking its plugin package, which an editable install's import hook
    hides from it: make nas-run's sequential sweeper and Ray launcher known either way."""
    wanted = []
    if any(a.startswith("hydra/sweeper=sequential") for a in argv):
        from hydra_plugins.nas_run_sequential.sequential_sweeper import SequentialSweeper

        wanted.append(SequentialSweeper)
    if any(a.startswith("hydra/launcher=ray") for a in argv):
        from hydra_plugins.nas_run_ray.ray_launcher import NasRayLauncher

        wanted.append(NasRayLauncher)
    if not wanted:
        return
    from hydra.core.plugins import Plugins

    plugins = Plugins.instance()
    for plugin in wanted:
        if f"{plugin.__module__}.{plugin.__name__}" not in plugins.class_name_to_class:
            plugins.register(plugin)


def version_line() -> str:
    """``nas-run --version``: nas-run's version and commit, then the libraries a run's numbers depend on."""
    from importlib import metadata

    from nas_cli.infra.version import code_version, describe

    code = code_version()
    where = f" (commit {code['commit']}{', with uncommitted changes' if code['dirty'] else ''})" if code["commit"] else ""
    libs = ", ".join(f"{name} {metadata.version(dist)}" for name, dist in
                     (("torch", "torch"), ("Lightning", "pytorch-lightning"), ("Hydra", "hydra-core"), ("wandb", "wandb")))
    return f"nas-run {describe({'version': code['version']})}{where}\n{libs}"


@exits
def main() -> None:
    if "--version" in sys.argv[1:]:
        print(version_line())
        return
    _quiet()
    register_resolvers()
    try:
        argv = hydra_argv(sys.argv[1:])
    except UserError as err:
        fail(str(err))
    _register_plugins(argv)
    sys.argv = [sys.argv[0], *argv]
    supervise(_hydra_entry)


if __name__ == "__main__":
    main()
