"""Head-JSD (CODA) and explaining-away (Ding et al.) diagnostics, plots and collector."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nas_cli.attention.base import AttentionOutput
from nas_cli.attention.dnas import DNAS
from nas_cli.attention.unas import UNAS
from nas_cli.diagnostics import (
    AttentionDiagnostics,
    ExplainedAwayAccumulator,
    JSDAccumulator,
    collect_aux,
    default_bin_edges,
    explained_away_stats,
    head_jsd,
    head_jsd_per_sample,
    location_masks,
    mean_pair_jsd,
    row_entropy,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
LOG2 = math.log(2.0)


def random_rows(h, sq, sk, seed, sharp=1.0):
    """(H, Sq, Sk) row-stochastic weights with some exact zeros (0 log 0 cases)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.softmax(torch.randn(h, sq, sk, generator=g, dtype=torch.float64) * sharp, dim=-1)
    w = w * (torch.rand(h, sq, sk, generator=g, dtype=torch.float64) > 0.2)
    w[..., 0] += 1e-3  # keep every row non-empty before renormalizing
    return w / w.sum(-1, keepdim=True)


def pad_batch(samples, sq, sk, seed=0):
    """Stack per-sample (H, nq, nk) weights into (B, H, sq, sk) with masks; padded query
    rows get garbage (they must be ignored), padded keys get zero weight (the contract)."""
    g = torch.Generator().manual_seed(seed)
    h = samples[0].shape[0]
    w = torch.zeros(len(samples), h, sq, sk, dtype=torch.float64)
    qm = torch.zeros(len(samples), sq, dtype=torch.bool)
    km = torch.zeros(len(samples), sk, dtype=torch.bool)
    for b, s in enumerate(samples):
        nq, nk = s.shape[1:]
        w[b, :, nq:, :] = torch.rand(h, sq - nq, sk, generator=g, dtype=torch.float64)
        w[b, :, :nq, :nk] = s
        qm[b, :nq] = True
        km[b, :nk] = True
    return w, qm, km


# ---------------------------------------------------------------- JSD


def test_identical_heads_have_exactly_zero_jsd():
    base = random_rows(1, 6, 9, seed=1)
    w = base.expand(3, -1, -1).clone()[None]  # (1, 3, 6, 9), all heads equal
    m = head_jsd(w)
    assert torch.equal(m, torch.zeros(3, 3, dtype=torch.float64))
    # one duplicated pair inside otherwise different heads
    w = random_rows(4, 6, 9, seed=2)[None].clone()
    w[0, 3] = w[0, 1]
    m = head_jsd(w)
    assert m[1, 3].item() == 0.0 and m[3, 1].item() == 0.0
    assert m[0, 1] > 0


def test_disjoint_one_hot_heads_give_log2_per_real_row():
    lengths = [(5, 4), (2, 3), (7, 7)]  # (real queries, real keys) per sample
    samples = []
    for nq, nk in lengths:
        s = torch.zeros(2, nq, nk, dtype=torch.float64)
        s[0, :, 0] = 1.0  # head 0 looks only at key 0
        s[1, :, 1] = 1.0  # head 1 looks only at key 1
        samples.append(s)
    w, qm, km = pad_batch(samples, sq=8, sk=9)
    per = head_jsd_per_sample(w, qm, km)
    for b, (nq, _) in enumerate(lengths):
        assert per[b, 0, 1].item() == pytest.approx(nq * LOG2, abs=1e-12)
    m = head_jsd(w, qm, km)
    assert m[0, 1].item() == pytest.approx(np.mean([nq for nq, _ in lengths]) * LOG2, abs=1e-12)
    assert mean_pair_jsd(m) == pytest.approx(m[0, 1].item())


def test_jsd_matrix_symmetric_zero_diagonal_bounded():
    w = torch.stack([random_rows(5, 6, 8, seed=s) for s in range(3)])
    m = head_jsd(w)
    assert torch.equal(m, m.T)
    assert torch.equal(torch.diagonal(m), torch.zeros(5, dtype=torch.float64))
    off = m[~torch.eye(5, dtype=torch.bool)]
    assert (off > 0).all() and (off <= 6 * LOG2 + 1e-12).all()
    iu = torch.triu_indices(5, 5, 1)
    assert mean_pair_jsd(m) == pytest.approx(m[iu[0], iu[1]].mean().item())


