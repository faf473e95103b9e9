"""The tasks named after a paper's protocol are that protocol: each generator's samples are compared with
samples of a transcription of the published definition, written here from the source's description
(S4's ``torch_copying_data``, MAD-lab's ``mad/data/instances.py``), sequence by sequence as the sources
generate them. The comparisons are of distributions (where the content tokens sit, how far apart, what is
scored, what is noise), not just of shapes; a generator of the other form fails them. MAD's score is checked
against torchmetrics' ``MulticlassAccuracy``, which MAD-lab computes it with."""
from itertools import permutations

import numpy as np
import pytest
import torch
from scipy import stats

from tasks.mad import compression, fuzzy_recall, in_context_recall, memorization, memorization_map
from tasks.recall import selective_copy_mad, selective_copy_mamba


# ---- transcriptions of the published definitions (one sequence at a time, as the sources do) ----

def s4_selective_copy(rng, noise: int, memorize: int, alphabet: int):
    """S4 torch_copying_data(L=noise, M=memorize, A=alphabet, variable=True): tokens 1..A-2 at a random
    M-subset (sorted) of the first L+M positions, zeros elsewhere, then M markers A-1; y = the tokens."""
    tokens = rng.integers(1, alphabet - 1, size=memorize)
    where = np.sort(rng.permutation(noise + memorize)[:memorize])
    x = np.zeros(noise + memorize, dtype=np.int64)
    x[where] = tokens
    return np.concatenate([x, np.full(memorize, alphabet - 1)]), tokens


def mad_selective_copy(rng, vocab: int, seq_len: int, to_copy: int):
    """MAD-lab generate_copying_instance(selective=True): tokens from 0..vocab-3, blanks (vocab-2) inserted
    one at a time before a uniformly chosen token index, the copy token (vocab-1), then blanks; the
    targets: the tokens at the last to_copy positions."""
    blank, copy = vocab - 2, vocab - 1
    tokens = rng.choice(np.arange(vocab - 2), size=to_copy, replace=True)
    blanks = seq_len - 2 * to_copy - 1
    x = np.insert(tokens, rng.integers(0, to_copy, blanks), [blank] * blanks).tolist()
    x = np.array(x + [copy] + [blank] * to_copy)
    y = np.array([-100] * (seq_len - to_copy) + list(tokens))
    return x, y


