"""Every figure nas-run draws (matplotlib, Agg backend: files only, no display).

One drawing per figure, two ways out: the functions without a prefix return PNG bytes (what
``nas-report`` embeds in its HTML page); the ``plot_*`` functions take one run's arrays or
tensors and a path, write the PNG and return the path (the diagnostics callback and
``nas-repro``). Rows are runs, columns are layers; colour scales and bins are shared.

* head-JSD heat maps (Zheng et al. 2021, CODA Figs. 2 and 4): :func:`heatmap_grid`,
  :func:`plot_jsd_heatmaps`;
* the histogram of log_e sum_i pi_ij over keys with -log Sk marked (Ding et al. 2020, Fig. 1,
  Theorem 2's DNAS floor): :func:`log_mass_overlay`, :func:`plot_log_mass_histograms`;
* a per-head value a scheme learns, over training (HNAS's u, Ding et al. Figs. 3-5):
  :func:`trajectory_panels`, :func:`plot_trajectories`;
* a metric against the number of heads (CODA Fig. 3): :func:`metric_vs_heads`.

Only numpy and matplotlib are imported, so the report starts without loading torch.
"""
from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["metric_vs_heads", "heatmap_grid", "log_mass_overlay", "histogram_range", "trajectory_panels",
           "plot_jsd_heatmaps", "plot_log_mass_histograms", "plot_trajectories"]

COLOURS = ("tab:blue", "tab:red", "tab:green", "tab:orange", "tab:purple", "tab:brown", "tab:pink", "tab:gray")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    """The figure as PNG bytes. zlib level 1: the same pixels (PNG is lossless) about 10% larger, and
    a third less time in the encoder, which every run pays six times at its end."""
    plt = _pyplot()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, pil_kwargs={"compress_level": 1})
    plt.close(fig)
    return buf.getvalue()


def _margins(fig, left: float, right: float, bottom: float, top: float, rows: int = 1, cols: int = 1,
             wgap: float = 0.0, hgap: float = 0.0) -> None:
    """Place a grid of axes by margins and gaps in inches: for the figures every run draws, whose
    labels have known sizes, instead of ``tight_layout``, which measures every label by drawing the
    figure once more (half of these figures' time)."""
    width, height = fig.get_size_inches()
    cell_w = (width - left - right - (cols - 1) * wgap) / cols
    cell_h = (height - top - bottom - (rows - 1) * hgap) / rows
    fig.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height,
                        wspace=wgap / cell_w, hspace=hgap / cell_h)


def metric_vs_heads(series: dict[str, list[tuple[int, float, float]]], panels: Sequence[tuple[str, bool | None]],
                    data: dict[str, dict[str, list[tuple[int, float, float]]]], title: str, xlabel: str = "heads",
                    bounds: tuple[float, float] | None = None, exact_ticks: bool = True) -> bytes:
    """CODA Fig. 3 style: one panel per metric, x = heads (log2 axis), one line per series; with
    ``xlabel`` another power-of-2 axis (the evaluated length, ``eval_lengths``).

    ``panels``: [(metric title, higher is better; None for a number with no better direction)]; ``data[metric title][series]`` =
    [(heads, mean, std)] (std drawn as error bars). ``series`` fixes the line order/colours.
    ``bounds``: the range the metric can take (an accuracy's 0 to 100): the axis stays inside it and
    a bar past it is cut at the edge (and the axis stays linear). A panel of positive means that span a factor of 10 or more (a
    perplexity that blows up past the training length) gets a log axis, titled so, on which a bar
    reaching 0 or below is cut at the axis's bottom. ``exact_ticks=False``: x on a log10 axis with its own ticks
    (a size in bytes, which the points do not share).
    """
    plt = _pyplot()
    plotted = max(4.2 * len(panels), 5.0)
    legend = 0.7 + 0.065 * max((len(str(s)) for s in series), default=0)  # inches: the longest label fits
    fig, axes = plt.subplots(1, len(panels), figsize=(plotted + legend, 3.4), squeeze=False)
    heads = sorted({h for d in data.values() for pts in d.values() for h, _, _ in pts})
    for ax, (name, higher) in zip(axes[0], panels):
        for k, s in enumerate(series):
            pts = sorted(data.get(name, {}).get(s, []))
            if pts:
                ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], capsize=3,
                            color=COLOURS[k % len(COLOURS)], label=s, **_line_style(k))
        points = [p for pts in data.get(name, {}).values() for p in pts]
        log = bounds is None and _wants_log_axis(points)  # a bounded metric (an accuracy) keeps a linear axis
        if exact_ticks:
            ax.set_xscale("log", base=2)
            ax.set_xticks(heads)
            ax.set_xticklabels([str(h) for h in heads])
            ax.minorticks_off()
        else:  # sizes in bytes on a log axis, a tick at each panel's own points
            shown = sorted({p[0] for pts in data.get(name, {}).values() for p in pts})
            ax.set_xscale("log", base=10)
            ax.set_xticks(shown)
            ax.set_xticklabels([_bytes(x) for x in shown], fontsize=7, rotation=30)
            ax.minorticks_off()
        ax.set_xlabel(xlabel)
        notes = ([] if higher is None else [f"{'higher' if higher else 'lower'} is better"]) + (["log axis"] if log else [])
        ax.set_title(f"{name} ({'; '.join(notes)})" if notes else name, fontsize=9)
        if log:
            _log_ylim(ax, points)
        else:
            _honest_ylim(ax, points, bounds)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.suptitle(title, fontsize=10)
    split = plotted / (plotted + legend)
    fig.tight_layout(rect=(0, 0, split, 1))
    if handles:  # one legend for all panels, outside the axes
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(split, 0.5), fontsize=7, frameon=False)
    return _png(fig)


