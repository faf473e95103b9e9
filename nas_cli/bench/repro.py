"""The paper reproductions ``nas-repro`` runs (nas_cli/commands/nas_repro.py is its command line):

* :func:`run_mode_collapse`: Ding et al. Appendix E (Figs. 7-9, Eqs. 13/14), no training;
* :func:`run_explained_away`: Ding et al. Fig. 1, UNAS and DNAS trained on the same data.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence
from types import MappingProxyType

import numpy as np

from nas_cli.diagnostics import mode_collapse as mc

CASES = MappingProxyType({"unbalanced": (500, 50), "balanced": (225, 225)})  # Figs. 6/9 and Fig. 8


def run_mode_collapse(out: str | Path, seed: int = 0, steps: int = 4, radius: float = 0.1,
                      kernels: Sequence[str] = mc.KERNELS, sweep_seeds: int = 5) -> dict:
    """Write the figures and JSON under ``out``; returns the JSON content."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = []
    report: dict = {
        "source": "Ding et al. 2020, Appendix E (Figs. 6-9, Eqs. 13-14)",
        "settings": {"seed": seed, "steps": steps, "cluster_radius": radius,
                     "data": "500 (or 225) points ~ N((1.8, 0.7), 0.1 I), 50 (or 225) ~ N((-1, -1), 0.1 I)"},
        "notes": [
            "kernel 'gaussian': weights exp(-|x_i - x_j|^2 / 2) (Eqs. 2/7 with uniform priors); "
            "kernel 'dot': exp(x_i . x_j) (Eqs. 2/7 with the priors of Secs. 2.1/3.1, i.e. dot-product attention).",
            "clusters: single-linkage groups of final positions within cluster_radius; points still moving "
            "between modes appear as extra small clusters (see cluster_sizes and group_mean_distance_per_step).",
        ],
    }

    checks = {k: mc.closed_form_check(kernel=k) for k in kernels}
    report["closed_form"] = {
        "max_abs_err_unas_eq13": max(c["max_abs_err_unas"] for c in checks.values()),
        "max_abs_err_dnas_eq14": max(c["max_abs_err_dnas"] for c in checks.values()),
        "dnas_ge_unas_everywhere": all(r["dnas_sim"] >= r["unas_sim"] - 1e-12
                                       for c in checks.values() for r in c["rows"]),
        "rows": checks[kernels[0]]["rows"],
    }
    r_grid = [0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0]
    report["fig7_values"] = {
        str(a): {"r": r_grid, "unas_eq13": mc.unas_distance(r_grid, a).tolist(),
                 "dnas_eq14": mc.dnas_distance(r_grid, a).tolist(), "initial_2a": 2 * a}
        for a in (0.5, 1.0)
    }
    files.append(mc.plot_distance_vs_r(out / "fig7_distance_vs_r.png"))

    cases = {}
    for kernel in kernels:
        for name, (n0, n1) in CASES.items():
            res = mc.simulate_case(n0, n1, seed=seed, steps=steps, kernel=kernel, radius=radius)
            cases[f"{name}_{n0}_{n1}/{kernel}"] = res["summary"]
            fig = "fig9" if name == "unbalanced" else "fig8"
            files.append(mc.plot_scatter_steps(
                res["trajectories"], res["labels"], out / f"{fig}_{name}_{kernel}.png",
                title=f"{n0} red / {n1} blue, {kernel} kernel, seed {seed}"))
    report["cases"] = cases
    report["clusters_after_steps"] = {k: {s: v[s]["clusters"] for s in mc.SCHEMES} for k, v in cases.items()}

    report["seed_sweep_clusters"] = _seed_sweep(kernels, steps, radius, sweep_seeds)

    report["files"] = [p.name for p in files] + ["mode_collapse.json"]
    (out / "mode_collapse.json").write_text(json.dumps(report, indent=2, default=_json_default))
    return report