def test_jsd_padding_invariance():
    lengths = [(4, 6), (6, 3), (1, 5)]
    samples = [random_rows(3, nq, nk, seed=10 + i) for i, (nq, nk) in enumerate(lengths)]
    # reference: every sample alone without padding, then the mean over samples
    alone = torch.stack([head_jsd(s[None]) for s in samples]).mean(0)
    for sq, sk, seed in [(6, 6, 0), (9, 11, 1)]:  # two different amounts of padding
        w, qm, km = pad_batch(samples, sq, sk, seed)
        torch.testing.assert_close(head_jsd(w, qm, km), alone, rtol=0, atol=1e-13)


def test_jsd_accumulator_equals_one_pass():
    samples = [random_rows(4, 5, 7, seed=20 + i) for i in range(5)]
    w, qm, km = pad_batch(samples, 5, 7)
    qm[1, 3:] = False  # some padded queries (their rows hold real-looking values)
    qm[4, :] = False  # a sample with no real query is not averaged
    acc = JSDAccumulator()
    acc.update(w[:2], qm[:2], km[:2])
    acc.update(w[2:], qm[2:], km[2:])
    torch.testing.assert_close(acc.compute(), head_jsd(w, qm, km), rtol=0, atol=1e-13)
    assert acc.samples == 4
    assert acc.mean_pair() == pytest.approx(mean_pair_jsd(head_jsd(w, qm, km)))


def test_jsd_matches_scipy_reference():
    distance = pytest.importorskip("scipy.spatial.distance")
    samples = [random_rows(3, nq, nk, seed=30 + i) for i, (nq, nk) in enumerate([(4, 5), (3, 6)])]
    w, qm, km = pad_batch(samples, 5, 6)
    m = head_jsd(w, qm, km)
    ref = np.zeros((3, 3))
    for s in samples:
        for i in range(3):
            for j in range(3):
                # scipy returns the JS *distance*: its square is the divergence
                ref[i, j] += sum(distance.jensenshannon(s[i, r].numpy(), s[j, r].numpy()) ** 2
                                 for r in range(s.shape[1]))
    np.testing.assert_allclose(m.numpy(), ref / len(samples), rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------- explained away


def hand_made():
    """One sample, 2 heads, 2 real queries + 1 padded, 3 real keys + 1 padded."""
    w = torch.zeros(1, 2, 3, 4, dtype=torch.float64)
    w[0, 0, 0, :3] = torch.tensor([1.0, 0.0, 0.0])
    w[0, 0, 1, :3] = torch.tensor([0.5, 0.5, 0.0])
    w[0, 1, 0, :3] = torch.tensor([0.5, 0.25, 0.25])
    w[0, 1, 1, :3] = torch.tensor([0.5, 0.25, 0.25])
    w[0, :, 2, :] = 0.7  # padded query: garbage, must be ignored
    qm = torch.tensor([[True, True, False]])
    km = torch.tensor([[True, True, True, False]])
    return w, qm, km


def test_explained_away_hand_made():
    w, qm, km = hand_made()
    s = explained_away_stats(w, qm, km)
    # column sums: head 0 (1.5, 0.5, 0), head 1 (1, 0.5, 0.5); Sk = 3 real keys
    assert s.n_keys == 3 and s.sk_min == s.sk_max == 3
    np.testing.assert_allclose(s.fraction_explained_away, [1 / 3, 0.0])
    assert s.min_log_mass[0] == -np.inf
    assert s.min_log_mass[1] == pytest.approx(math.log(0.5))
    assert s.min_margin[0] == -np.inf
    assert s.min_margin[1] == pytest.approx(math.log(0.5) + math.log(3))  # log 1.5 > 0: above -log Sk
    # against the floor 1/3: only head 0's zero-mass key is below it
    np.testing.assert_allclose(s.fraction_below_bound, [1 / 3, 0.0])
    assert s.n_below_bound.tolist() == [1, 0]
    assert s.neg_log_sk == pytest.approx(-math.log(3))
    # entropy: head 0 rows (0, log 2), head 1 rows both H(.5, .25, .25) = 1.5 log 2
    np.testing.assert_allclose(s.entropy, [LOG2 / 2, 1.5 * LOG2])
    assert s.n_queries == 2
    # histogram: -inf clipped into the first bin; the others where their logs fall
    edges = s.bin_edges
    assert s.counts.sum() == 6 and s.counts[0, 0] == 1
    for h, vals in ((0, [math.log(1.5), math.log(0.5)]), (1, [0.0, math.log(0.5), math.log(0.5)])):
        expect = np.histogram(vals, bins=edges)[0]
        if h == 0:
            expect[0] += 1
        np.testing.assert_array_equal(s.counts[h], expect)
    # epsilon is configurable: with eps = 0.6 the keys with mass 0.5 and 0 count
    s2 = explained_away_stats(w, qm, km, eps=0.6)
    np.testing.assert_allclose(s2.fraction_explained_away, [2 / 3, 2 / 3])


def test_explained_away_accumulator_adds_up():
    edges = default_bin_edges(-20.0, 1.0, 1.0)
    batches = []
    for seed in range(3):
        samples = [random_rows(2, nq, nk, seed=40 + 3 * seed + i, sharp=4.0)
                   for i, (nq, nk) in enumerate([(3, 5), (5, 4)])]
        batches.append(pad_batch(samples, 6, 6, seed))
    acc = ExplainedAwayAccumulator(bin_edges=edges)
    parts = []
    for w, qm, km in batches:
        acc.update(w, qm, km)
        p = ExplainedAwayAccumulator(bin_edges=edges)
        p.update(w, qm, km)
        parts.append(p)
    merged = parts[0].merge(parts[1]).merge(parts[2])
    a, m = acc.compute(), merged.compute()
    np.testing.assert_array_equal(a.counts, m.counts)
    np.testing.assert_array_equal(a.counts, sum(explained_away_stats(*b, bin_edges=edges).counts for b in batches))
    assert a.n_keys == 3 * (5 + 4) and a.counts.sum(1).tolist() == [a.n_keys] * 2
    np.testing.assert_allclose(a.entropy, m.entropy)
    np.testing.assert_array_equal(a.min_margin, m.min_margin)
    assert (a.sk_min, a.sk_max) == (4, 5)
    with pytest.raises(ValueError):
        a_other = ExplainedAwayAccumulator()
        a_other.update(*batches[0])
        acc.merge(a_other)  # different bins


def test_row_entropy_uniform_is_log_n():
    w = torch.zeros(1, 1, 2, 5, dtype=torch.float64)
    w[0, 0, :, :4] = 0.25
    ent, qr = row_entropy(w, k_mask=torch.tensor([[True] * 4 + [False]]))
    torch.testing.assert_close(ent[0, 0], torch.full((2,), math.log(4), dtype=torch.float64))


def qk(b, h, s, d, seed, scale):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, s, d, generator=g, dtype=torch.float64) * scale
    k = torch.randn(b, h, s, d, generator=g, dtype=torch.float64) * scale
    v = torch.randn(b, h, s, d, generator=g, dtype=torch.float64)
    return q, k, v


