"""Find nas-run run directories and read what they left behind.

A *run directory* is one holding ``summary.json`` (written last by ``nas_cli.pipeline.run.train``,
so its presence means the run finished) or, for a run that did not finish, only
``.hydra/config.yaml``. Everything is read from local files: ``summary.json``,
``.hydra/config.yaml`` (the composed config) and ``diagnostics/summary.json`` /
``diagnostics/latest.json`` (the attention diagnostics); the W&B files are not needed,
so runs logged online, offline or not at all are handled alike.
"""
from __future__ import annotations

import copy
import functools
import json
import math
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from nas_cli.diagnostics.metrics import Reported
from nas_cli.infra.config_identity import flatten as _flatten
from nas_cli.infra.rundir import ITEMS_FILE
from nas_cli.model.locations import LOCATIONS
from tasks.scores import KNOWN, declare

__all__ = ["Run", "find_runs", "load_run", "flatten", "TEST_METRICS"]

#: the known test metrics (tasks.scores, the one list): (key, column title, higher is better)
TEST_METRICS = tuple((m.key, m.title, m.higher_is_better) for m in KNOWN if m.compared)


#: directories inside a run that never hold other runs (skipped while searching)
_SKIP_DIRS = frozenset({"wandb", "checkpoints", "csv", ".hydra", "diagnostics", "__pycache__", ".git"})


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _read_config(run_dir: Path) -> dict:
    """The run's resolved ``.hydra/config.yaml`` ({} if none or damaged); a copy of what
    :func:`_parsed_config` keeps while the file is unchanged (a page built from many reports,
    benchmarks/study_report.py, reads each run's config once)."""
    path = (run_dir / ".hydra" / "config.yaml").absolute()
    try:
        st = path.stat()
    except OSError:
        return {}
    if not stat.S_ISREG(st.st_mode):
        return {}
    return copy.deepcopy(_parsed_config(path, (st.st_mtime_ns, st.st_size, st.st_ino)))


