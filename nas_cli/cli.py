"""Entry points only: compose config -> run -> report.

``nas-run`` is a Hydra application; the config folder ships with the package, so it
works from any working directory.
"""
from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from .errors import UserError
from .registry import CONF_DIR, tag_from_placement



def scheme_tag_from_names(encoder: str, decoder: str, cross: str) -> str:
    """The ``nas.tag`` resolver used in run directory names (see registry.scheme_tag)."""
    return tag_from_placement({"encoder": str(encoder), "decoder": str(decoder), "cross": str(cross)})


if not OmegaConf.has_resolver("nas.tag"):
    OmegaConf.register_new_resolver("nas.tag", scheme_tag_from_names)


def _fmt(x, digits=2):
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.{digits}f}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def summary_table(summaries: list[dict], title: str) -> Table:
    table = Table(title=title, caption="\n".join(f"run files: {s['run_dir']}" for s in summaries),
                  caption_justify="left")
    for col in ("task", "scheme", "heads", "params", "exact match", "BLEU", "test ppl", "tokens/s"):
        table.add_column(col, no_wrap=True)
    for s in summaries:
        test = s.get("test", {})
        em = test.get("test/exact_match")
        table.add_row(s["task"], s["scheme"], str(s["heads"]), _fmt(s["parameters"]),
                      "-" if em is None else f"{100 * em:.1f}%", _fmt(test.get("test/bleu")),
                      _fmt(test.get("test/ppl"), 3), _fmt(s.get("tokens_per_s"), 0))
    return table


def _console() -> Console:
    # logs and CI are not terminals: give tables room instead of rich's 80 columns
    return Console() if sys.stdout.isatty() else Console(width=120)


class SweepSummary(Callback):
    """Hydra callback: after a multirun, print one table comparing every job."""

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        root = Path(config.hydra.sweep.dir)
        rows = [json.loads(p.read_text()) for p in sorted(root.glob("*/summary.json"))]
        if rows:
            rows.sort(key=lambda s: (s["task"], s["scheme"], s["heads"]))
            _console().print(summary_table(rows, f"nas-run sweep {root}"))


def _job(cfg: DictConfig):
    from .run import train  # heavy imports after Hydra has parsed the command line

    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    multirun = hc.mode == RunMode.MULTIRUN
    group = cfg.logger.get("group") or (Path(hc.sweep.dir).name if multirun else str(cfg.task.name))
    try:
        summary = train(cfg, run_dir, group, job_type="sweep" if multirun else "train")
    except UserError as err:
        Console(stderr=True).print(f"[bold red]nas-run: error:[/] {err}", highlight=False, soft_wrap=True)
        sys.exit(2)
    _console().print(summary_table([summary], "nas-run result"))
    return summary["best_val"]["value"]


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def _hydra_entry(cfg: DictConfig):
    return _job(cfg)


def main() -> None:
    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ.setdefault("WANDB_DISABLE_GIT", "true")
    for name in ("pytorch_lightning.utilities.rank_zero", "pytorch_lightning.accelerators.cuda", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    _hydra_entry()


if __name__ == "__main__":
    main()
