"""``seed=auto``: a sweep that adds seeds in rounds until every comparison is decided.

``nas-run -m attention=unas,dnas,hnas model.heads=4,8 seed=auto`` trains every configuration of
the grid at seeds ``first_seed .. first_seed + min_seeds - 1``, then compares each configuration
with its baseline (the configuration with the baseline's value on the baseline axis and the
same values on every other axis: ``dnas h8`` against ``unas h8``) on one test metric, paired by
seed, with the group-sequential test of :mod:`nas_cli.report.stopping`. Each comparison is
decided (*higher*, *lower*, *no difference larger than delta*), or goes on: only the
configurations of a comparison still open get the next round of seeds (a baseline runs while
any comparison against it is open). At ``max_seeds`` an open comparison ends *undecided*.

The sweep's state is its run directories: job ``<j * C + c>_...`` is configuration ``c`` (of
``C``) at seed ``first_seed + j``, so running the same command again finds every finished seed,
recomputes every decision from the runs, resumes unfinished runs from their checkpoints and goes
on from the last finished round; no seed runs twice. A job that fails is run again (up to
``retries`` times) and never counted as a seed; one that still fails stops the sweep (its table
says which; the same command continues after the fix). ``sequential.json`` in the sweep
directory holds the design, the runs of each seed and every look; ``sequential.png`` draws each
difference with its sequential interval against the number of seeds; ``nas-report <sweep dir>``
shows the same table.

The sweeper is :class:`hydra_plugins.nas_run_sequential.sequential_sweeper.SequentialSweeper`
(Hydra accepts sweepers only from its plugin package); it launches each round through the
configured launcher (basic, joblib, SLURM through submitit).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from nas_cli.errors import UserError, console, fail, print_table, say
from nas_cli.infra.rundir import remove_unstarted_sweep
from nas_cli.report import stopping as seq
from nas_cli.sweeps.sequential_view import DECISION_WORDS, finite_or_none, draw, look_line, method_text, rich_table
from nas_cli.sweeps.design import (Cell, Config, Options, cells, default_metric, grid, job_dir, job_number,
                                   pair_up, parse_arguments, parse_baseline, subdir_override, tuned_options)

STATE_FILE = "sequential.json"
FIGURE_FILE = "sequential.png"


class SequentialSweep:
    """The rounds of one ``seed=auto`` sweep (driven by the Hydra sweeper)."""

    def __init__(self, options: Options, root: Path, configs: list[Config], baseline: tuple[str, str],
                 subdir_pattern: str, tuned: list[str] | None = None):
        self.options, self.root, self.configs, self.baseline = options, root, configs, baseline
        self.tuned = list(tuned or [])  # tune=[...]: each cell's candidate chosen at every look
        self.cells: list[Cell] = cells(configs, self.tuned)
        self.pairs = pair_up(self.cells, baseline)  # system cell -> baseline cell
        self.last_sides: dict = {}
        self.subdir_pattern = subdir_pattern
        self.metric: str | None = options.metric
        if self.metric and not self.metric.startswith("test/"):
            self.metric = f"test/{self.metric}"

    # ---- what the run directories say -------------------------------------------------
    def seed(self, j: int) -> int:
        return self.options.first_seed + j

    def summary(self, config: int, j: int) -> dict | None:
        d = job_dir(self.root, job_number(config, j, len(self.configs)))
        if d is None or not (d / "summary.json").is_file():
            return None
        try:
            return json.loads((d / "summary.json").read_text())
        except (OSError, ValueError):
            return None

    def finished(self) -> dict[int, list[dict]]:
        """Each configuration's summaries, seed by seed, up to its first seed not finished."""
        out: dict[int, list[dict]] = {}
        for c in self.configs:
            out[c.index] = []
            for j in range(self.options.max_seeds):
                s = self.summary(c.index, j)
                if s is None:
                    break
                out[c.index].append(s)
        return out

    def values(self, finished: dict[int, list[dict]] | None = None) -> dict[int, list[float]]:
        """Each configuration's metric, seed by seed, up to its first seed not finished."""
        finished = self.finished() if finished is None else finished
        out: dict[int, list[float]] = {}
        for c in self.configs:
            out[c.index] = []
            for j, s in enumerate(finished[c.index]):
                if self.metric is None:
                    self.metric = default_metric(s)
                v = (s.get("test") or {}).get(self.metric)
                if v is None or not math.isfinite(float(v)):
                    run = job_dir(self.root, job_number(c.index, j, len(self.configs)))
                    have = ", ".join(sorted(k.removeprefix("test/") for k in (s.get("test") or {})))
                    raise UserError(f"hydra.sweeper.metric={self.metric}: run {run} has no such value (it reports: "
                                    f"{have or 'no test metrics'})")
                out[c.index].append(float(v))
        return out

    def _chosen(self, cell: Cell, finished: dict[int, list[dict]], tests: dict[int, list[float]]) -> seq.Chosen:
        """A tuned cell's candidates: their best validation values (summary.json's ``best_val``) and test values."""
        from nas_cli.report.tuning import validation_higher

        first = (finished[cell.configs[0]] or [{}])[0].get("best_val") or {}
        higher = validation_higher(first.get("mode"), first.get("metric"))  # one task: one direction
        validation = []
        for i in cell.configs:
            vals = []
            for j, s in enumerate(finished[i]):
                best = s.get("best_val") or {}
                v = best.get("value")
                if v is None or not math.isfinite(float(v)):
                    run = job_dir(self.root, job_number(i, j, len(self.configs)))
                    raise UserError(f"tune=[{','.join(self.tuned)}]: run {run} has no validation value to choose "
                                    "by (no validation ran); make it validate (trainer.val_check_interval <= "
                                    "trainer.max_steps)")
                vals.append(float(v))
            validation.append(tuple(vals))
        return seq.Chosen(tuple(validation), tuple(tuple(tests[i]) for i in cell.configs), higher)

    def sides(self) -> dict[int, "list[float] | seq.Chosen"]:
        """Each cell's numbers for the comparisons: a configuration's test values, or a tuned cell's candidates."""
        finished = self.finished()
        tests = self.values(finished)
        return {cell.index: self._chosen(cell, finished, tests) if len(cell.configs) > 1 else tests[cell.configs[0]]
                for cell in self.cells}

    def decide(self) -> dict[str, seq.Comparison]:
        sides = self.sides()
        self.last_sides = sides  # what records() names each tuned cell's choice from
        pairs = {self.cells[s].label: (self.cells[b].label, sides[b], sides[s]) for s, b in self.pairs.items()}
        return seq.decide(pairs, self.options.looks, float(self.options.alpha), self.options.spending,
                          None if self.options.delta is None else float(self.options.delta))

    def chosen_label(self, cell: Cell, side, n: int) -> str:
        """A cell's name at a look: a tuned cell names the candidate chosen on ``n`` seeds."""
        if not isinstance(side, seq.Chosen) or n < 1:
            return cell.label
        values = self.configs[cell.configs[side.pick(n)]].values
        return f"{cell.label} ({', '.join(f'{k}={values[k]}' for k in self.tuned)}, tuned)"

    def next_jobs(self, state: dict[str, seq.Comparison]) -> list[tuple[int, int]]:
        """(config, seed index) of the next round: the open comparisons' configurations up to the next look."""
        done = {name: comp.n for name, comp in state.items()}
        wanted: dict[int, int] = {}
        for s, b in self.pairs.items():
            comp = state[self.cells[s].label]
            if not comp.open:
                continue
            n = next((n for n in self.options.looks if n > done[comp.name]), None)
            if n is None:
                continue
            for c in (*self.cells[s].configs, *self.cells[b].configs):  # every candidate of a tuned cell
                wanted[c] = max(wanted.get(c, 0), n)
        return [(c, j) for j in range(max(wanted.values(), default=0)) for c in sorted(wanted)
                if j < wanted[c] and self.summary(c, j) is None]

    def job_overrides(self, config: int, j: int) -> list[str]:
        number = job_number(config, j, len(self.configs))
        return [*self.configs[config].overrides, f"seed={self.seed(j)}", subdir_override(self.subdir_pattern, number)]

    # ---- what the user sees ----------------------------------------------------------
    def records(self, state: dict[str, seq.Comparison]) -> dict[str, Any]:
        n_configs = len(self.configs)
        runs = {c.label: {str(self.seed(j)): (job_dir(self.root, job_number(c.index, j, n_configs)) or Path("?")).name
                          for j in range(self.options.max_seeds)
                          if job_dir(self.root, job_number(c.index, j, n_configs)) is not None}
                for c in self.configs}
        return {"method": method_text(self.options, self.tuned),
                "design": {**asdict(self.options), "looks": list(self.options.looks),
                           "baseline": f"{self.baseline[0]}={self.baseline[1]}", "tune": self.tuned},
                "metric": self.metric,
                "configs": [{"label": c.label, "overrides": c.overrides, "values": c.values, "runs": runs[c.label]}
                            for c in self.configs],
                "comparisons": [{"system": name, "baseline": comp.baseline, "decision": comp.decision,
                                 **self._chosen_names(name, comp),
                                 "looks": [asdict(lk) | {"low": finite_or_none(lk.low), "high": finite_or_none(lk.high),
                                                         "boundary": finite_or_none(lk.boundary), "t": finite_or_none(lk.t)}
                                           for lk in comp.looks]}
                                for name, comp in state.items()],
                "finished": all(not comp.open for comp in state.values())}

    def _chosen_names(self, name: str, comp: seq.Comparison) -> dict[str, str]:
        """A tuned comparison's two sides as chosen at its last look (nothing for an untuned one)."""
        if not self.tuned:
            return {}
        by_label = {cell.label: cell for cell in self.cells}
        return {f"{side}_chosen": self.chosen_label(by_label[label], self.last_sides.get(by_label[label].index), comp.n)
                for side, label in (("system", name), ("baseline", comp.baseline))}

    def save(self, state: dict[str, seq.Comparison]) -> dict[str, Any]:
        from nas_cli.infra.atomic import atomic_write_json

        rec = self.records(state)
        atomic_write_json(self.root / STATE_FILE, rec)
        try:
            draw(rec, self.root / FIGURE_FILE)
        except Exception:  # noqa: BLE001 - a figure must never stop the sweep
            pass
        return rec


