"""Mode collapse under repeated self-attention (Ding et al. 2020, Appendix E).

Points x_i act as queries, keys and values at once (Q = K = I, V = I) and one attention
step moves every point to the weighted mean of all points:
    x_i <- sum_j pi_ij x_j                                    (Ding et al. Eq. 3 / Eq. 8)
with unnormalized weights G_ij = exp(l_ij) and
    UNAS: pi_ij = G_ij / sum_j' G_ij'                          (Eq. 2, rows)
    DNAS: xi_ij = G_ij / sum_i' G_i'j,  pi_ij = xi_ij / sum_j' xi_ij'   (Eq. 7 then Eq. 8)

Kernels (``kernel=``):
* ``"gaussian"``: l_ij = -||x_i - x_j||^2 / 2, i.e. Eq. 2 / Eq. 7 with uniform cluster
  priors alpha_j, beta_i. Appendix E says "The attention weights are computed with a
  Gaussian" (footnote of the 1-D analysis); this is the default.
* ``"dot"``: l_ij = x_i . x_j, i.e. Eq. 2 / Eq. 7 with the priors of Secs. 2.1 / 3.1
  (alpha_j ~ exp(k_j.k_j / 2), beta_i ~ exp(q_i.q_i / 2)), which is what ordinary
  dot-product attention with Q = K = I computes.
In 1-D with two point masses both kernels give the same ratio s / t = exp(-2 a^2), so
Eqs. 13 and 14 hold for both; in the 2-D experiment they differ (see ``simulate_case``).

Checked against the paper text: Eqs. 13 and 14 of Zheng et al. 2021 match an
exact simulation to ~1e-15. (The paper's first line for c_1^U repeats the expression of
c_0^U, a typo; its second line and Eq. 13 are right.) "The gap grows as the clusters get
more unbalanced" holds only near r = 1: the DNAS - UNAS gap peaks (a = 0.5: r ~ 7;
a = 1: r ~ 27) and then shrinks, since both distances go to 0 as r -> infinity.

Everything here is numpy float64 and deterministic given the seed.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np

__all__ = [
    "KERNELS",
    "SCHEMES",
    "pairwise_logits",
    "unas_weights",
    "dnas_weights",
    "attention_step",
    "iterate",
    "two_gaussians",
    "cluster_sizes",
    "two_point_clusters",
    "simulated_centre_distance",
    "unas_distance",
    "dnas_distance",
    "closed_form_check",
    "simulate_case",
    "plot_scatter_steps",
    "plot_distance_vs_r",
]

KERNELS = ("gaussian", "dot")
SCHEMES = ("unas", "dnas")


def _logsumexp(a: np.ndarray, axis: int) -> np.ndarray:
    m = np.max(a, axis=axis, keepdims=True)
    return m + np.log(np.sum(np.exp(a - m), axis=axis, keepdims=True))


def pairwise_logits(x: np.ndarray, kernel: str = "gaussian") -> np.ndarray:
    """(N, D) points -> (N, N) log-weights l_ij (query i, key j); see module docstring."""
    x = np.asarray(x, dtype=np.float64)
    if kernel == "gaussian":
        diff = x[:, None, :] - x[None, :, :]  # (N, N, D)
        return -0.5 * np.einsum("ijd,ijd->ij", diff, diff)
    if kernel == "dot":
        return x @ x.T
    raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")


def unas_weights(logits: np.ndarray) -> np.ndarray:
    """Ding et al. Eq. 2: normalize each query row over the keys. (N, N) -> (N, N)."""
    return np.exp(logits - _logsumexp(logits, axis=1))


def dnas_weights(logits: np.ndarray) -> np.ndarray:
    """Ding et al. Eq. 7 (normalize each key column over the queries), then Eq. 8
    (normalize each query row over the keys). (N, N) -> (N, N); done in logs for stability."""
    log_xi = logits - _logsumexp(logits, axis=0)  # Eq. 7: column step
    return np.exp(log_xi - _logsumexp(log_xi, axis=1))  # Eq. 8: row step


def attention_step(x: np.ndarray, scheme: str, kernel: str = "gaussian") -> np.ndarray:
    """One self-attention step x_i <- sum_j pi_ij x_j (Eq. 3 / Eq. 8); (N, D) -> (N, D)."""
    logits = pairwise_logits(x, kernel)
    if scheme == "unas":
        pi = unas_weights(logits)
    elif scheme == "dnas":
        pi = dnas_weights(logits)
    else:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    return pi @ np.asarray(x, dtype=np.float64)


def iterate(x0: np.ndarray, scheme: str, steps: int, kernel: str = "gaussian") -> np.ndarray:
    """Positions after 0..steps attention steps: (steps + 1, N, D); keys move with queries."""
    out = [np.asarray(x0, dtype=np.float64)]
    for _ in range(steps):
        out.append(attention_step(out[-1], scheme, kernel))
    return np.stack(out)


def two_gaussians(
    n0: int = 500,
    n1: int = 50,
    centre0: Sequence[float] = (1.8, 0.7),
    centre1: Sequence[float] = (-1.0, -1.0),
    var: float = 0.1,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Appendix E data: n0 points around centre0 (red) and n1 around centre1 (blue), both
    with covariance var * I. Returns x (n0 + n1, 2) and labels (n0 + n1,) in {0, 1}."""
    rng = np.random.default_rng(seed)
    sd = math.sqrt(var)
    x = np.concatenate([
        rng.normal(loc=centre0, scale=sd, size=(n0, len(centre0))),
        rng.normal(loc=centre1, scale=sd, size=(n1, len(centre1))),
    ])
    labels = np.concatenate([np.zeros(n0, dtype=int), np.ones(n1, dtype=int)])
    return x, labels