def test_theorem2_visible_dnas_vs_unas():
    """Ding et al. Theorem 2: DNAS gives every key mass >= 1/Sk (non-causal, no padding);
    UNAS with sharp scores explains keys away."""
    q, k, v = qk(2, 4, 24, 8, seed=0, scale=6.0)  # score std ~ 36: sharp
    dn = DNAS(heads=4).eval()(q, k, v, need_weights=True).weights
    s = explained_away_stats(dn, eps=1e-8)
    assert (s.min_margin >= -1e-12).all()
    assert (s.min_log_mass >= -math.log(24) - 1e-12).all()
    assert (s.fraction_explained_away == 0).all() and (s.fraction_below_bound == 0).all()
    # Fig. 1 picture: no DNAS key in a bin lying wholly left of -log Sk
    assert s.counts[:, s.bin_edges[1:] <= -math.log(24)].sum() == 0
    un = UNAS(heads=4).eval()(q, k, v, need_weights=True).weights
    su = explained_away_stats(un, eps=1e-8)
    assert (su.fraction_explained_away > 0).all()
    assert (su.min_margin < 0).all()


def test_theorem2_per_sample_sk_with_padding():
    """With padding the bound is 1 / (real keys of that sample), which the masked DNAS keeps."""
    q, k, v = qk(3, 2, 10, 8, seed=1, scale=4.0)
    lengths = torch.tensor([10, 6, 3])
    mask = torch.arange(10)[None, :] < lengths[:, None]
    dn = DNAS(heads=2).eval()(q, k, v, q_mask=mask, k_mask=mask, need_weights=True).weights
    s = explained_away_stats(dn, mask, mask)
    assert s.n_keys == int(lengths.sum()) and (s.sk_min, s.sk_max) == (3, 10)
    assert (s.min_margin >= -1e-12).all() and (s.fraction_below_bound == 0).all()


# ---------------------------------------------------------------- collector and plots