def explained_away_overrides(scheme: str, steps: int, seed: int, heads: int, batches: int,
                             extra: Sequence[str] = ()) -> list[str]:
    """Hydra overrides of one ``explained-away`` run: one validation, at the last step.

    The short warm-up and higher peak LR (``EXPLAINED_AWAY_OPTIM``) let the tiny model learn
    the task within a few hundred steps (reverse: ~95% exact match after 500); an ``extra``
    override of the same key replaces them."""
    base = [f"attention={scheme}", f"seed={seed}", f"model.heads={heads}", "logger=csv", "progress_bar=false",
            "run_test=false", f"trainer.max_steps={steps}", "trainer.max_epochs=-1",
            f"trainer.val_check_interval={steps}", "trainer.check_val_every_n_epoch=null",
            "diagnostics.enabled=true", f"diagnostics.batches={batches}", "diagnostics.every_n_validations=1",
            *EXPLAINED_AWAY_OPTIM]
    given = {e.split("=", 1)[0].lstrip("+~") for e in extra}
    return [o for o in base if o.split("=", 1)[0] not in given] + list(extra)


EXPLAINED_AWAY_OPTIM = ("optim.warmup=100", "optim.lr=2e-3")


def run_explained_away(out: str | Path, steps: int = 500, seed: int = 1, heads: int = 4, batches: int = 4,
                       overrides: Sequence[str] = (), schemes: Sequence[str] = ("unas", "dnas")) -> dict:
    """Train each scheme, then overlay their encoder histograms of log sum_i pi_ij (Ding et
    al. Fig. 1). Writes ``fig1_encoder_log_mass.png`` (all layers), one
    ``fig1_encoder_layer<i>.png`` per layer and ``explained_away.json``; returns the JSON."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import get_class

    from nas_cli.model.plan import location_alias
    from nas_cli.pipeline.checks.config import check_config
    from nas_cli.pipeline.launch.resolvers import register_resolvers
    from nas_cli.model.choices import CONF_DIR
    from nas_cli.pipeline.run import train

    register_resolvers()

    if steps < 1 or batches < 1:
        raise ValueError(f"--steps and --batches must be >= 1 (got {steps}, {batches})")
    configs = {}
    for scheme in schemes:  # every config checked before anything is made (one line, nothing left)
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose("config", overrides=location_alias(
                explained_away_overrides(scheme, steps, seed, heads, batches, overrides)))
        if getattr(get_class(cfg.task._target_), "kind", "seq2seq") != "seq2seq":
            raise ValueError("explained-away needs a seq2seq task (it looks at encoder self-attention)")
        configs[scheme] = (cfg, check_config(cfg).plan)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    per_scheme: dict[str, dict] = {}
    layers: dict[str, list[dict]] = {}
    for scheme, (cfg, plan) in configs.items():
        summary = train(cfg, plan, out / scheme, group="repro-explained-away")
        latest = json.loads((out / scheme / "diagnostics" / "latest.json").read_text())
        enc = latest["locations"].get("encoder")
        if not enc:
            raise ValueError(f"{scheme}: no encoder self-attention diagnostics were written")
        layers[scheme] = [e["explained_away"] for e in enc["layers"]]
        per_scheme[scheme] = _scheme_record(out / scheme, summary, enc, layers[scheme])
    files, neg_log_sk = _fig1(out, per_scheme, layers, schemes, steps)
    dnas = per_scheme.get("dnas")
    report = {
        "source": "Ding et al. 2020, Fig. 1 and Theorem 2 (encoder self-attention, non-causal)",
        "settings": {"steps": steps, "seed": seed, "heads": heads, "validation_batches": batches,
                     "overrides": list(overrides), "neg_log_sk_max": neg_log_sk},
        "schemes": per_scheme,
        "theorem2_holds_for_dnas": None if dnas is None else bool(
            dnas["min_margin"] is not None and dnas["min_margin"] >= -1e-5 and dnas["explained_away_frac"] == 0),
        "files": [p.name for p in files] + ["explained_away.json"],
    }
    (out / "explained_away.json").write_text(json.dumps(report, indent=2, default=_json_default))
    return report


def _seed_sweep(kernels: Sequence[str], steps: int, radius: float, sweep_seeds: int) -> dict:
    """Clusters after ``steps`` for seeds 0..sweep_seeds-1, per case, kernel and scheme."""
    sweep = {}
    for kernel in kernels:
        for name, (n0, n1) in CASES.items():
            per = {s: [] for s in mc.SCHEMES}
            for sd in range(sweep_seeds):
                summ = mc.simulate_case(n0, n1, seed=sd, steps=steps, kernel=kernel, radius=radius,
                                        extra_steps=0, per_step=False)["summary"]
                for s in mc.SCHEMES:
                    per[s].append(summ[s]["clusters"])
            sweep[f"{name}_{n0}_{n1}/{kernel}"] = per
    return {"seeds": list(range(sweep_seeds)), **sweep}


def _scheme_record(run_dir: Path, summary: dict, enc: dict, layers: list[dict]) -> dict:
    """One scheme's encoder numbers for explained_away.json (its histograms over all layers too)."""
    counts = np.sum([np.asarray(e["counts"]).sum(0) for e in layers], axis=0)
    edges = np.asarray(layers[0]["bin_edges"])
    below20 = counts[: int(np.searchsorted(edges, -20.0, side="right")) - 1].sum() / counts.sum()
    return {
        "run_dir": str(run_dir),
        "steps": summary["steps"],
        "best_val": summary["best_val"],
        "eps": layers[0]["eps"],
        "n_keys_per_layer": [e["n_keys"] for e in layers],
        "explained_away_frac": enc.get("explained_away_frac"),
        "explained_away_frac_per_layer": enc.get("explained_away_frac_per_layer"),
        "fraction_log_mass_below_-20": float(below20),
        "min_margin": enc.get("min_margin"),
        "min_margin_per_layer": enc.get("min_margin_per_layer"),
        "min_log_mass_per_layer": [min((v for v in e["min_log_mass"] if v is not None), default=None)
                                   for e in layers],
        "entropy_mean": enc.get("entropy_mean"),
        "jsd_mean": enc.get("jsd_mean"),
        "counts_all_layers": counts.astype(int).tolist(),
        "bin_edges": edges.tolist(),
    }