def cluster_sizes(x: np.ndarray, radius: float = 0.1) -> np.ndarray:
    """Single-linkage clusters: points closer than ``radius`` (directly or through a chain)
    share a cluster. (N, D) -> sizes, largest first; len() is the number of clusters.

    After a few attention steps each surviving mode has shrunk to (nearly) a point, so
    the count does not depend on ``radius`` over a wide range; points still in transit
    between modes show up as extra small clusters.
    """
    x = np.asarray(x, dtype=np.float64)
    n = len(x)
    d2 = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)  # (N, N)
    near = d2 <= radius * radius
    # connected components by min-label propagation with pointer jumping: every point
    # takes the smallest label among its neighbours, then the label of that label's
    # owner, until nothing changes (O(N^2) per round, few rounds)
    label = np.arange(n)
    while True:
        new = np.where(near, label[None, :], n).min(1)
        new = new[new]
        if np.array_equal(new, label):
            break
        label = new
    _, label = np.unique(label, return_inverse=True)
    return np.sort(np.bincount(label))[::-1]


# ---------------------------------------------------------------- 1-D two clusters


def two_point_clusters(n0: int, n1: int, a: float) -> np.ndarray:
    """N0 points at +a and N1 at -a: (n0 + n1, 1)."""
    return np.concatenate([np.full(n0, float(a)), np.full(n1, -float(a))])[:, None]


def simulated_centre_distance(n0: int, n1: int, a: float, scheme: str, kernel: str = "gaussian") -> float:
    """Exact one-step simulation of the 1-D toy: c_0 - c_1, the new positions of the +a
    and -a clusters (all points of one cluster stay identical, so any member is the centre)."""
    x1 = attention_step(two_point_clusters(n0, n1, a), scheme, kernel)
    return float(x1[0, 0] - x1[n0, 0])


def unas_distance(r, a):
    """Ding et al. Eq. 13: c0^U - c1^U = 2 r (1 - s^2) a / ((1 + r s)(r + s)),
    r = N0 / N1, s = exp(-2 a^2). Broadcasts over numpy arrays."""
    r = np.asarray(r, dtype=np.float64)
    a = np.asarray(a, dtype=np.float64)
    s = np.exp(-2.0 * a * a)
    return 2.0 * r * (1.0 - s * s) * a / ((1.0 + r * s) * (r + s))