def test_collector_over_locations():
    q, k, v = qk(2, 3, 7, 4, seed=2, scale=2.0)
    src = torch.tensor([[True] * 7, [True] * 5 + [False] * 2])
    tgt = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    enc = DNAS(heads=3).eval()
    dec = UNAS(heads=3, causal=True).eval()
    attn = {
        "encoder": [enc(q, k, v, src, src, need_weights=True) for _ in range(2)],
        "decoder": [dec(q, k, v, tgt, tgt, need_weights=True)],
        "cross": [UNAS(heads=3).eval()(q, k, v, tgt, src, need_weights=True)],
    }
    diag = AttentionDiagnostics()
    masks = location_masks(src, tgt)
    diag.update(attn, masks)
    diag.update(attn, masks)
    res = diag.compute()
    assert [len(res[loc]) for loc in ("cross", "decoder", "encoder")] == [1, 1, 2]
    torch.testing.assert_close(res["encoder"][0]["jsd"], head_jsd(attn["encoder"][0].weights, src, src))
    assert res["encoder"][0]["explained_away"].n_keys == 2 * 12
    flat = diag.scalars()
    assert flat["diag/encoder/layer1/min_log_mass_margin"] >= -1e-12
    assert set(flat) >= {"diag/decoder/layer0/jsd_mean", "diag/cross/layer0/explained_away_frac",
                         "diag/encoder/layer0/entropy"}
    with pytest.raises(ValueError, match="need_weights"):
        diag.update({"encoder": [AttentionOutput(torch.zeros(1))]}, masks)
    u = {"encoder": [AttentionOutput(torch.zeros(1), None, {"u": torch.tensor([0.1, 0.9])}) for _ in range(3)]}
    assert collect_aux(u, "u")["encoder"].shape == (3, 2) and collect_aux(attn, "u") == {}


def test_plots_write_png(tmp_path):
    from nas_cli.diagnostics import figures as plots

    m = [head_jsd(torch.stack([random_rows(4, 5, 6, seed=s)])) for s in range(3)]
    p1 = plots.plot_jsd_heatmaps(m, tmp_path / "jsd.png", suptitle="encoder")
    p1b = plots.plot_jsd_heatmaps({"enc 0": m[0].numpy()}, tmp_path / "jsd1.png")
    q, k, v = qk(2, 2, 16, 8, seed=3, scale=4.0)
    stats = {name: explained_away_stats(core(heads=2).eval()(q, k, v, need_weights=True).weights)
             for name, core in (("UNAS", UNAS), ("DNAS", DNAS))}
    p2 = plots.plot_log_mass_histograms(stats, tmp_path / "hist.png")
    p2b = plots.plot_log_mass_histograms({"UNAS": stats["UNAS"].counts[0]}, tmp_path / "hist1.png",
                                         bin_edges=stats["UNAS"].bin_edges, neg_log_sk=-math.log(16))
    hist = [(step, np.clip(np.random.default_rng(step).random((3, 4)), 0, 1)) for step in (0, 100, 50)]
    p3 = plots.plot_trajectories(hist, tmp_path / "u.png", title="HNAS u", name="u")
    p3b = plots.plot_trajectories([(0, torch.tensor([0.1, 0.2])), (5, torch.tensor([0.3, 0.4]))],
                                  tmp_path / "u1.png")
    for p in (p1, p1b, p2, p2b, p3, p3b):
        data = p.read_bytes()
        assert len(data) > 1000 and data[:8] == PNG_MAGIC


def test_chunked_computation_is_identical():
    """Chunking over samples (memory bound) changes nothing."""
    samples = [random_rows(3, nq, nk, seed=50 + i, sharp=3.0) for i, (nq, nk) in enumerate([(5, 6), (2, 4), (4, 1)])]
    w, qm, km = pad_batch(samples, 5, 6)
    assert torch.equal(head_jsd_per_sample(w, qm, km), head_jsd_per_sample(w, qm, km, max_elements=50))
    a, b = ExplainedAwayAccumulator(), ExplainedAwayAccumulator()
    a.update(w, qm, km)
    b.update(w, qm, km, max_elements=50)
    sa, sb = a.compute(), b.compute()
    np.testing.assert_array_equal(sa.counts, sb.counts)
    np.testing.assert_array_equal(sa.min_margin, sb.min_margin)
    np.testing.assert_allclose(sa.entropy, sb.entropy, rtol=1e-14)