def _fig1(out: Path, per_scheme: dict, layers: dict, schemes: Sequence[str], steps: int) -> tuple[list[Path], float]:
    """The overlaid histograms, all layers and one per layer; returns the files and -log Sk."""
    from nas_cli.diagnostics.figures import plot_log_mass_histograms

    edges = np.asarray(next(iter(layers.values()))[0]["bin_edges"])
    sk_max = max(e["sk_max"] for ls in layers.values() for e in ls)
    neg_log_sk = -float(np.log(sk_max))
    # drop the empty low bins below the data, -log Sk and -20 (the paper's reference
    # value), so mass near 0 is not squeezed into a sliver; dropped bins hold no keys
    total = np.sum([per_scheme[s]["counts_all_layers"] for s in schemes], axis=0)
    first = int(np.flatnonzero(total)[0]) if total.any() else 0
    start = max(0, min(first, int(np.searchsorted(edges, min(neg_log_sk, -20.0))) - 1) - 4)
    cut = edges[start:]
    files = [plot_log_mass_histograms(
        {s.upper(): np.asarray(per_scheme[s]["counts_all_layers"])[start:] for s in schemes},
        out / "fig1_encoder_log_mass.png", bin_edges=cut, neg_log_sk=neg_log_sk,
        title=f"encoder self-attention, all layers, after {steps} steps (Ding et al. Fig. 1)")]
    for i in range(min(len(ls) for ls in layers.values())):
        files.append(plot_log_mass_histograms(
            {s.upper(): np.asarray(layers[s][i]["counts"])[:, start:] for s in schemes},
            out / f"fig1_encoder_layer{i}.png", bin_edges=cut, neg_log_sk=neg_log_sk,
            title=f"encoder self-attention, layer {i}, after {steps} steps"))
    return files, neg_log_sk


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serializable: {type(o)}")
