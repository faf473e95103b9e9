"""Where attention runs in nas-run's models, the one list every module reads: encoder
self-attention, decoder self-attention (causal) and cross-attention (decoder queries, encoder
keys). A decoder-only language model has the decoder location alone; an encoder-decoder
without encoder layers has no encoder self-attention."""
from __future__ import annotations

from types import MappingProxyType
from typing import Any

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