@functools.lru_cache(maxsize=10_000)
def _parsed_config(path: Path, version: tuple[int, int, int]) -> dict:
    """``path`` parsed once per ``version`` (mtime, size, inode)."""
    from omegaconf import OmegaConf

    try:
        cfg = OmegaConf.load(path)
    except Exception:  # a damaged file: report the run without its config
        return {}
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except Exception:  # interpolations needing resolvers registered by nas-run only
        return OmegaConf.to_container(cfg, resolve=False)


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts -> {"a.b.c": value}; lists are kept as (hashable) tuples."""
    return _flatten(node, prefix, hashable=True)


def _num(x) -> float | None:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


@dataclass
class Run:
    """One run directory: what it finished with (``summary``), its config, its diagnostics."""

    path: Path
    summary: dict | None
    config: dict = field(default_factory=dict)
    diagnostics: dict | None = None  # diagnostics/summary.json (end of fit)
    latest: dict | None = None  # diagnostics/latest.json (last analysed validation)
    failure: dict | None = None  # failed.json: the one-line reason a run stopped on bad input or an error
    variant: str | None = None  # a nas-eval result of this run (eval/<name>.json): its own row
    items_path: Path | None = None  # per-item test outputs (test_items.json, or eval/<name>.items.json)
    source: str | None = None  # the PATH it was found under (nas-report's --group-by source)

    @property
    def finished(self) -> bool:
        return self.summary is not None

    @property
    def status(self) -> str:
        """finished | failed | unfinished (interrupted, or still running)."""
        if self.summary is not None:
            return "finished"
        return "failed" if self.failure else "unfinished"

    @property
    def flat_config(self) -> dict[str, Any]:
        return flatten(self.config)

    # ---- identity --------------------------------------------------------------------
    def _cfg(self, dotted: str, default=None):
        node: Any = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    @property
    def task(self) -> str:
        return str((self.summary or {}).get("task") or self._cfg("task.name") or "?")

    @property
    def placement(self) -> dict[str, str]:
        p = (self.summary or {}).get("placement")
        if isinstance(p, dict):
            return {k: str(v) for k, v in p.items()}
        att = self._cfg("attention", {}) or {}
        if not isinstance(att, dict):  # a config written by hand: attention=<scheme> as a plain name
            att = {"name": str(att)}
        name = att.get("name", "?")
        out = {loc: str(att.get(loc, name)) for loc in LOCATIONS}
        return {k: (name if v.startswith("${") else v) for k, v in out.items()}

    @property
    def scheme(self) -> str:
        """The scheme name if one scheme is used everywhere, else ``enc-x_dec-y_cross-z``."""
        s = (self.summary or {}).get("scheme")
        if s:
            return str(s)
        p = self.placement
        if len(set(p.values())) == 1:
            return next(iter(p.values()))
        short = {"encoder": "enc", "decoder": "dec", "cross": "cross"}
        return "_".join(f"{short.get(k, k)}-{v}" for k, v in p.items())

    @property
    def code(self) -> str:
        """The nas-run version that made the run ('0.1.0+3f2a9c1.dirty'; '?' for runs that did not record it)."""
        from nas_cli.infra.version import describe

        return describe((self.summary or {}).get("code"))

    @property
    def heads(self) -> int | None:
        h = (self.summary or {}).get("heads", self._cfg("model.heads"))
        return None if h is None else int(h)

    @property
    def seed(self) -> int | None:
        s = (self.summary or {}).get("seed", self._cfg("seed"))
        return None if s is None else int(s)

    # ---- numbers -----------------------------------------------------------------------
    def value(self, name: str) -> float | None:
        """A number by report name: 'parameters', 'tokens_per_s', 'steps', 'best_val', a
        summary["test"] key ('test/bleu'), a number the run's diagnostics declared (its name, over
        the locations as declared, or '<name>:<location>'; :meth:`reported`), or any per-location
        diagnostics scalar as 'diag:<key>' (mean over locations) / 'diag:<key>:<location>'.
        KeyError for a name the run does not know."""
        s = self.summary or {}
        if name in ("parameters", "tokens_per_s", "steps", "fit_seconds", "kv_cache_bytes_per_token",
                    "recurrent_state_bytes"):
            return _num(s.get(name))
        if name == "best_val":
            return _num((s.get("best_val") or {}).get("value"))
        if name.startswith("test/"):
            if name == "test/exact_match" and self.best_val_metric not in (None, "val/exact_match"):
                return None  # a task's own metrics only: exact match means nothing for translation or headlines
            return _num((s.get("test") or {}).get(name))
        if name.startswith("diag:"):  # any per-location scalar a diagnostics plug-in wrote: diag:<key>[:<loc>]
            _, field, loc = (name.split(":") + [""])[:3]
            declared = Reported(field, field, key=field)
        else:
            base, _, loc = name.partition(":")
            declared = self.reported.get(base)
            if declared is None:
                raise KeyError(name)
        locs = self.diag_locations()
        if loc:
            return _num(locs.get(loc, {}).get(declared.field))
        vals = [v for v in (_num(x.get(declared.field)) for x in locs.values()) if v is not None]
        return declared.combine(vals) if vals else None

    @property
    def metric_targets(self) -> list[str]:
        """The classes of the diagnostics the run computed (its config's ``diagnostics.metrics``)."""
        metrics = self._cfg("diagnostics.metrics", {}) or {}
        return [str(m["_target_"]) for m in metrics.values() if isinstance(m, dict) and m.get("_target_")]

    def diagnostic_status(self, name: str) -> tuple[str, str] | None:
        """For a diagnostic by report name (``jsd``, ``jsd:encoder``): ("derived", what it was computed on) when some
        location computed it on a derived quantity (row-normalized weights), ("not applicable", why) when some
        location's weights leave it undefined (it reads null there), else None."""
        base, _, loc = name.partition(":")
        locs = self.diag_locations()
        chosen = [locs.get(loc, {})] if loc else list(locs.values())
        for kind, where in (("not applicable", "not_applicable"), ("derived", "derived")):
            for scalars in chosen:
                why = (scalars.get(where) or {}).get(base)
                if why:
                    return kind, str(why)
        return None

    @functools.cached_property
    def reported(self) -> dict[str, Reported]:
        """{name: declaration}: the numbers the run's diagnostics declared for nas-report
        (diagnostics/summary.json ``reported``; :class:`nas_cli.diagnostics.metrics.Reported`),
        read once per run: every diagnostic value the report looks up goes through it."""
        return {d["name"]: Reported(**d) for d in (self.diagnostics or {}).get("reported") or []}

    @property
    def best_val_metric(self) -> str | None:
        return ((self.summary or {}).get("best_val") or {}).get("metric")

    def diag_locations(self) -> dict[str, dict]:
        """{location: per-location scalars} from diagnostics/summary.json, else latest.json."""
        for source in (self.diagnostics, self.latest):
            if source and source.get("locations"):
                return source["locations"]
        return {}

    def learned_history(self) -> dict[str, list[tuple[int, dict[str, list]]]]:
        """{name: [(step, {location: (layers, heads) nested list})]}: what the run's schemes
        learned per head over training (diagnostics/summary.json ``learned_history``)."""
        d = self.diagnostics or {}
        out: dict[str, list[tuple[int, dict[str, list]]]] = {}
        for h in d.get("learned_history") or []:
            for name, per_loc in (h.get("values") or {}).items():
                if per_loc:
                    out.setdefault(name, []).append((int(h["step"]), per_loc))
        return out

    def learned_title(self, name: str) -> str:
        return ((self.diagnostics or {}).get("learned_titles") or {}).get(name) or f"{name} per layer and head"

    @property
    def last_step(self) -> int | None:
        if self.summary:
            return self.summary.get("steps")
        if self.latest:
            return self.latest.get("step")
        return None

    @property
    def label(self) -> str:
        return f"{self.task} {self.scheme} h{self.heads}" + (f" [{self.variant}]" if self.variant else "")

    @property
    def tested(self) -> str:
        """Which weights the test used: 'step N', 'no validation' (the final weights), or '?' (older runs)."""
        t = (self.summary or {}).get("tested")
        if not isinstance(t, dict):
            return "?"
        return f"step {t.get('step')}" if t.get("checkpoint") else "no validation"


def load_run(run_dir: str | Path) -> Run:
    run_dir = Path(run_dir)
    diag = run_dir / "diagnostics"
    summary = _read_json(run_dir / "summary.json")
    failure = _read_json(run_dir / "failed.json")
    if summary is None and (run_dir / "summary.json").is_file():  # there, but not a JSON object: say so
        failure = {"reason": f"corrupt summary.json ({run_dir / 'summary.json'} is not readable JSON): restore it "
                             "or run the job again"}
    if summary:
        declare(summary.get("metrics"))  # the task's own metrics: titles and better direction
    return Run(path=run_dir, summary=summary, config=_read_config(run_dir), items_path=run_dir / ITEMS_FILE,
               diagnostics=_read_json(diag / "summary.json"), latest=_read_json(diag / "latest.json"),
               failure=failure)


def _is_run_dir(path: Path) -> bool:
    return (path / "summary.json").is_file() or (path / ".hydra" / "config.yaml").is_file()


def find_runs(paths: Iterable[str | Path]) -> list[Run]:
    """Every run directory at or below ``paths`` (finished and unfinished), sorted by path,
    each listed once. Raises FileNotFoundError for a path that does not exist."""
    paths = list(paths)
    found: dict[Path, Run] = {}
    for p in paths:
        root = Path(p)
        if not root.exists():
            raise FileNotFoundError(f"{p}: no such file or directory")
        if root.is_file():  # e.g. the summary.json itself
            root = root.parent
        if _is_run_dir(root):
            found.setdefault(root.resolve(), load_run(root))
            continue
        for dirpath, dirnames, _ in os.walk(root, followlinks=False):
            d = Path(dirpath)
            if _is_run_dir(d):
                found.setdefault(d.resolve(), load_run(d))
                dirnames[:] = []  # a run directory holds no further runs
                continue
            dirnames[:] = sorted(n for n in dirnames if n not in _SKIP_DIRS)
    for run in found.values():
        run.source = next((str(p) for p in paths if _under(run.path, p)), None)
    return [r for k in sorted(found) for r in (found[k], *eval_variants(found[k]))]


def overlapping_paths(paths: Iterable[str | Path]) -> list[tuple[str, str, str]]:
    """PATHs that share runs with an earlier PATH: ``(path, earlier, how)``, ``how`` "same" (one
    folder given twice, or by another spelling), "inside" (``path`` lies inside ``earlier``) or
    "contains". :func:`find_runs` counts those runs once; nas-report says so in a note."""
    out, seen = [], []
    for p in paths:
        here = Path(p)
        here = (here.parent if here.is_file() else here).resolve()
        for earlier, where in seen:
            how = "same" if here == where else "inside" if where in here.parents else \
                "contains" if here in where.parents else None
            if how:
                out.append((str(p), earlier, how))
                break
        seen.append((str(p), here))
    return out


def _under(path: Path, root) -> bool:
    root = Path(root)
    root = (root.parent if root.is_file() else root).resolve()
    return path.resolve() == root or root in path.resolve().parents


def eval_variants(run: Run) -> list[Run]:
    """``nas-eval`` results of a finished run (``eval/<name>.json`` on the test split), each as a
    run of its own (same config, the evaluation's metrics) named ``eval:<name>``."""
    out = []
    if not run.finished:
        return out
    for path in sorted((run.path / "eval").glob("*.json")):
        if path.name.endswith(".items.json"):
            continue
        data = _read_json(path)
        if not data or data.get("split") != "test" or not isinstance(data.get("metrics"), dict):
            continue
        declare(data.get("declared"))  # an evaluation's own metrics (zero-shot: titles, better direction)
        summary = {**run.summary, "test": data["metrics"], "tested": {"checkpoint": ",".join(
            Path(c).name for c in data.get("checkpoints", [])) or "?", "step": None},
            "lengths": data.get("lengths")}
        out.append(Run(path=run.path, summary=summary, config=run.config, diagnostics=run.diagnostics,
                       latest=run.latest, variant=f"eval:{path.stem}", source=run.source,
                       items_path=path.with_name(f"{path.stem}.items.json")))
    return out
