"""Figures for attention diagnostics (matplotlib, Agg backend; files only).

* ``plot_jsd_heatmaps``: H x H head-JSD matrices, one panel per layer (Zheng et al. 2021,
  CODA Figs. 2 and 4).
* ``plot_log_mass_histograms``: overlaid histograms of log_e sum_i pi_ij (e.g. UNAS vs DNAS)
  with a vertical line at -log Sk (Ding et al. 2020, Fig. 1; Theorem 2's DNAS floor).
* ``plot_u_trajectories``: HNAS mixing weights u per layer and head over training steps
  (Ding et al. Figs. 3-5).

Every function takes plain numpy arrays or torch tensors and a path, writes a PNG and
returns the path.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["plot_jsd_heatmaps", "plot_log_mass_histograms", "plot_trajectories"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display on training machines
    import matplotlib.pyplot as plt

    return plt


def _np(x: Any) -> np.ndarray:
    """torch tensor (any device) or array-like -> float64 numpy array."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def _save(fig, path: str | Path) -> Path:
    plt = _pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _grid(n: int, max_cols: int = 4) -> tuple[int, int]:
    cols = min(max_cols, max(n, 1))
    return math.ceil(max(n, 1) / cols), cols


def plot_jsd_heatmaps(
    matrices: Sequence[Any] | Mapping[str, Any],
    path: str | Path,
    titles: Sequence[str] | None = None,
    vmax: float | None = None,
    suptitle: str | None = None,
) -> Path:
    """One heat map per layer of an (H, H) head-JSD matrix (CODA Figs. 2/4).

    ``matrices``: a list of (H, H) arrays (layer order) or {panel title: (H, H)}.
    All panels share one colour scale (0 .. ``vmax``, default the largest entry) so layers
    can be compared; each title carries the mean over head pairs i < i'.
    """
    plt = _pyplot()
    if isinstance(matrices, Mapping):
        titles = list(matrices.keys()) if titles is None else list(titles)
        mats = [_np(m) for m in matrices.values()]
    else:
        mats = [_np(m) for m in matrices]
        titles = [f"layer {i}" for i in range(len(mats))] if titles is None else list(titles)
    if not mats:
        raise ValueError("plot_jsd_heatmaps needs at least one matrix")
    top = vmax if vmax is not None else max(float(m.max()) for m in mats)
    top = top if top > 0 else 1.0
    rows, cols = _grid(len(mats))
    height = 3.0 * rows + (0.4 if suptitle else 0.0)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols + 0.8, height), squeeze=False)
    fig.subplots_adjust(left=0.06, right=0.86, bottom=0.6 / height, top=1 - (0.75 if suptitle else 0.35) / height,
                        wspace=0.35, hspace=0.45)
    im = None
    for k, ax in enumerate(axes.ravel()):
        if k >= len(mats):
            ax.axis("off")
            continue
        m = mats[k]
        h = m.shape[0]
        pair_mean = float(m[np.triu_indices(h, 1)].mean()) if h > 1 else 0.0
        im = ax.imshow(m, vmin=0.0, vmax=top, cmap="viridis")
        ax.set_title(f"{titles[k]} (mean {pair_mean:.3g})", fontsize=9)
        ax.set_xticks(range(h))
        ax.set_yticks(range(h))
        ax.tick_params(labelsize=7)
        ax.set_xlabel("head", fontsize=8)
        ax.set_ylabel("head", fontsize=8)
    cax = fig.add_axes([0.89, 0.15, 0.02, 0.7])
    fig.colorbar(im, cax=cax, label="JSD")
    if suptitle:
        fig.suptitle(suptitle, fontsize=10)
    return _save(fig, path)