def _bytes(x: float) -> str:
    for unit, size in (("MiB", 2**20), ("KiB", 2**10)):
        if x >= size:
            return f"{x / size:.3g} {unit}"
    return f"{x:.0f} B"


def _line_style(k: int) -> dict:
    """The k-th series' line and marker: past the colours, the same colours again, dashed with squares,
    then dotted with triangles, so that no two series of one figure look alike."""
    style = k // len(COLOURS) % 3
    return {"linestyle": ("-", "--", ":")[style], "marker": ("o", "s", "^")[style]}


def _honest_ylim(ax, points, bounds: tuple[float, float] | None = None) -> None:
    """y-limits that show every interval and never blow a negligible gap up to the full axis:
    the axis spans at least 5% of the values' magnitude; with ``bounds``, never past them (plus the
    pad), so an interval wider than the metric's range is cut at its edge."""
    if not points:
        return
    lo = min(m - (e if math.isfinite(e) else 0) for _, m, e in points)
    hi = max(m + (e if math.isfinite(e) else 0) for _, m, e in points)
    if bounds is not None:
        lo, hi = max(lo, bounds[0]), min(hi, bounds[1])
    floor = 0.05 * max(abs(lo), abs(hi), 1e-9)
    if hi - lo < floor:
        mid = (hi + lo) / 2
        lo, hi = mid - floor / 2, mid + floor / 2
    pad = 0.04 * (hi - lo) if bounds is not None else 0.08 * (hi - lo)
    ax.set_ylim(lo - pad, hi + pad)


def _wants_log_axis(points) -> bool:
    """Positive means spanning a factor of 10 or more: on a linear axis the smaller ones merge."""
    means = [m for _, m, _ in points if math.isfinite(m)]
    return bool(means) and min(means) > 0 and max(means) >= 10 * min(means)


def _log_ylim(ax, points) -> None:
    """A log axis from just below the lowest positive bar end (a mean's own value where its bar
    reaches 0 or below) to just above the highest one."""
    ax.set_yscale("log")
    ends = [m - e if math.isfinite(e) and m - e > 0 else m for _, m, e in points]
    tops = [m + (e if math.isfinite(e) else 0) for _, m, e in points]
    ax.set_ylim(min(ends) / 1.2, max(tops) * 1.2)


