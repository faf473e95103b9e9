"""Hydra's side of ``seed=auto`` (``hydra/sweeper=sequential``): parse the sweep, then launch
rounds of seeds through the configured launcher until :mod:`nas_cli.sweeps.sequential` says every
comparison is decided. Kept light: Hydra imports this module whenever it looks for plugins."""
from __future__ import annotations

from pathlib import Path
from typing import Any, List, Optional

from hydra.plugins.sweeper import Sweeper


class SequentialSweeper(Sweeper):
    def __init__(self, baseline: Optional[str] = None, metric: Optional[str] = None, min_seeds: int = 2,
                 max_seeds: int = 10, seeds_per_round: int = 1, delta: Optional[float] = None, alpha: float = 0.05,
                 spending: str = "obf", first_seed: int = 1, retries: int = 1) -> None:
        super().__init__()
        self.options = dict(baseline=baseline, metric=metric, min_seeds=min_seeds, max_seeds=max_seeds,
                            seeds_per_round=seeds_per_round, delta=delta, alpha=alpha, spending=spending,
                            first_seed=first_seed, retries=retries)
        self.hydra_context = self.config = self.launcher = None

    def setup(self, *, hydra_context, task_function, config) -> None:
        from hydra.core.plugins import Plugins

        self.hydra_context, self.config = hydra_context, config
        self.launcher = Plugins.instance().instantiate_launcher(hydra_context=hydra_context,
                                                                task_function=task_function, config=config)

    def sweep(self, arguments: List[str]) -> Any:
        from nas_cli.sweeps.sequential import run_sweep

        return run_sweep(self, list(arguments), Path(str(self.config.hydra.sweep.dir)))
