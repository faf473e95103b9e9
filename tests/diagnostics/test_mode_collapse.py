"""Ding et al. 2020 Appendix E: mode collapse under UNAS vs DNAS, Eqs. 13 / 14, nas-repro."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from nas_cli.diagnostics import mode_collapse as mc
from helpers import run_command

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("kernel", mc.KERNELS)
def test_simulation_matches_eq13_eq14(kernel):
    """Exact one-step simulation of the 1-D two-cluster toy equals the closed forms."""
    check = mc.closed_form_check(kernel=kernel)
    assert len(check["rows"]) >= 30
    assert check["max_abs_err_unas"] < 1e-10
    assert check["max_abs_err_dnas"] < 1e-10
    # the comparison is not vacuous: distances shrink and differ between the schemes
    rows = check["rows"]
    assert all(r["unas_sim"] < 2 * r["a"] for r in rows)
    assert any(r["dnas_sim"] - r["unas_sim"] > 0.1 for r in rows)


def test_eq13_eq14_against_unreduced_forms():
    """Eqs. 13 / 14 agree with the N0, N1, t, s forms they are derived from (Appendix E)."""
    for n0, n1, a in [(3, 7, 0.4), (50, 5, 1.0), (4, 4, 0.8)]:
        s, t = math.exp(-2 * a * a), 1.0
        unas = 2 * n0 * n1 * (t * t - s * s) * a / ((n1 * t + n0 * s) * (n0 * t + n1 * s))
        dnas = 2 * n1 * a * (t * (n0 * t + n1 * s) / (n0 * s * (n0 * s + n1 * t) + n1 * t * (n0 * t + n1 * s))
                             - s * (n0 * t + n1 * s) / (n0 * t * (n0 * s + n1 * t) + n1 * s * (n0 * t + n1 * s)))
        assert mc.unas_distance(n0 / n1, a) == pytest.approx(unas, rel=1e-13)
        assert mc.dnas_distance(n0 / n1, a) == pytest.approx(dnas, rel=1e-13)


def test_dnas_distance_bounds_unas_equal_at_r1():
    r = np.geomspace(0.01, 100, 301)
    for a in (0.25, 0.5, 1.0, 2.0):
        u, d = mc.unas_distance(r, a), mc.dnas_distance(r, a)
        assert (d >= u - 1e-15).all()
        assert mc.dnas_distance(1.0, a) == pytest.approx(mc.unas_distance(1.0, a), abs=1e-15)
        assert (d - u)[np.abs(np.log(r)) > 1e-3].min() > 0
        # the gap grows as the clusters get more unbalanced -- near r = 1 only: it peaks
        # (a = 0.5 near r = 7) and shrinks again, since both distances -> 0 as r -> inf
        near = (r > 1) & (r <= 5)
        assert (np.diff((d - u)[near]) > 0).all()
        assert mc.simulated_centre_distance(6, 6, a, "dnas") == pytest.approx(
            mc.simulated_centre_distance(6, 6, a, "unas"), abs=1e-14)
    gap = lambda r, a: mc.dnas_distance(r, a) - mc.unas_distance(r, a)  # noqa: E731
    assert gap(50.0, 0.5) < gap(7.0, 0.5)


def test_weight_normalizations():
    x, _ = mc.two_gaussians(30, 10, seed=3)
    for kernel in mc.KERNELS:
        logits = mc.pairwise_logits(x, kernel)
        pu, pd = mc.unas_weights(logits), mc.dnas_weights(logits)
        np.testing.assert_allclose(pu.sum(1), 1.0, atol=1e-12)
        np.testing.assert_allclose(pd.sum(1), 1.0, atol=1e-12)
        # Theorem 2 holds in the toy: every point keeps column mass >= 1/N under DNAS
        assert pd.sum(0).min() >= 1 / len(x) - 1e-12
        # the DNAS column step is Eq. 7 with exp weights computed directly
        g = np.exp(logits - logits.max())
        xi = g / g.sum(0, keepdims=True)
        np.testing.assert_allclose(pd, xi / xi.sum(1, keepdims=True), rtol=1e-10)


def test_cluster_sizes():
    x = np.array([[0, 0], [0.05, 0], [0.1, 0.0], [3, 3], [3, 3.01], [10, 10]], dtype=float)
    assert mc.cluster_sizes(x, radius=0.06).tolist() == [3, 2, 1]  # chain 0-1-2 links up
    assert mc.cluster_sizes(x, radius=0.01).tolist() == [2, 1, 1, 1, 1]


def test_unbalanced_2d_dnas_keeps_two_unas_collapses():
    """500 vs 50 points (Figs. 6 / 9). DNAS keeps both modes intact for both kernels.
    UNAS: with the dot-product kernel one cluster is left after 4 steps, as the paper
    reports; with the Gaussian kernel the 50-point mode has left its site by step 4
    (group means 3.25 -> 0.65 apart, its points strung out between the modes) and the
    last separate point merges at step 5 -- one step later than the paper's figure."""
    gauss = mc.simulate_case(500, 50, seed=0, steps=4, kernel="gaussian")
    dot = mc.simulate_case(500, 50, seed=0, steps=4, kernel="dot")
    for res in (gauss, dot):
        d = res["summary"]["dnas"]
        assert d["clusters"] == 2 and d["cluster_sizes"] == [500, 50]
        assert d["first_step_with_one_cluster"] is None  # never, even after 12 steps
        assert d["group_mean_distance_per_step"][-1] > 0.9 * d["group_mean_distance_per_step"][0]
        final = res["trajectories"]["dnas"][-1]
        labels = res["labels"]
        # the two surviving clusters are exactly the two original groups
        assert np.ptp(final[labels == 0], axis=0).max() < 0.1 and np.ptp(final[labels == 1], axis=0).max() < 0.1
    assert dot["summary"]["unas"]["clusters"] == 1
    gu = gauss["summary"]["unas"]
    assert gu["first_step_with_one_cluster"] == 5
    assert gu["clusters"] > 1 and gu["cluster_sizes"][0] > 500  # absorbing the small group
    gap = gu["group_mean_distance_per_step"]
    assert gap[-1] < 0.25 * gap[0]


