"""Resume: which checkpoint a run continues from, and whether it may.

* Which checkpoint a run continues from (:func:`pick_checkpoint`): the newest of
  ``checkpoints/last.ckpt``, ``checkpoints/step<N>.ckpt`` and Lightning's SLURM
  ``hpc_ckpt_<n>.ckpt`` that loads with ``torch.load(weights_only=True)``; an unreadable one is
  reported and the next older one is used.
* What a checkpoint carries besides Lightning's own state (model, optimizer, LR scheduler, loop
  progress, the training loader's position): :mod:`nas_cli.infra.fault_tolerance` adds the W&B run id,
  group and job type, a fingerprint of the configuration (:func:`config_fingerprint`) and the RNG
  states (:func:`rng_states`), all as plain types; :func:`fault_tolerance_state` reads them back.
* A run directory can be copied or moved: :class:`RunCheckpoint` maps the checkpoint paths it
  restores (``best_model_path`` and friends, saved as absolute paths by Lightning) into the
  directory the run is in now.

Writing ``last.ckpt`` and stopping on signals is :mod:`nas_cli.infra.fault_tolerance`.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from pytorch_lightning.callbacks import ModelCheckpoint

from nas_cli.errors import UserError
from nas_cli.infra.rundir import held_elsewhere


def checkpoint_files(run_dir: Path) -> list[Path]:
    """The checkpoints a run could continue from, newest first (best.ckpt is not a latest state)."""
    ckpt_dir = run_dir / "checkpoints"
    found = [*ckpt_dir.glob("last.ckpt"), *ckpt_dir.glob("step*.ckpt"), *run_dir.glob("hpc_ckpt_*.ckpt")]
    return sorted((p for p in found if p.is_file()), key=lambda p: p.stat().st_mtime_ns, reverse=True)


def load_safe(path: Path) -> dict[str, Any]:
    """A checkpoint through the restricted unpickler (tensors and plain containers only); memory-
    mapped, except for files in torch's legacy (non-zip) format, which cannot be."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as err:
        if "mmap can only be used" not in str(err):
            raise
        return torch.load(path, map_location="cpu", weights_only=True)


def pick_checkpoint(run_dir: Path, warn: Callable[[str], None]) -> tuple[Path, dict[str, Any]] | None:
    """Newest readable checkpoint of ``run_dir`` and its nas-run state; None if there is none."""
    found = checkpoint_files(run_dir)
    for path in found:
        try:
            ckpt = load_safe(path)
            if "state_dict" not in ckpt or "loops" not in ckpt:
                raise ValueError("not a full training checkpoint")
        except Exception as err:  # noqa: BLE001 - truncated, corrupt or foreign: fall back to an older one
            warn(f"checkpoint {path} is unreadable ({unreadable_reason(err)}); trying an older one")
            continue
        return path, {**fault_tolerance_state(ckpt), "global_step": int(ckpt.get("global_step", 0))}
    if found:
        raise UserError(f"no readable checkpoint in {run_dir} ({len(found)} found; none loads with "
                        "torch.load(weights_only=True)); start the run again in a new directory")
    return None


#: the key of nas-run's own state among a checkpoint's callbacks (the class
#: :class:`nas_cli.infra.fault_tolerance.FaultTolerance`, by which Lightning files its state)
FAULT_TOLERANCE_KEY = "FaultTolerance"


def fault_tolerance_state(ckpt: dict[str, Any]) -> dict[str, Any]:
    """nas-run's own state in a checkpoint (W&B run id, group, job type, config fingerprint, RNG)."""
    for key, value in ckpt.get("callbacks", {}).items():
        if str(key).startswith(FAULT_TOLERANCE_KEY):
            return value
    return {}


def unreadable_reason(err: BaseException) -> str:
    """Why a checkpoint was not loaded, in a few words (the safe loader's own message is a page)."""
    import pickle

    if isinstance(err, pickle.UnpicklingError) or "weights_only" in str(err) or "Weights only" in str(err):
        return "refused by the safe loader: it holds objects other than tensors and plain containers"
    if isinstance(err, (EOFError, RuntimeError)) and ("zip" in str(err).lower() or "EOF" in str(err)
                                                      or isinstance(err, EOFError)):
        return "truncated or not a checkpoint file"
    text = _first_line(err)
    return text if len(text) <= 160 else text[:157].rsplit(" ", 1)[0] + " ..."


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else type(err).__name__


def _override(overrides, key: str) -> str | None:
    for o in overrides or ():
        k, _, v = str(o).lstrip("+~").partition("=")
        if k == key:
            return v
    return None


def _misspelled_budget(overrides, run_dir: Path) -> str:
    """What the overrides of a refused ``resume=`` say instead of trainer.max_steps: a near miss of it that is no
    option of the run's config (trainer.max_epochs is one), or debug=fast (a resumed run continues as configured)."""
    import difflib

    from omegaconf import OmegaConf

    try:
        config = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    except Exception:  # noqa: BLE001 - unreadable: every near miss is named
        config = OmegaConf.create()
    for o in overrides or ():
        key, _, value = str(o).lstrip("+~").partition("=")
        if key == "debug":
            return f"; {key}={value} does not apply to a resumed run, which continues as it was configured"
        if OmegaConf.select(config, key, default="<absent>") != "<absent>":
            continue
        if key != "trainer.max_steps" and difflib.get_close_matches(key, ["trainer.max_steps"], n=1, cutoff=0.8):
            return f"; {key}={value} is no option: did you mean trainer.max_steps={value}?"
    return ""