def dnas_distance(r, a):
    """Ding et al. Eq. 14: q = (r + s) / (r s + 1),
    c0^D - c1^D = 2 q r (1 - s^2) a / ((q + r s)(r + s q)). Broadcasts over numpy arrays."""
    r = np.asarray(r, dtype=np.float64)
    a = np.asarray(a, dtype=np.float64)
    s = np.exp(-2.0 * a * a)
    q = (r + s) / (r * s + 1.0)
    return 2.0 * q * r * (1.0 - s * s) * a / ((q + r * s) * (r + s * q))


def closed_form_check(
    pairs: Sequence[tuple[int, int]] = ((1, 20), (2, 10), (1, 4), (1, 1), (3, 2), (5, 1), (20, 1), (50, 3)),
    a_values: Sequence[float] = (0.25, 0.5, 1.0, 1.5),
    kernel: str = "gaussian",
) -> dict:
    """Simulated one-step centre distance vs Eqs. 13 / 14 on (N0, N1) pairs and a values.

    Returns {"rows": [{n0, n1, r, a, unas_sim, unas_eq13, dnas_sim, dnas_eq14}],
    "max_abs_err_unas", "max_abs_err_dnas"}.
    """
    rows = []
    for n0, n1 in pairs:
        for a in a_values:
            r = n0 / n1
            rows.append({
                "n0": n0, "n1": n1, "r": r, "a": a,
                "unas_sim": simulated_centre_distance(n0, n1, a, "unas", kernel),
                "unas_eq13": float(unas_distance(r, a)),
                "dnas_sim": simulated_centre_distance(n0, n1, a, "dnas", kernel),
                "dnas_eq14": float(dnas_distance(r, a)),
            })
    return {
        "kernel": kernel,
        "rows": rows,
        "max_abs_err_unas": max(abs(x["unas_sim"] - x["unas_eq13"]) for x in rows),
        "max_abs_err_dnas": max(abs(x["dnas_sim"] - x["dnas_eq14"]) for x in rows),
    }


# ---------------------------------------------------------------- 2-D experiment


def simulate_case(
    n0: int = 500,
    n1: int = 50,
    seed: int = 0,
    steps: int = 4,
    kernel: str = "gaussian",
    radius: float = 0.1,
    extra_steps: int = 8,
    per_step: bool = True,
) -> dict:
    """Run UNAS and DNAS on the Appendix E mixture and summarize the clusters.

    Returns {"x0", "labels", "trajectories": {scheme: (steps + 1, N, 2)}, and per scheme
    under "summary": cluster sizes after ``steps`` steps and at every step, the distance
    between the means of the two original groups at every step, and the first step (up
    to steps + extra_steps) at which one cluster is left (None if never); the per-step
    counts only when ``per_step``}.
    """
    x0, labels = two_gaussians(n0, n1, seed=seed)
    trajectories, summary = {}, {}
    for scheme in SCHEMES:
        traj = iterate(x0, scheme, steps + extra_steps, kernel)
        final = cluster_sizes(traj[steps], radius)
        gap = [float(np.linalg.norm(x[labels == 0].mean(0) - x[labels == 1].mean(0))) for x in traj]
        summary[scheme] = {
            "clusters": int(len(final)),
            "cluster_sizes": final.tolist(),
            "group_mean_distance_per_step": gap[: steps + 1],
        }
        if per_step:
            counts = [int(len(cluster_sizes(x, radius))) for x in traj]
            summary[scheme]["clusters_per_step"] = counts[: steps + 1]
            summary[scheme]["first_step_with_one_cluster"] = next(
                (t for t, c in enumerate(counts) if c == 1), None)
        trajectories[scheme] = traj[: steps + 1]
    return {"n0": n0, "n1": n1, "seed": seed, "steps": steps, "kernel": kernel, "radius": radius,
            "x0": x0, "labels": labels, "trajectories": trajectories, "summary": summary}


