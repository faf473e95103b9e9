"""Hydra's side of ``hydra/launcher=ray``: the launcher class Hydra instantiates from
conf/hydra/launcher/ray.yaml; the work is in :mod:`nas_cli.sweeps.ray_engine`. Kept light: Hydra
imports this module whenever it looks for plugins, with or without Ray installed."""
from __future__ import annotations

from typing import Any, Optional, Sequence

from hydra.plugins.launcher import Launcher


class NasRayLauncher(Launcher):
    def __init__(self, ray: Any = None) -> None:
        self.ray_cfg = ray if ray is not None else {}
        self.config = self.hydra_context = self.task_function = None

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Optional[Sequence[Any]]:
        from nas_cli.sweeps.ray_engine import launch

        return launch(self, job_overrides, initial_job_idx)
