"""What a ``seed=auto`` sweep runs (:mod:`nas_cli.sweeps.sequential`): its options
(``hydra.sweeper.*``), the grid of configurations from the swept options, each configuration's
baseline, and the job numbers and directories of each (configuration, seed)."""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from nas_cli.errors import UserError
from nas_cli.report import stopping as seq


@dataclass
class Options:
    """``hydra.sweeper.*`` (conf/hydra/sweeper/sequential.yaml)."""

    baseline: str | None = None
    metric: str | None = None
    min_seeds: int = 2
    max_seeds: int = 10
    seeds_per_round: int = 1
    delta: float | None = None
    alpha: float = 0.05
    spending: str = "obf"
    first_seed: int = 1
    retries: int = 1

    def check(self) -> None:
        def bad(what: str) -> UserError:
            return UserError(f"hydra.sweeper.{what}")

        for name in ("min_seeds", "max_seeds", "seeds_per_round", "first_seed", "retries"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise bad(f"{name}={v}: expected a whole number")
        if self.min_seeds < 2:
            raise bad(f"min_seeds={self.min_seeds}: at least 2 (one seed says nothing about seed-to-seed spread)")
        if self.max_seeds < self.min_seeds:
            raise bad(f"max_seeds={self.max_seeds}: must be at least min_seeds={self.min_seeds}")
        if self.max_seeds > 50:
            raise bad(f"max_seeds={self.max_seeds}: at most 50")
        if self.seeds_per_round < 1 or self.retries < 0:
            raise bad("seeds_per_round must be at least 1 and retries at least 0")
        if not isinstance(self.alpha, (int, float)) or not 0 < float(self.alpha) < 0.5:
            raise bad(f"alpha={self.alpha}: expected a number between 0 and 0.5, e.g. 0.05")
        if self.spending not in seq.SPENDING:
            raise bad(f"spending={self.spending}: choose {' or '.join(seq.SPENDING)}")
        if self.delta is not None and (not isinstance(self.delta, (int, float)) or not float(self.delta) > 0):
            raise bad(f"delta={self.delta}: a difference in the metric's units, above 0 (or null: no equivalence "
                      "stop)")

    @property
    def looks(self) -> tuple[int, ...]:
        return seq.looks(self.min_seeds, self.max_seeds, self.seeds_per_round)


@dataclass
class Config:
    index: int
    overrides: list[str]  # every override of its jobs but the seed
    values: dict[str, str]  # the swept axes' values
    label: str


def parse_arguments(arguments: Sequence[str], parser) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """The sweep's axes (key, values) in the order typed, and its fixed overrides (seed=auto removed)."""
    axes, fixed, seeds = [], [], []
    for o in parser.parse_overrides(list(arguments)):
        key = o.get_key_element()
        if o.key_or_group == "seed":
            seeds.append(o.input_line)
            if o.is_sweep_override() or str(o.value()) != "auto":
                raise UserError(f"{o.input_line}: a sequential sweep chooses the seeds itself; write seed=auto "
                                "(and hydra.sweeper.first_seed / min_seeds / max_seeds)")
            continue
        if o.is_sweep_override():
            if not o.is_discrete_sweep():
                raise UserError(f"{o.input_line}: a sequential sweep takes lists of values (a,b,c), not ranges or "
                                "intervals")
            values = [str(v) for v in o.sweep_string_iterator()]
            if len(set(values)) != len(values):
                raise UserError(f"{o.input_line}: a value is listed twice")
            axes.append((key, values))
        else:
            fixed.append(f"{key}={o.get_value_element_as_str()}")
    if not seeds:
        raise UserError("the sequential sweeper needs seed=auto on the command line")
    if not axes:
        raise UserError("seed=auto compares configurations: sweep at least one option, e.g. attention=unas,dnas")
    return axes, fixed


def grid(axes: list[tuple[str, list[str]]], fixed: list[str]) -> list[Config]:
    out = []
    for i, combo in enumerate(itertools.product(*[v for _, v in axes])):
        values = {k: v for (k, _), v in zip(axes, combo)}
        label = " ".join(f"{k}={v}" for k, v in values.items())
        out.append(Config(i, [*fixed, *(f"{k}={v}" for k, v in values.items())], values, label))
    return out


def tuned_options(value) -> list[str]:
    """``tune=`` as a list of option names (``tune=optim.lr`` and ``tune=[optim.lr]`` alike)."""
    if value is None:
        return []
    return [str(value)] if isinstance(value, str) else [str(v) for v in value]


@dataclass
class Cell:
    """The configurations equal in everything but the tuned options (``tune=[...]``): one side of a
    comparison, at the candidate its validation numbers choose. Without ``tune`` each configuration is
    a cell of its own."""

    index: int
    configs: list[int]  # the candidates' configuration indices, in the tuned values' grid order
    values: dict[str, str]  # the swept axes' values but the tuned ones
    label: str


def cells(configs: list[Config], tuned: Sequence[str]) -> list[Cell]:
    from nas_cli.report.tuning import grid_order

    out: dict[tuple, Cell] = {}
    for c in configs:
        rest = {k: v for k, v in c.values.items() if k not in tuned}
        key = tuple(sorted(rest.items()))
        if key not in out:
            out[key] = Cell(len(out), [], rest, " ".join(f"{k}={v}" for k, v in rest.items()))
        out[key].configs.append(c.index)
    for cell in out.values():
        cell.configs.sort(key=lambda i: tuple(grid_order(configs[i].values[k]) for k in tuned))
    return list(out.values())


def parse_baseline(text: str | None, axes: list[tuple[str, list[str]]], tuned: Sequence[str] = ()) -> tuple[str, str]:
    """``attention=unas`` or ``attention:unas``; default: the first value of the first axis that is not tuned."""
    compared = [a for a in axes if a[0] not in tuned]
    if not compared:
        raise UserError(f"seed=auto with tune=[{','.join(tuned)}] compares configurations: sweep an option besides "
                        "the tuned ones, e.g. attention=unas,dnas")
    if text is None or str(text).strip() in ("", "null"):
        return compared[0][0], compared[0][1][0]
    parts = re.split(r"[=:]", str(text), maxsplit=1)
    if len(parts) != 2:
        raise UserError(f"hydra.sweeper.baseline={text}: expected <swept option>:<value>, e.g. attention:unas")
    key, value = parts[0].strip(), parts[1].strip()
    if key in tuned:
        raise UserError(f"hydra.sweeper.baseline={text}: {key} is tuned (tune=[{','.join(tuned)}]): each "
                        f"configuration chooses its own value; name another swept option, e.g. "
                        f"{compared[0][0]}:{compared[0][1][0]}")
    found = dict(axes)
    if key not in found:
        raise UserError(f"hydra.sweeper.baseline={text}: {key} is not swept; the swept options are "
                        f"{', '.join(found)}")
    if value not in found[key]:
        raise UserError(f"hydra.sweeper.baseline={text}: {value} is not among {key}'s values "
                        f"({', '.join(found[key])})")
    return key, value


def pair_up(configs: "list[Config] | list[Cell]", baseline: tuple[str, str]) -> dict[int, int]:
    """system config (or cell) index -> its baseline's index (same values on every other axis)."""
    key, value = baseline
    by_values = {tuple(sorted(c.values.items())): c.index for c in configs}
    out = {}
    for c in configs:
        if c.values[key] == value:
            continue
        partner = dict(c.values, **{key: value})
        out[c.index] = by_values[tuple(sorted(partner.items()))]
    return out


def job_number(config: int, seed_index: int, n_configs: int) -> int:
    return seed_index * n_configs + config


def job_dir(root: Path, number: int) -> Path | None:
    found = sorted(p for p in root.glob(f"{number}_*") if p.is_dir())
    return found[0] if found else None


def subdir_override(pattern: str, number: int) -> str:
    """The job's ``hydra.sweep.subdir`` with its number fixed (the pattern's ``${hydra.job.num}``)."""
    text = pattern.replace("${hydra.job.num}", str(number)) if "${hydra.job.num}" in pattern else f"{number}_{pattern}"
    return "hydra.sweep.subdir='" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def default_metric(summary: dict) -> str:
    """The test metric of the one the task picks checkpoints by (val/bleu -> test/bleu; val/loss -> test/ppl)."""
    test = summary.get("test") or {}
    picked = str((summary.get("best_val") or {}).get("metric") or "")
    name = picked.split("/", 1)[-1]
    for key in (f"test/{name}", "test/ppl" if name == "loss" else None):
        if key and key in test:
            return key
    from tasks.scores import present

    shown = [m.key for m in present(test) if m.compared]
    if not shown:
        raise UserError("the sweep's runs report no test metric to compare (run_test=false?); set run_test=true")
    return shown[0]
