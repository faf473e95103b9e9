"""A configuration's identity without its seed: what groups the seeds of one setup.

``config_id`` hashes the composed config minus the seed and the settings that change only what
is logged or saved (``IGNORED_KEYS``); ``task.seed`` is left out where it just follows the run's
seed (the translation tasks' batch order). Every run carries it in its W&B config and as the
tag ``cfg:<id>`` (group the W&B runs table by it to collapse seeds), and in ``summary.json``;
``nas-report`` groups runs by the same rule.
"""
from __future__ import annotations

import hashlib
import json
from types import MappingProxyType
from typing import Any

#: config keys that never split a group: the seed (what groups average over), what a tuned sweep
#: chooses among (tune, tune_seeds: how nas-report reads the runs, not how they train), settings that
#: change only what is logged or saved or evaluated after training (lm_eval: the zero-shot tasks), and the CPU
#: thread count (it changes round-off, not the setup)
IGNORED_KEYS = ("seed", "tune", "tune_seeds", "progress_bar", "progress_lines", "log_learned_every", "logger",
                "diagnostics", "run_test", "checkpoint", "threads", "lm_eval")
#: keys added after runs were made, left out at their default so that those runs keep their id; set, they
#: split a group (smaller training batches train another model; with a batch limit, smaller evaluation
#: batches score other items; other test lengths give other test metrics; a token budget another length of
#: training; the wsd schedule's decay share another schedule; the head settings of nas_cli/model/heads.py
#: and document masking another model)
ADDED_DEFAULTS = MappingProxyType({"train_batch_items": None, "eval_batch_items": None, "eval_lengths": None,
                                   "train_tokens": None, "optim.decay_fraction": 0.2,
                                   "model.kv_heads": None, "model.qk_norm": False, "model.rope_scaling": None,
                                   "model.mla": None, "task.document_mask": False})


def added_at_default(key: str, value) -> bool:
    return key in ADDED_DEFAULTS and value == ADDED_DEFAULTS[key] and type(value) is type(ADDED_DEFAULTS[key])


def ignored(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in IGNORED_KEYS)


def flatten(node: Any, prefix: str = "", hashable: bool = False) -> dict[str, Any]:
    """Nested dicts -> {"a.b.c": value}; ``hashable``: lists become tuples (nested ones too), so
    that values can be grouped on (config_id keeps lists as they are: it hashes their repr)."""
    out: dict[str, Any] = {}
    if isinstance(node, dict):
        for k, v in node.items():
            out.update(flatten(v, f"{prefix}{k}.", hashable))
    elif hashable and isinstance(node, list):
        out[prefix[:-1]] = _hashable(node)
    else:
        out[prefix[:-1]] = node
    return out


def _hashable(v):
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _hashable(x)) for k, x in v.items()))
    return v


def identity(config: dict) -> dict[str, Any]:
    """The flattened config that defines a setup (seed and logging-only keys removed)."""
    flat = flatten(config)
    seed = flat.get("seed")
    return {k: v for k, v in flat.items()
            if not ignored(k) and not (k == "task.seed" and seed is not None and v == seed)
            and not added_at_default(k, v)}


def config_id(config: dict) -> str:
    data = json.dumps(sorted((k, repr(v)) for k, v in identity(config).items()))
    return hashlib.sha256(data.encode()).hexdigest()[:12]