def recompute(root: Path) -> dict[str, Any] | None:
    """A sequential sweep's table, recomputed from its run directories (``nas-report <sweep dir>``);
    None when ``root`` is not one. Raises UserError for a damaged sequential.json."""
    from dataclasses import fields

    path = Path(root) / STATE_FILE
    if not path.is_file():
        return None
    try:
        rec = json.loads(path.read_text())
        design = rec["design"]
        options = Options(**{f.name: design[f.name] for f in fields(Options) if f.name in design})
        configs = [Config(i, c["overrides"], c["values"], c["label"]) for i, c in enumerate(rec["configs"])]
        key, _, value = str(design["baseline"]).partition("=")
        sweep = SequentialSweep(options, Path(root), configs, (key, value), "", list(design.get("tune") or []))
        sweep.metric = rec.get("metric")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UserError(f"{path}: not a readable sequential-sweep record ({err}); run the sweep's command again "
                        "to rewrite it") from None
    return sweep.records(sweep.decide())


def run_sweep(sweeper, arguments: list[str], root: Path) -> list:
    """The rounds (called by the Hydra sweeper): launch, read, decide, until nothing is open."""
    from omegaconf import OmegaConf

    from nas_cli.infra.rundir import release

    out = console()
    options, configs, sweep, state = _start(sweeper, arguments, root)
    root.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(sweeper.config, root / "multirun.yaml")
    returns: list = []
    looked = _progress(state)
    while True:
        jobs = sweep.next_jobs(state)
        if not jobs:
            break
        jobs = _launch_round(sweeper, sweep, options, configs, jobs, returns)
        if jobs:
            sweep.save(state)
            names = ", ".join(f"{configs[c].label} seed={sweep.seed(j)}" for c, j in jobs)
            say(f"[bold red]nas-run: the sequential sweep stopped:[/] {len(jobs)} job(s) failed "
                    f"{options.retries + 1} time(s) ({names}); fix the cause and run the same command again to "
                    "continue")
            return returns
        try:
            state = sweep.decide()
        except UserError as err:
            release(root)
            fail(str(err))
        if _progress(state) == looked:  # nothing new to look at: never launch the same round again
            break
        looked = _progress(state)
        rec = sweep.save(state)
        n = max((c.n for c in state.values()), default=0)
        say(look_line(state, n, rec["metric"]), log=False)  # the whole table once, at the end
    rec = sweep.save(state)
    n = max((c.n for c in state.values()), default=0)
    if rec["comparisons"]:
        print_table(rich_table(rec, f"nas-run sequential sweep {root}: last look at n={n} seeds ({rec['metric']})"))
    if rec["finished"]:
        counts: dict[str, int] = {}
        for comp in state.values():
            word = (f"no difference larger than {options.delta:g}" if comp.decision == seq.EQUIVALENT
                    else DECISION_WORDS[comp.decision])
            counts[word] = counts.get(word, 0) + 1
        said = ", ".join(f"{n} {word}" for word, n in counts.items())
        out.print(f"nas-run: the sequential sweep is over ({said}); {STATE_FILE} and {FIGURE_FILE} in {root}",
                      highlight=False)
    return returns