def heatmap_grid(rows: Sequence[tuple[str, Sequence[np.ndarray]]], title: str,
                 col_titles: Sequence[str] | None = None, vmax: float | None = None) -> bytes:
    """Head-JSD matrices side by side: one row per run (label, [H x H per layer]), one column
    per layer (titled ``layer c`` unless ``col_titles``), one colour scale for all panels
    (0 .. ``vmax``, default the largest entry; CODA Figs. 2/4). Each title carries the mean
    over head pairs i < i'."""
    plt = _pyplot()
    n_cols = max(len(mats) for _, mats in rows)
    top = vmax if vmax is not None else max((float(np.max(m)) for _, mats in rows for m in mats), default=1.0)
    top = top if top > 0 else 1.0
    fig, axes = plt.subplots(len(rows), n_cols, figsize=(2.3 * n_cols + 1.6, 2.1 * len(rows) + 0.6), squeeze=False)
    im = None
    for r, (label, mats) in enumerate(rows):
        for c in range(n_cols):
            ax = axes[r][c]
            if c >= len(mats):
                ax.axis("off")
                continue
            m = np.asarray(mats[c], dtype=float)
            h = m.shape[0]
            pair = float(m[np.triu_indices(h, 1)].mean()) if h > 1 else 0.0
            im = ax.imshow(m, vmin=0.0, vmax=top, cmap="viridis")
            ax.set_title(f"{col_titles[c] if col_titles else f'layer {c}'} (mean {pair:.3g})", fontsize=8)
            ax.set_xticks(range(h))
            ax.set_yticks(range(h))
            ax.tick_params(labelsize=6)
            if c == 0:
                ax.set_ylabel(label, fontsize=8)
    fig.suptitle(title, fontsize=10)
    # the colour bar 0.15 inches wide, with 0.9 inches for its labels at the right edge (a share of
    # the width clipped them in narrow figures)
    _margins(fig, left=0.55, right=1.35, bottom=0.3, top=0.62, rows=len(rows), cols=n_cols, wgap=0.4, hgap=0.55)
    if im is not None:
        width = fig.get_size_inches()[0]
        fig.colorbar(im, cax=fig.add_axes([1 - 1.05 / width, 0.15, 0.15 / width, 0.7]), label="JSD")
    return _png(fig)


def log_mass_overlay(hists: dict[str, np.ndarray], edges: np.ndarray, neg_log_sk: float | None, title: str) -> bytes:
    """Ding et al. Fig. 1: fraction of keys per bin of log sum_i pi_ij, one curve per label,
    dashed line at -log Sk (Theorem 2's DNAS floor for the longest sample)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.2, 3.4))
    for k, (label, counts) in enumerate(hists.items()):
        counts = np.asarray(counts, dtype=float)
        frac = counts / counts.sum() if counts.sum() > 0 else counts
        colour = COLOURS[k % len(COLOURS)]
        ax.stairs(frac, edges, fill=True, alpha=0.3, color=colour, label=label)
        ax.stairs(frac, edges, color=colour, lw=1.0)
    if neg_log_sk is not None and math.isfinite(neg_log_sk):
        ax.axvline(neg_log_sk, color="k", ls="--", lw=1.0, label=f"-log Sk = {neg_log_sk:.2f}")
    ax.set_xlim(*histogram_range(list(hists.values()), edges, neg_log_sk))
    ax.set_xlabel("log(sum_i pi_ij)  (first bin: at or below its edge)", fontsize=8)
    ax.set_ylabel("fraction of keys", fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)  # outside the axes
    _margins(fig, left=0.7, right=1.45, bottom=0.55, top=0.35)  # the legend's labels fit 1.4 inches
    return _png(fig)


def histogram_range(counts: Sequence[np.ndarray], edges: np.ndarray, neg_log_sk: float | None = None,
                    pad: float = 2.0) -> tuple[float, float]:
    """x-range that shows every non-empty bin and the -log Sk line, with ``pad`` to spare:
    with no key explained away all mass sits near 0 and the fixed bins' full range
    (down to -50) would squeeze it into one sliver."""
    nonzero = np.flatnonzero(np.sum([np.asarray(c, dtype=float) for c in counts], axis=0) > 0)
    lo = float(edges[nonzero[0]]) if nonzero.size else float(edges[0])
    hi = float(edges[nonzero[-1] + 1]) if nonzero.size else float(edges[-1])
    if neg_log_sk is not None and math.isfinite(neg_log_sk):
        lo, hi = min(lo, neg_log_sk), max(hi, neg_log_sk)
    return max(float(edges[0]), lo - pad), min(float(edges[-1]), hi + pad)


def trajectory_panels(steps: Sequence[int], u: np.ndarray, names: Sequence[str], title: str) -> bytes:
    """A per-head value a scheme learns, over training: ``u`` (T, layers, heads); one panel per
    layer with its heads (thin) and their mean (dashed), on [0, 1] when every value lies there
    (HNAS's u: 1 is DNAS, 0 UNAS, Ding et al. Figs. 3-5)."""
    plt = _pyplot()
    n = u.shape[1]
    cols = min(n, 6)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.4 * cols, 2.1 * rows + 0.5), squeeze=False, sharey=True)
    cmap = plt.get_cmap("tab10")
    for i, ax in enumerate(axes.ravel()):
        if i >= n:
            ax.axis("off")
            continue
        for h in range(u.shape[2]):
            ax.plot(steps, u[:, i, h], lw=0.8, color=cmap(h % 10))
        ax.plot(steps, u[:, i].mean(-1), "k--", lw=1.2)
        ax.set_title(names[i], fontsize=8)
        if np.nanmin(u) >= 0 and np.nanmax(u) <= 1:
            ax.set_ylim(-0.02, 1.02)
        ax.tick_params(labelsize=6)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return _png(fig)