def test_the_sink_rate_of_weights_without_a_bound_is_on_each_rows_shares_of_its_mass():
    """A head whose first key holds 0.6 of a weight but 3% of its row's mass (the rest: 10 and 10) is a sink
    head by the absolute threshold only: for a scheme that declares weights in [0, 1] the raw 0.6 counts
    (sigmoid's first-key weight is a share of one), for one without a bound (weight_max = inf) the share."""
    import math

    from nas_cli.attention.base import AttentionOutput
    from nas_cli.diagnostics.collector import AttentionDiagnostics
    from nas_cli.diagnostics.locations import location_scalars
    from nas_cli.diagnostics.sinks import RowMass, SinkRate

    w = torch.tensor([0.6, 10.0, 10.0]).expand(1, 2, 3, 3).clone()  # (B, H, Sq, Sk)
    out = {}
    for top in (1.0, math.inf):
        diag = AttentionDiagnostics(metrics=[SinkRate(), RowMass()])
        res = AttentionOutput(torch.zeros(1, 2, 3, 4), w, rows_sum_to_one=False, weight_max=top)
        diag.update({"decoder": [res]}, {})
        out[top] = location_scalars(diag.compute()["decoder"], diag.metrics)
    assert out[1.0]["sink_rate"] == 1.0 and "derived" not in out[1.0]
    assert out[math.inf]["sink_rate"] == 0.0 and "shares of its mass" in out[math.inf]["derived"]["sink_rate"]
    assert out[math.inf]["row_mass"] == pytest.approx(20.6)  # the row mass itself stays on the weights


def test_a_key_with_no_mass_has_the_float32_floor_as_its_margin_and_null_means_not_applicable():
    """A key no query attends to (its float32 weights all 0) has log mass -inf: written as log of float32's
    smallest subnormal in JSON, so that null is left to one meaning, a diagnostic that does not apply."""
    import json
    import math

    from nas_cli.attention.base import AttentionOutput
    from nas_cli.diagnostics.collector import AttentionDiagnostics
    from nas_cli.diagnostics.explained_away import LOG_FLOAT32_TINY
    from nas_cli.diagnostics.locations import location_scalars

    w = torch.zeros(1, 2, 3, 3)
    w[..., 0] = 1.0  # every query on the first key: keys 1 and 2 get nothing
    diag = AttentionDiagnostics()
    diag.update({"encoder": [AttentionOutput(torch.zeros(1, 2, 3, 4), w)]}, {})
    layers = diag.compute()["encoder"]
    scalars = location_scalars(layers, diag.metrics)
    assert scalars["min_margin"] == LOG_FLOAT32_TINY == math.log(float(np.finfo(np.float32).smallest_subnormal))
    assert layers[0]["explained_away"].to_dict()["min_margin"] == [LOG_FLOAT32_TINY] * 2
    json.dumps(scalars, allow_nan=False)  # JSON holds it
    signed = AttentionDiagnostics()
    signed.update({"encoder": [AttentionOutput(torch.zeros(1, 2, 3, 4), w - 0.5, nonnegative=False)]}, {})
    scalars = location_scalars(signed.compute()["encoder"], signed.metrics)
    assert scalars["min_margin"] is None and "min_margin" in scalars["not_applicable"]


def test_the_sink_rate_of_signed_weights_is_on_each_rows_shares_of_its_absolute_mass():
    """Differential attention's rows: the first key holds 0.35 of a row whose other weights are -0.5 and 0.8 (mass
    0.65, absolute mass 1.65). Its share of the absolute mass, 0.35 / 1.65 = 0.21, is under the threshold: no sink,
    where the raw 0.35 would have been one; a first key with -0.9 of 1.2 absolute mass (0.75) is a sink. Written
    out here against the plain formula, with the reason under ``derived``."""
    from nas_cli.attention.base import AttentionOutput
    from nas_cli.diagnostics.collector import AttentionDiagnostics
    from nas_cli.diagnostics.locations import location_scalars
    from nas_cli.diagnostics.sinks import RowMass, SinkRate

    rows = torch.tensor([[[0.35, -0.5, 0.8]] * 3, [[-0.9, 0.2, 0.1]] * 3])  # two heads, 3 queries, 3 keys
    w = rows.unsqueeze(0)  # (B, H, Sq, Sk)
    diag = AttentionDiagnostics(metrics=[SinkRate(), RowMass()])
    diag.update({"decoder": [AttentionOutput(torch.zeros(1, 2, 3, 4), w, rows_sum_to_one=False, nonnegative=False)]}, {})
    layer = diag.compute()["decoder"][0]
    expected = (w[..., 0].abs() / w.abs().sum(-1)).mean(-1)[0].double()  # per head, over the queries
    assert layer["first_key_weight"] == pytest.approx(expected.tolist())
    assert list(layer["sink_rate"]) == [0.0, 1.0]
    out = location_scalars(diag.compute()["decoder"], diag.metrics)
    assert out["sink_rate"] == 0.5 and "absolute mass" in out["derived"]["sink_rate"]
    assert out["row_mass"] == pytest.approx((0.65 + (-0.6)) / 2)  # the row mass itself stays on the weights