@pytest.mark.parametrize("kernel", mc.KERNELS)
def test_balanced_2d_both_keep_two(kernel):
    res = mc.simulate_case(225, 225, seed=0, steps=4, kernel=kernel, extra_steps=0)
    for scheme in mc.SCHEMES:
        assert res["summary"][scheme]["cluster_sizes"] == [225, 225]


def test_nas_repro_mode_collapse_cli(tmp_path):
    exe = Path(sys.executable).with_name("nas-repro")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "nas_cli.commands.nas_repro"]
    out = tmp_path / "tmp"
    proc = run_command(cmd + ["mode-collapse", "--out", str(out), "--sweep-seeds", "1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "mode_collapse.json").read_text())
    pngs = sorted(out.glob("*.png"))
    assert {p.name for p in pngs} == {
        "fig7_distance_vs_r.png", "fig8_balanced_gaussian.png", "fig9_unbalanced_gaussian.png",
        "fig8_balanced_dot.png", "fig9_unbalanced_dot.png"}
    for p in pngs:
        data = p.read_bytes()
        assert len(data) > 5000 and data[:8] == PNG_MAGIC
    assert report["closed_form"]["max_abs_err_unas_eq13"] < 1e-10
    assert report["closed_form"]["max_abs_err_dnas_eq14"] < 1e-10
    assert report["closed_form"]["dnas_ge_unas_everywhere"] is True
    counts = report["clusters_after_steps"]
    assert counts["unbalanced_500_50/dot"] == {"unas": 1, "dnas": 2}
    assert counts["unbalanced_500_50/gaussian"]["dnas"] == 2
    assert counts["balanced_225_225/gaussian"] == {"unas": 2, "dnas": 2}
    assert "clusters after 4 steps" in proc.stdout