# ---------------------------------------------------------------- one run's figures, as files

def _np(x: Any) -> np.ndarray:
    """torch tensor (any device) or array-like -> float64 numpy array."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def _write(png: bytes, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png)
    return path


def plot_jsd_heatmaps(matrices: Sequence[Any] | Mapping[str, Any], path: str | Path,
                      titles: Sequence[str] | None = None, vmax: float | None = None,
                      suptitle: str | None = None) -> Path:
    """One heat map per layer of an (H, H) head-JSD matrix: ``matrices`` is a list of (H, H)
    arrays (layer order) or {panel title: (H, H)}; one colour scale (see :func:`heatmap_grid`)."""
    if isinstance(matrices, Mapping):
        titles = list(matrices.keys()) if titles is None else list(titles)
        mats = [_np(m) for m in matrices.values()]
    else:
        mats = [_np(m) for m in matrices]
    if not mats:
        raise ValueError("plot_jsd_heatmaps needs at least one matrix")
    return _write(heatmap_grid([("", mats)], suptitle or "head JSD", col_titles=titles, vmax=vmax), path)


def plot_log_mass_histograms(histograms: Mapping[str, Any], path: str | Path, bin_edges: Any | None = None,
                             neg_log_sk: float | None = None, title: str | None = None) -> Path:
    """Ding et al. Fig. 1 for one set of runs: ``histograms`` is {label: counts}, counts (n_bins,)
    or (H, n_bins) (summed over heads) on the shared ``bin_edges``; a value may also be an
    ``ExplainedAwayStats``, whose own counts, edges and -log Sk are used."""
    hists, edges = {}, bin_edges
    for label, h in histograms.items():
        if hasattr(h, "counts") and hasattr(h, "bin_edges"):
            edges = h.bin_edges if edges is None else edges
            if neg_log_sk is None and getattr(h, "sk_max", 0):
                neg_log_sk = h.neg_log_sk
            h = h.counts
        counts = _np(h)
        hists[label] = counts.sum(0) if counts.ndim == 2 else counts  # (H, n_bins) -> (n_bins,)
    if edges is None:
        raise ValueError("bin_edges must be given for plain count arrays")
    edges = _np(edges)
    for label, counts in hists.items():
        if counts.shape[0] != len(edges) - 1:
            raise ValueError(f"{label}: {counts.shape[0]} counts for {len(edges) - 1} bins")
    return _write(log_mass_overlay(hists, edges, neg_log_sk, title or "attention mass received per key"), path)


def plot_trajectories(history: Sequence[tuple[int, Any]], path: str | Path, layer_names: Sequence[str] | None = None,
                      title: str | None = None, name: str = "value") -> Path:
    """A per-head value a scheme learns, over training: ``history`` is [(step, value (layers,
    heads))] in any order (a (layers,) value is one head per layer)."""
    if not history:
        raise ValueError("plot_trajectories needs at least one (step, value) entry")
    hist = sorted(((int(s), _np(u)) for s, u in history), key=lambda t: t[0])
    arrays = [a[:, None] if a.ndim == 1 else a for _, a in hist]
    if any(a.ndim != 2 or a.shape != arrays[0].shape for a in arrays):
        raise ValueError(f"every {name} must be a (layers, heads) array of the same shape")
    u = np.stack(arrays)  # (T, L, H)
    names = list(layer_names) if layer_names is not None else [f"layer {i}" for i in range(u.shape[1])]
    return _write(trajectory_panels([s for s, _ in hist], u, names, title or f"{name} over training"), path)