def _start(sweeper, arguments: list[str], root: Path):
    """The sweep's design from its options and swept arguments, and every decision so far (a
    continued sweep's, from its runs). Bad options: one line, and no directory left behind."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from nas_cli.infra.rundir import release

    try:
        options = Options(**sweeper.options)
        options.check()
        parser = OverridesParser.create(config_loader=sweeper.hydra_context.config_loader)
        axes, fixed = parse_arguments(arguments, parser)
        configs = grid(axes, fixed)
        tuned = tuned_options(sweeper.config.get("tune"))
        baseline = parse_baseline(options.baseline, axes, tuned)
        pattern = str(OmegaConf.to_container(sweeper.config.hydra.sweep, resolve=False)["subdir"])
        sweep = SequentialSweep(options, root, configs, baseline, pattern, tuned)
        if not sweep.pairs:
            raise UserError("seed=auto: no configuration to compare with the baseline")
        return options, configs, sweep, sweep.decide()
    except UserError as err:
        release(root)
        remove_unstarted_sweep(root)
        fail(str(err))


def _launch_round(sweeper, sweep, options, configs, jobs, returns: list) -> list:
    """Launch one round's jobs, again up to ``retries`` times for the ones that failed (a failed
    job is never counted as a seed). Returns the jobs that still failed."""
    for attempt in range(options.retries + 1):
        batch = [sweep.job_overrides(c, j) for c, j in jobs]
        sweeper.validate_batch_is_legal(batch)
        first = min(job_number(c, j, len(configs)) for c, j in jobs)
        returns.append(sweeper.launcher.launch(batch, initial_job_idx=first))
        jobs = [(c, j) for c, j in jobs if sweep.summary(c, j) is None]
        if not jobs:
            break
        if attempt < options.retries:
            say(f"[bold yellow]nas-run: {len(jobs)} job(s) of this round failed: running them again (a failed "
                    "job is never counted as a seed)[/]")
    return jobs


def _progress(state: dict[str, seq.Comparison]) -> tuple:
    return tuple((name, c.n, c.decision) for name, c in sorted(state.items()))
