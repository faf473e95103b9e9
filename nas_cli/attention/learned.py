"""The values attention cores learn per head (:meth:`~nas_cli.attention.base.AttentionCore.learned`),
gathered from a whole model for the loggers, summary.json and the diagnostics' figures."""
from __future__ import annotations

import numpy as np
from torch import nn

from nas_cli.attention.base import AttentionCore


def learned_values(model: nn.Module) -> dict[str, dict[str, np.ndarray]]:
    """Every attention core's :meth:`AttentionCore.learned` values in ``model``:
    {name: {location: (layers, heads) array}} (layers missing a value are NaN rows)."""
    cells: dict[str, dict[str, dict[int, np.ndarray]]] = {}
    for module in model.modules():
        if isinstance(module, AttentionCore):
            for name, value in module.learned().items():
                per_loc = cells.setdefault(name, {}).setdefault(module.location, {})
                per_loc[module.layer] = value.detach().float().cpu().numpy().reshape(-1)
    out: dict[str, dict[str, np.ndarray]] = {}
    for name, locs in cells.items():
        for loc, layers in locs.items():
            heads = max(len(v) for v in layers.values())
            arr = np.full((1 + max(layers), heads), np.nan)
            for layer, value in layers.items():
                arr[layer, :len(value)] = value
            out.setdefault(name, {})[loc] = arr
    return out


def learned_titles(model: nn.Module) -> dict[str, str]:
    """{name: figure title} of the learned values of ``model``'s cores."""
    titles: dict[str, str] = {}
    for module in model.modules():
        if isinstance(module, AttentionCore):
            for name in module.learned():
                titles.setdefault(name, module.learned_titles.get(name, f"{name} per layer and head"))
    return titles


def learned_scalars(values: dict[str, dict[str, np.ndarray]]) -> dict[str, float]:
    """:func:`learned_values` as logger keys: ``<name>/<location>/L<layer>/h<head>`` and
    ``<name>/<location>/L<layer>/mean``."""
    out: dict[str, float] = {}
    for name, locs in values.items():
        for loc, arr in locs.items():
            for layer, row in enumerate(arr):
                for head, val in enumerate(row):
                    out[f"{name}/{loc}/L{layer}/h{head}"] = float(val)
                out[f"{name}/{loc}/L{layer}/mean"] = float(np.nanmean(row))
    return out