def check_resumable(run_dir: Path, overrides=()) -> None:
    """``nas-run resume=<dir> [overrides]``: refuse (one line, before anything is written anywhere) what
    cannot be continued: no run there, a run another process is training, no checkpoint that loads,
    and a finished run asked for no more steps than it has (it is continued only to train it longer)."""
    if not run_dir.is_dir():
        raise UserError(f"resume={run_dir}: no such run directory")
    if not (run_dir / ".hydra" / "config.yaml").is_file():
        raise UserError(f"resume={run_dir}: not a nas-run run directory (no .hydra/config.yaml)")
    holder = held_elsewhere(run_dir)
    if holder:
        raise UserError(f"resume={run_dir}: another nas-run is training this run (PID {holder.get('pid')} on "
                        f"{holder.get('host')}, since {holder.get('since')}); wait for it to end, or stop it first")
    if not checkpoint_files(run_dir):
        raise UserError(f"resume={run_dir}: no checkpoint to continue from (checkpoints/last.ckpt); the run "
                        "stopped before its first one: start it again")
    summary = run_dir / "summary.json"
    if summary.is_file():
        try:
            done = int(json.loads(summary.read_text())["steps"])
        except (OSError, ValueError, KeyError, TypeError):
            done = None
        wanted = _override(overrides, "trainer.max_steps")
        try:
            more = wanted is not None and done is not None and int(wanted) > done
        except ValueError:
            more = False
        if not more:
            raise UserError(f"resume={run_dir}: that run is complete ({done} steps, summary.json); to train it "
                            f"longer pass trainer.max_steps=<more than {done}>"
                            + (f" (got trainer.max_steps={wanted})" if wanted is not None else "")
                            + _misspelled_budget(overrides, run_dir))
    _check_loadable(run_dir)


def _check_loadable(run_dir: Path) -> None:
    """At least one checkpoint to continue from loads; else one line saying what the run still has."""
    found = checkpoint_files(run_dir)
    reasons = []
    for path in found:
        try:
            ckpt = load_safe(path)
            if "state_dict" in ckpt and "loops" in ckpt:
                return
            reasons.append(f"{path.name}: not a full training checkpoint")
        except Exception as err:  # noqa: BLE001 - truncated, corrupt or foreign: say which
            reasons.append(f"{path.name}: {unreadable_reason(err)}")
    has = [name for name in ("summary.json", "checkpoints/best.ckpt") if (run_dir / name).is_file()]
    if (run_dir / "summary.json").is_file():
        kept = (f"the finished run is unchanged ({' and '.join(has)}): nas-eval {run_dir} scores it; to train "
                "longer, start a new run with its config")
    else:
        kept = "start the run again in a new directory" + (f" (it still has {has[-1]}: nas-eval --ckpt "
                                                           f"{run_dir / has[-1]})" if has else "")
    raise UserError(f"resume={run_dir}: no checkpoint to continue from loads ({'; '.join(reasons)}); {kept}")


def kept_summary(run_dir: Path) -> Path | None:
    """Where a finished run trained longer keeps its earlier summary: ``summary.step<N>.json``. The file
    stays summary.json (the run stays finished) until the continued run writes its own
    (:func:`keep_summary`); None for a run that has no summary."""
    summary = run_dir / "summary.json"
    if not summary.is_file():
        return None
    try:
        steps = int(json.loads(summary.read_text()).get("steps", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        steps = 0
    return run_dir / f"summary.step{steps}.json"


def keep_summary(run_dir: Path, kept: Path | None) -> None:
    """The continued run finished: its earlier summary moves to ``kept`` before the new one is written."""
    if kept is not None and (run_dir / "summary.json").is_file():
        os.replace(run_dir / "summary.json", kept)


def config_fingerprint(cfg) -> str:
    """What must not change when a run is continued: model, attention, task name and seed."""
    from omegaconf import OmegaConf

    from nas_cli.infra.config_identity import added_at_default

    data = {k: OmegaConf.to_container(cfg[k], resolve=True) for k in ("model", "attention")}
    # options added to the model since runs were made, at their default: those runs' checkpoints still match
    data["model"] = {k: v for k, v in data["model"].items() if not added_at_default(f"model.{k}", v)}
    data.update(task=str(cfg.task.name), seed=int(cfg.seed))
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def rng_states() -> dict[str, Any]:
    """Python, numpy and torch RNG states as types ``torch.load(weights_only=True)`` accepts."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    out = {"python": [version, list(internal), gauss_next],
           "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)],
           "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_states(state: dict[str, Any]) -> None:
    if "python" in state:
        version, internal, gauss_next = state["python"]
        random.setstate((version, tuple(internal), gauss_next))
    if "numpy" in state:
        kind, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class RunCheckpoint(ModelCheckpoint):
    """``best.ckpt`` as Lightning keeps it, but restored paths follow the run directory: a run
    copied or moved elsewhere and resumed tests its own ``best.ckpt``, not the original's."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        old, new = state_dict.get("dirpath"), self.dirpath
        if old and new and os.path.normpath(old) != os.path.normpath(new):
            state_dict = relocate_paths(state_dict, old, new)
        super().load_state_dict(state_dict)


def relocate_paths(state: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    """ModelCheckpoint state with every path under ``old`` re-rooted under ``new``."""
    def move(path: Any) -> Any:
        if not isinstance(path, str) or not path:
            return path
        rel = os.path.relpath(path, old)
        return path if rel.startswith("..") else os.path.join(new, rel)

    out = dict(state, dirpath=new)
    for key in ("best_model_path", "kth_best_model_path", "last_model_path"):
        if key in out:
            out[key] = move(out[key])
    if isinstance(out.get("best_k_models"), dict):
        out["best_k_models"] = {move(k): v for k, v in out["best_k_models"].items()}
    return out