def plot_log_mass_histograms(
    histograms: Mapping[str, Any],
    path: str | Path,
    bin_edges: Any | None = None,
    neg_log_sk: float | None = None,
    title: str | None = None,
) -> Path:
    """Overlaid histograms of log_e(sum_i pi_ij) over keys (Ding et al. Fig. 1).

    ``histograms``: {label: counts} where counts is (n_bins,) or (H, n_bins) (summed over
    heads) on the shared ``bin_edges`` (n_bins + 1,); a value may also be an
    ``ExplainedAwayStats``, whose own counts, edges and -log Sk are used. Each curve is
    normalized to the fraction of keys. A dashed vertical line marks -log Sk, the DNAS
    floor of Theorem 2 (skipped if unknown).
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 3.8))
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.14, top=0.9)
    colours = ["tab:blue", "tab:red", "tab:green", "tab:orange", "tab:purple", "tab:brown"]
    for k, (label, h) in enumerate(histograms.items()):
        edges = bin_edges
        if hasattr(h, "counts") and hasattr(h, "bin_edges"):
            edges = h.bin_edges if edges is None else edges
            if neg_log_sk is None and getattr(h, "sk_max", 0):
                neg_log_sk = h.neg_log_sk
            h = h.counts
        if edges is None:
            raise ValueError("bin_edges must be given for plain count arrays")
        edges = _np(edges)
        counts = _np(h)
        if counts.ndim == 2:
            counts = counts.sum(0)  # (H, n_bins) -> (n_bins,)
        if counts.shape[0] != len(edges) - 1:
            raise ValueError(f"{label}: {counts.shape[0]} counts for {len(edges) - 1} bins")
        total = counts.sum()
        frac = counts / total if total > 0 else counts
        ax.stairs(frac, edges, fill=True, alpha=0.35, color=colours[k % len(colours)], label=label)
        ax.stairs(frac, edges, color=colours[k % len(colours)], lw=1.0)
    if neg_log_sk is not None and np.isfinite(neg_log_sk):
        ax.axvline(neg_log_sk, color="k", ls="--", lw=1.0, label=f"-log Sk = {neg_log_sk:.2f}")
    ax.set_xlabel("log(sum_i pi_ij)  (first bin: at or below its edge)")
    ax.set_ylabel("fraction of keys")
    ax.set_title(title or "attention mass received per key")
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_trajectories(
    history: Sequence[tuple[int, Any]],
    path: str | Path,
    layer_names: Sequence[str] | None = None,
    title: str | None = None,
    name: str = "value",
) -> Path:
    """A per-head value a scheme learns, over training (e.g. HNAS's u, as in Ding et al.
    Figs. 3-5).

    ``history``: [(step, value (layers, heads))] in any order. The first panel shows the mean
    of every layer against the step; one further panel per layer shows its heads. Values that
    all lie in [0, 1] are drawn on that fixed scale.
    """
    plt = _pyplot()
    if not history:
        raise ValueError("plot_trajectories needs at least one (step, value) entry")
    hist = sorted(((int(s), _np(u)) for s, u in history), key=lambda t: t[0])
    steps = np.array([s for s, _ in hist])
    arrays = [a[:, None] if a.ndim == 1 else a for _, a in hist]  # (layers,) = one head per layer
    if any(a.ndim != 2 or a.shape != arrays[0].shape for a in arrays):
        raise ValueError(f"every {name} must be a (layers, heads) array of the same shape")
    u = np.stack(arrays)  # (T, L, H)
    n_layers, n_heads = u.shape[1], u.shape[2]
    names = list(layer_names) if layer_names is not None else [f"layer {i}" for i in range(n_layers)]
    rows, cols = _grid(n_layers + 1)
    height = 2.7 * rows + (0.4 if title else 0.0)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, height), squeeze=False)
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.45 / height, top=1 - (0.75 if title else 0.35) / height,
                        wspace=0.3, hspace=0.5)
    cmap = plt.get_cmap("viridis")
    ax0 = axes[0][0]
    for layer in range(n_layers):
        ax0.plot(steps, u[:, layer].mean(-1), color=cmap(layer / max(n_layers - 1, 1)), label=names[layer])
    unit = bool(np.nanmin(u) >= 0 and np.nanmax(u) <= 1)
    ax0.set_title(f"mean {name} per layer", fontsize=9)
    if unit:
        ax0.set_ylim(-0.02, 1.02)
    ax0.set_xlabel("step", fontsize=8)
    ax0.set_ylabel(name, fontsize=8)
    if n_layers <= 12:
        ax0.legend(fontsize=6)
    for layer in range(n_layers):
        ax = axes.ravel()[layer + 1]
        for head in range(n_heads):
            ax.plot(steps, u[:, layer, head], lw=0.9, color=plt.get_cmap("tab20")(head % 20))
        ax.plot(steps, u[:, layer].mean(-1), "k--", lw=1.2)
        ax.set_title(f"{names[layer]}: {n_heads} heads (dashed: mean)", fontsize=8)
        if unit:
            ax.set_ylim(-0.02, 1.02)
        ax.tick_params(labelsize=7)
    for ax in axes.ravel()[n_layers + 1:]:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(fig, path)
