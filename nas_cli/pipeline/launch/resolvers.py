"""The ``${nas.*:...}`` resolvers the configs use, registered by an explicit call.

Every entry point (``nas-run``, ``nas-eval``, ``nas-repro``, ...) calls
:func:`register_resolvers` before composing or loading a config; nothing registers them as
a side effect of being imported.
"""
from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

import yaml
from omegaconf import OmegaConf


def optuna_direction(target: str, mode=None) -> str:
    """``sweep=optuna``: maximize or minimize, as the task chooses its best checkpoint
    (``task.monitor_mode``, else the task class's default: max for BLEU/exact match, min for loss)."""
    from hydra.utils import get_class

    if mode not in ("min", "max"):
        mode = get_class(str(target)).monitor_mode
    return "maximize" if mode == "max" else "minimize"


def _devices(devices) -> int | None:
    try:
        return int(devices) if int(devices) > 0 else None
    except (TypeError, ValueError):  # "auto"
        return None


def slurm_tasks(devices) -> int:
    """``hydra/launcher=slurm``: one SLURM task per device (Lightning takes its rank from SLURM)."""
    return _devices(devices) or 1


def slurm_gpus(accelerator, devices) -> int | None:
    """GPUs to request per node: trainer.devices when the trainer asks for GPUs
    (``trainer.accelerator=gpu``/``cuda``, as trainer=gpu and trainer=ddp do), else none. The
    default ``auto`` asks for none: what the submitting machine has says nothing about the
    cluster's nodes, and a job meant for the CPU must not hold a GPU (or fail on a CPU
    partition with "Invalid generic resource")."""
    return _devices(devices) if str(accelerator) in ("gpu", "cuda") else None


def scheme_tag(attention, task_target, model) -> str:
    """``${nas.tag:${attention},${task._target_},${model}}``: 'dnas', or 'enc-hnas_dec-unas_cross-unas'
    when the locations the model has run different schemes (a language model: its decoder's)."""
    from nas_cli.model.plan import tag_resolver

    return tag_resolver(attention, task_target, model)


def positions_tag(model) -> str:
    """``${nas.positions:${model}}``: ``-<positions>`` in a single run's directory name when nas-run's own
    model adds positions other than sinusoids (``copy_lm/sigmoid-alibi-h4``, ``mqar/unas-rope-h2``), so that
    runs of other positions are told apart by name; nothing for sinusoids and for a Hugging Face family
    (its positions are its own). A sweep's job folders name them too (:func:`job_subdir`)."""
    try:
        positions = model.get("positions") if hasattr(model, "get") else None
        family = model.get("family") if hasattr(model, "get") else None
    except Exception:  # noqa: BLE001 - an unresolvable node: the pre-run check says what is wrong
        return ""
    return "" if family or positions in (None, "sinusoidal") else f"-{positions}"


def job_subdir(sweep_dir, num, task, tag, model) -> str:
    """``hydra.sweep.subdir``: ``<job number>_<task>_<scheme tag><positions>-h<heads>`` (``3_copy_lm_sigmoid-alibi-h4``).
    A sweep continued in a folder whose job of this number was made under the earlier name, without the
    positions (``3_copy_lm_sigmoid-h4``) and of the same positions, keeps that folder: it continues there."""
    positions = positions_tag(model)
    heads = model.get("heads") if hasattr(model, "get") else None
    named = f"{num}_{task}_{tag}{positions}-h{heads}"
    if not positions:
        return named
    earlier = f"{num}_{task}_{tag}-h{heads}"
    config = Path(str(sweep_dir)) / earlier / ".hydra" / "config.yaml"
    try:
        made = yaml.safe_load(config.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return named
    same = isinstance(made.get("model"), dict) and made["model"].get("positions") == model.get("positions")
    return earlier if same else named


#: Zoology's Figure 2 cells (Arora et al. 2023; paper_configs/iclr24_zoology_figure2/configs.py): sequence
#: length -> (key-value pairs, batch size)
ZOOLOGY_FIG2 = MappingProxyType({64: (4, 512), 128: (8, 512), 256: (16, 256), 512: (64, 128)})


def zoology_fig2(what: str, seq_len) -> int:
    """``${nas.zoology_fig2:pairs,${task.seq_len}}`` (or ``batch``): the number of key-value pairs or the batch
    size of Zoology's Figure 2 cell at that sequence length (experiment=zoology_fig2)."""
    try:
        pairs, batch = ZOOLOGY_FIG2[int(seq_len)]
    except (KeyError, TypeError, ValueError):
        cells = ", ".join(str(k) for k in ZOOLOGY_FIG2)
        raise ValueError(f"experiment=zoology_fig2 has Figure 2's cells task.seq_len={cells} (got {seq_len}); for "
                         "another length set task.num_kv_pairs and task.batch_size too") from None
    return pairs if what == "pairs" else batch


RESOLVERS = MappingProxyType({
    "nas.zoology_fig2": zoology_fig2, "nas.positions": positions_tag, "nas.job_subdir": job_subdir, "nas.tag": scheme_tag,
    "nas.direction": optuna_direction, "nas.slurm_tasks": slurm_tasks, "nas.slurm_gpus": slurm_gpus})


def register_resolvers() -> None:
    """Register the ``nas.*`` resolvers (idempotent)."""
    for name, fn in RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