# ---------------------------------------------------------------- plots


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on training machines
    import matplotlib.pyplot as plt

    return plt


def plot_scatter_steps(
    trajectories: dict,
    labels: np.ndarray,
    path: str | Path,
    steps: Sequence[int] | None = None,
    title: str | None = None,
) -> Path:
    """Ding Figs. 6 / 8 / 9: UNAS in the top row, DNAS in the bottom row, one column per
    step. ``trajectories`` {"unas": (T, N, 2), "dnas": (T, N, 2)}; ``labels`` (N,) 0 = red,
    1 = blue. Writes a PNG and returns its path."""
    plt = _pyplot()
    path = Path(path)
    t_total = min(len(trajectories[s]) for s in SCHEMES)
    steps = list(range(t_total)) if steps is None else list(steps)
    allx = np.concatenate([trajectories[s][t] for s in SCHEMES for t in steps])
    lo, hi = allx.min(0) - 0.2, allx.max(0) + 0.2
    fig, axes = plt.subplots(2, len(steps), figsize=(2.6 * len(steps), 5.4), squeeze=False)
    fig.subplots_adjust(left=0.05, right=0.98, bottom=0.06, top=0.86 if title else 0.93, wspace=0.3, hspace=0.35)
    for row, scheme in enumerate(SCHEMES):
        for col, t in enumerate(steps):
            ax = axes[row][col]
            x = trajectories[scheme][t]
            ax.scatter(x[labels == 0, 0], x[labels == 0, 1], s=6, c="tab:red", alpha=0.6)
            ax.scatter(x[labels == 1, 0], x[labels == 1, 1], s=6, c="tab:blue", alpha=0.8)
            ax.set_xlim(lo[0], hi[0])
            ax.set_ylim(lo[1], hi[1])
            ax.set_title(f"{scheme.upper()}, step {t}", fontsize=9)
            ax.tick_params(labelsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_distance_vs_r(
    path: str | Path,
    a_values: Sequence[float] = (0.5, 1.0),
    r_range: tuple[float, float] = (0.05, 20.0),
    sim_pairs: Sequence[tuple[int, int]] = ((1, 20), (1, 10), (1, 4), (1, 2), (1, 1), (2, 1), (4, 1), (10, 1), (20, 1)),
) -> Path:
    """Ding Fig. 7: centre distance after one step vs r = N0 / N1, one panel per a.
    UNAS Eq. 13 blue solid, DNAS Eq. 14 red dashed; markers are exact simulations on the
    (N0, N1) pairs ``sim_pairs``; the grey line is the initial distance 2a."""
    plt = _pyplot()
    path = Path(path)
    r = np.geomspace(r_range[0], r_range[1], 400)
    fig, axes = plt.subplots(1, len(a_values), figsize=(4.6 * len(a_values), 3.8), squeeze=False)
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.14, top=0.9, wspace=0.25)
    for ax, a in zip(axes[0], a_values):
        ax.plot(r, unas_distance(r, a), "b-", label="UNAS (Eq. 13)")
        ax.plot(r, dnas_distance(r, a), "r--", label="DNAS (Eq. 14)")
        rs = [n0 / n1 for n0, n1 in sim_pairs]
        ax.plot(rs, [simulated_centre_distance(n0, n1, a, "unas") for n0, n1 in sim_pairs], "bo", ms=4,
                label="UNAS simulated")
        ax.plot(rs, [simulated_centre_distance(n0, n1, a, "dnas") for n0, n1 in sim_pairs], "rs", ms=4,
                mfc="none", label="DNAS simulated")
        ax.axhline(2 * a, color="grey", lw=0.8, ls=":", label="initial distance 2a")
        ax.set_xscale("log")
        ax.set_xlabel("r = N0 / N1")
        ax.set_ylabel("centre distance after one step")
        ax.set_title(f"a = {a}")
        ax.legend(fontsize=7)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