def mad_recall(rng, vocab: int, seq_len: int, noise_vocab: int = 0, frac_noise: float = 0.0):
    """MAD-lab generate_in_context_recall_instance(multi_query=True), test targets (before the shift)."""
    symbols = vocab - noise_vocab
    key_vocab, value_vocab = np.arange(symbols // 2), np.arange(symbols // 2, symbols)
    noise_vocab_ids = np.arange(symbols, symbols + noise_vocab)
    pairs = seq_len // 2
    keep = rng.choice(pairs)
    kv, shown, x, y = {}, {}, [], []
    for i in range(pairs - 1):
        if frac_noise > 0 and i != keep and rng.random() < frac_noise:
            x += list(rng.choice(noise_vocab_ids, size=2, replace=True))
            y += [-100, -100]
            continue
        k = rng.choice(key_vocab)
        v = kv.setdefault(k, rng.choice(value_vocab))
        x += [k, v]
        y += [-100, v if k in shown else -100]
        shown[k] = v
    k = rng.choice(list(shown))
    x += [k, shown[k]]
    y += [-100, shown[k]]
    return np.array(x), np.array(y)


def mad_fuzzy(rng, vocab: int, seq_len: int, k_motif: int, v_motif: int, training: bool):
    """MAD-lab generate_fuzzy_in_context_recall_instance(multi_query=True, no noise), before the shift."""
    pad = vocab - 1
    symbols = vocab - 1
    key_vocab, value_vocab = list(range(symbols // 2)), list(range(symbols // 2, symbols))
    ks = list(range(1, k_motif + 1)) if training else [k_motif]
    vs = list(range(1, v_motif + 1))
    keys = {m: list(permutations(key_vocab, m)) for m in ks}
    values = {m: list(permutations(value_vocab, m)) for m in vs}
    kps, vps = ks[rng.integers(len(ks))], vs[rng.integers(len(vs))]
    kp, vp = keys[kps][rng.integers(len(keys[kps]))], values[vps][rng.integers(len(values[vps]))]
    at = rng.integers(seq_len - 2 * (kps + vps))
    added, kv, shown, x, y = False, {}, set(), [], []
    while len(x) < seq_len - (kps + vps) - (k_motif + v_motif):
        k_size, v_size = ks[rng.integers(len(ks))], vs[rng.integers(len(vs))]
        if len(x) >= at and not added:
            x += list(kp) + list(vp)
            y += [-100] * (kps + vps)
            kv[kp], added = vp, True
            shown.add(kp)
            continue
        k = keys[k_size][rng.integers(len(keys[k_size]))]
        if k == kp:
            v, added = vp, True
        else:
            v = kv.setdefault(k, values[v_size][rng.integers(len(values[v_size]))])
        x += list(k) + list(v)
        y += [-100] * k_size + (list(v) if k in shown else [-100] * len(v))
        shown.add(k)
    x += list(kp) + list(vp)
    y += [-100] * kps + list(vp)
    padding = seq_len + 1 - len(x)
    return np.array([pad] * padding + x), np.array([-100] * padding + y)


def mad_kv_map(vocab: int, seed: int) -> dict:
    """MAD-lab generate_kv_map(vocab - 1, seed): shuffled 1-permutations of each half, zipped."""
    rng = np.random.default_rng(seed)
    keys = list(permutations(range((vocab - 1) // 2), 1))
    values = list(permutations(range((vocab - 1) // 2, vocab - 1), 1))
    rng.shuffle(keys)
    rng.shuffle(values)
    return {k[0]: v[0] for k, v in zip(keys, values)}


# ---- helpers ----

def same_distribution(a, b, bins):
    """Two samples of a discrete quantity come from one distribution (chi-square on their histograms)."""
    table = np.stack([np.bincount(a, minlength=bins), np.bincount(b, minlength=bins)])
    table = table[:, table.sum(0) > 0]
    return stats.chi2_contingency(table).pvalue


def gaps(positions):
    return np.diff(positions, axis=-1).ravel()


# ---- selective copying ----

def test_the_mamba_form_is_s4s_generator_with_markers_as_the_answers_inputs():
    n, vocab, seq_len, m = 3000, 16, 64, 8
    x, y = selective_copy_mamba(n, vocab, seq_len, m, np.random.default_rng(0))
    rng = np.random.default_rng(1)
    ref = [s4_selective_copy(rng, seq_len - 2 * m, m, vocab) for _ in range(n)]
    region = seq_len - m
    assert (x[:, region:] == 1).all()  # the answer region's inputs: the copy markers only
    assert np.array_equal(y[:, region:], np.stack([row[:region][row[:region] != 0] for row in x]))
    assert (y[:, :region] == -1).all()
    ours = np.stack([np.flatnonzero(row[:region]) for row in x])  # where the content tokens sit
    theirs = np.stack([np.flatnonzero(rx[:region]) for rx, _ in ref])
    assert same_distribution(ours.ravel(), theirs.ravel(), region) > 1e-3
    assert same_distribution(gaps(ours), gaps(theirs), region) > 1e-3
    # the content symbols: S4's 1..A-2 are this form's 2..vocab-1, uniform
    assert same_distribution(y[:, region:].ravel() - 2, np.concatenate([t for _, t in ref]) - 1, vocab) > 1e-3


def test_the_mad_form_is_mad_labs_generator_with_blanks_as_the_answers_inputs():
    n, vocab, seq_len, m = 3000, 16, 64, 8
    x, y = selective_copy_mad(n, vocab, seq_len, m, np.random.default_rng(0))
    rng = np.random.default_rng(1)
    ref = [mad_selective_copy(rng, vocab, seq_len, m) for _ in range(n)]
    copy_at = seq_len - m - 1
    assert (x[:, copy_at] == 1).all() and (x[:, copy_at + 1:] == 0).all()  # the copy token, then blanks
    assert all((rx[copy_at] == vocab - 1) and (rx[copy_at + 1:] == vocab - 2).all() for rx, _ in ref)
    ours = np.stack([np.flatnonzero(row[:copy_at]) for row in x])
    theirs = np.stack([np.flatnonzero(rx[:copy_at] != vocab - 2) for rx, _ in ref])
    assert (ours[:, -1] == copy_at - 1).all() and (theirs[:, -1] == copy_at - 1).all()  # the last token ends the region
    assert same_distribution(ours.ravel(), theirs.ravel(), copy_at) > 1e-3
    assert same_distribution(gaps(ours), gaps(theirs), copy_at) > 1e-3
    assert np.array_equal(y[:, copy_at + 1:], np.take_along_axis(x, ours, 1))
    assert same_distribution(y[:, copy_at + 1:].ravel() - 2, np.concatenate([ry[copy_at + 1:] for _, ry in ref]),
                             vocab) > 1e-3


def test_the_two_forms_differ_where_the_sources_differ():
    """At MAD's setting the gaps between content tokens have sd about 3.6 in MAD's form and about 13
    in S4's (the placement the two sources publish); each form's own test above would fail the other's."""
    mamba, _ = selective_copy_mamba(2000, 16, 256, 16, np.random.default_rng(3))
    mad, _ = selective_copy_mad(2000, 16, 256, 16, np.random.default_rng(3))
    sd = {name: gaps(np.stack([np.flatnonzero(r[:region]) for r in x])).std() for name, x, region in
          (("mamba", mamba, 240), ("mad", mad, 239))}
    assert 12 < sd["mamba"] < 14 and 3.2 < sd["mad"] < 4.0


# ---- MAD's recall tasks ----

@pytest.mark.parametrize("vocab,noise_vocab,frac_noise", [(16, 0, 0.0), (32, 16, 0.4)])
def test_in_context_recall_matches_mad_labs_definition(vocab, noise_vocab, frac_noise):
    n, seq_len = 2000, 32
    seq, tgt = in_context_recall(n, vocab, seq_len, noise_vocab, frac_noise, np.random.default_rng(0))
    rng = np.random.default_rng(1)
    ref = [mad_recall(rng, vocab, seq_len, noise_vocab, frac_noise) for _ in range(n)]
    symbols = vocab - noise_vocab
    for x, y in zip(seq[:200], tgt[:200]):  # item by item: every scored value is its key's, seen before
        kv = {}
        for i in range(0, seq_len, 2):
            k, v = x[i], x[i + 1]
            if k >= symbols:
                assert v >= symbols and y[i + 1] == -1
                continue
            assert k < symbols // 2 <= v < symbols and kv.setdefault(k, v) == v
            assert (y[i + 1] == v) == (i == seq_len - 2 or sum(x[j] == k for j in range(0, i, 2)) > 0)
    scored = (tgt >= 0).sum(1)  # values scored per sequence: a law of the repeats
    assert same_distribution(scored, np.array([(ry >= 0).sum() for _, ry in ref]), seq_len) > 1e-3
    noise = (seq[:, 0:-2:2] >= symbols).sum(1)
    assert same_distribution(noise, np.array([(rx[0:-2:2] >= symbols).sum() for rx, _ in ref]), seq_len) > 1e-3
    assert same_distribution(seq[:, -2], np.array([rx[-2] for rx, _ in ref]), vocab) > 1e-3  # the probe key


@pytest.mark.parametrize("training", [True, False])
def test_fuzzy_recall_matches_mad_labs_definition(training):
    n, vocab, seq_len = 600, 16, 48
    seq, tgt = fuzzy_recall(n, vocab, seq_len, 3, 3, training, np.random.default_rng(0))
    rng = np.random.default_rng(1)
    ref = [mad_fuzzy(rng, vocab, seq_len, 3, 3, training) for _ in range(n)]
    assert seq.shape == (n, seq_len + 1)
    assert same_distribution((seq == vocab - 1).sum(1), np.array([(rx == vocab - 1).sum() for rx, _ in ref]),
                             seq_len + 1) > 1e-3  # the left padding
    assert same_distribution((tgt >= 0).sum(1), np.array([(ry >= 0).sum() for _, ry in ref]), seq_len + 1) > 1e-3
    last = np.array([np.flatnonzero(row < 7)[-1] for row in seq])  # where the probe key ends
    assert same_distribution(seq_len - last, np.array([seq_len - np.flatnonzero(rx < 7)[-1] for rx, _ in ref]),
                             seq_len + 1) > 1e-3


def test_memorization_uses_mad_labs_fixed_map_and_scores_the_insert_tokens():
    table = memorization_map(256, 12345)
    assert {k: int(v) for k, v in enumerate(table)} == mad_kv_map(256, 12345)  # the very map MAD-lab trains on
    seq, tgt = memorization(500, 256, 32, table, np.random.default_rng(0))
    assert (seq[:, 1::2] == 255).all() and (tgt[:, 0::2] == -1).all()
    assert np.array_equal(tgt[:, 1::2], table[seq[:, 0::2]])
    assert stats.chisquare(np.bincount(seq[:, 0::2].ravel(), minlength=127)).pvalue > 1e-3  # uniform keys


def test_compression_is_random_tokens_then_the_compression_token_reconstructed():
    seq, tgt = compression(2000, 16, 32, np.random.default_rng(0))
    assert (seq[:, -1] == 15).all() and np.array_equal(seq, tgt) and seq[:, :-1].max() == 14
    assert stats.chisquare(np.bincount(seq[:, :-1].ravel(), minlength=15)).pvalue > 1e-3


# ---- MAD's score ----

def test_mad_acc_is_torchmetrics_macro_accuracy_over_the_scored_positions():
    torchmetrics = pytest.importorskip("torchmetrics")
    from nas_cli.model.scoring import Scores, class_balanced_accuracy, class_counts

    g = torch.Generator().manual_seed(0)
    classes = 12
    target = torch.randint(0, classes - 2, (400,), generator=g)  # two classes never a target
    pred = torch.where(torch.rand(400, generator=g) < 0.6, target, torch.randint(0, classes, (400,), generator=g))
    zero = torch.zeros(())
    counts = sum(class_counts(Scores(zero, zero, zero, zero, zero, pred[i:i + 100], target[i:i + 100]), classes)
                 for i in range(0, 400, 100))  # accumulated over batches, as an evaluation does
    reference = torchmetrics.classification.MulticlassAccuracy(num_classes=classes, ignore_index=-100)
    reference.update(pred, target)
    assert class_balanced_accuracy(counts) == pytest.approx(float(reference.compute()), abs=1e-6)
    assert class_balanced_accuracy(counts) != pytest.approx(float((pred == target).float().mean()), abs=1e-3)
