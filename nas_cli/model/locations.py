"""Where attention runs in nas-run's models, the one list every module reads: encoder
self-attention, decoder self-attention (causal) and cross-attention (decoder queries, encoder
keys). A decoder-only language model has the decoder location alone; an encoder-decoder
without encoder layers has no encoder self-attention."""
from __future__ import annotations

from contextlib import nullcontext
from types import MappingProxyType
from typing import Any

from omegaconf import DictConfig, open_dict

LOCATIONS: tuple[str, str, str] = ("encoder", "decoder", "cross")

#: what a location is called in a refusal
PLAIN = MappingProxyType({"encoder": "encoder self-attention", "decoder": "decoder self-attention", "cross": "cross-attention"})


def _get(node: Any, key: str, default=None):
    try:
        return node.get(key, default)
    except AttributeError:
        return default


def is_language_model(task_target: str | None) -> bool:
    """The one test of "is this task a language model": the task class's declared ``kind``
    (a user's LM task need not be named like the built-in one). False for a class that cannot
    be imported (the task itself reports that where it is built)."""
    if not task_target:
        return False
    from hydra.utils import get_class

    try:
        return getattr(get_class(str(task_target)), "kind", "seq2seq") == "lm"
    except Exception:  # noqa: BLE001 - reported when the task is built
        return False


def used_locations(task_target: str | None, model: Any) -> tuple[str, ...]:
    """The locations the model of this task and ``model`` config builds: ``("decoder",)`` for a
    language model, all three for an encoder-decoder (without ``encoder`` when nas-run's own
    Transformer has ``model.encoder_layers=0``)."""
    if is_language_model(task_target):
        return ("decoder",)
    if not _get(model, "family") and _get(model, "encoder_layers", 1) == 0:
        return ("decoder", "cross")
    return LOCATIONS


def job_locations(config: Any) -> tuple[str, ...]:
    """:func:`used_locations` of a whole composed config (a DictConfig or a plain dict)."""
    task = _get(config, "task") or {}
    return used_locations(_get(task, "_target_"), _get(config, "model") or {})


def name_from_choices(cfg: DictConfig, choices) -> bool:
    """Give each composed scheme node that has no ``name:`` the file stem Hydra chose for it
    (``choices``: ``hydra.runtime.choices``; ``attention`` for the global node,
    ``attention@attention.<location>`` for a location's), so that a scheme's YAML need not repeat
    its file name, and the tags, the saved config and a resumed run all say that stem. Returns
    whether a name was added."""
    node = cfg.get("attention") if isinstance(cfg, (DictConfig, dict)) else None
    if not isinstance(node, (DictConfig, dict)):
        return False
    added = False
    for key, sub in [("attention", node), *((f"attention@attention.{loc}", node.get(loc)) for loc in LOCATIONS)]:
        stem = choices.get(key) if choices else None
        if isinstance(sub, (DictConfig, dict)) and "_target_" in sub and not sub.get("name") and stem:
            with open_dict(sub) if isinstance(sub, DictConfig) else nullcontext():
                sub["name"] = str(stem).rsplit("/", 1)[-1]
            added = True
    return added


def hydra_choices() -> dict:
    """``hydra.runtime.choices`` of the job Hydra is running ({} outside one)."""
    from hydra.core.hydra_config import HydraConfig

    return dict(HydraConfig.get().runtime.choices) if HydraConfig.initialized() else {}
