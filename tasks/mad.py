"""MAD's synthetic tasks (Poli et al. 2024, "Mechanistic Design and Scaling of Hybrid Architectures";
the definitions of athms/mad-lab's ``mad/data/instances.py`` and the settings of its ``configs/tasks/``).

Six tasks, each a task of its own (``task=mad_recall`` and the others below) with MAD's baseline setting
as its default (the harder settings of MAD's grid are options: ``task.vocab_size``, ``task.seq_len``,
``task.frac_noise``, ``task.num_tokens``, ``task.train_size``):

* ``mad_recall``: in-context recall. Key-value pairs (keys from the first half of the vocabulary, values
  from the second; a key keeps its value within a sequence), ``seq_len / 2 - 1`` of them, then one more
  pair whose key is one of the keys shown; every value of a key shown before is scored (MAD's
  ``multi_query``), the last one included.
* ``mad_noisy_recall``: the same with each pair replaced, with probability ``frac_noise``, by two tokens
  of a separate noise vocabulary (one pair is always kept).
* ``mad_fuzzy_recall``: keys and values are motifs of 1 .. ``k_motif_size`` / ``v_motif_size`` distinct
  tokens (at test time every key is ``k_motif_size`` long); the sequence is left-padded.
* ``mad_memorization``: (key, insert token) pairs whose value, the target at the insert token, comes
  from one fixed key-value map (the same in every sequence and split, drawn from ``task.map_seed``): the
  facts must be stored in the weights.
* ``mad_compression``: ``seq_len - 1`` random tokens and a compression token; the whole sequence is
  reconstructed from the model's state at the last position (MAD's auto-encoder read-out,
  :class:`~nas_cli.model.readout.LastStateDecoder`).
* ``mad_selective_copy``: ``task=selective_copy task.variant=mad`` at MAD's setting (tasks/recall.py).

As in MAD-lab, the recall tasks train on every next token of a training sequence and are scored on the
values only; the other tasks train on what they score. The score is MAD-lab's: ``mad_acc``, the class-
balanced accuracy of the scored positions (torchmetrics' macro ``MulticlassAccuracy``, which MAD-lab
uses). MAD-lab has no validation split (it stops and selects on its test set); here the validation set
is drawn apart, ``task.val_size`` sequences from their own stream, so that a choice made on validation
never sees the test set.

The generators are vectorized where the definition allows (recall, noisy recall, memorization,
compression); fuzzy recall, whose sequences are built motif by motif, is generated sequence by sequence.
Token ids are MAD's shifted past nas-run's PAD, BOS and EOS.
"""
from __future__ import annotations

from itertools import permutations

import numpy as np

from nas_cli.infra.options import PositiveInt

from .recall import MAD_ACC, SPECIALS, SelectiveCopy, _RecallTask


def in_context_recall(n: int, vocab_size: int, seq_len: int, noise_vocab_size: int, frac_noise: float,
                      rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n`` in-context recall sequences of ``seq_len`` tokens (before the shift) and their targets
    aligned with them (-1 where nothing is scored): MAD's definition with ``multi_query``."""
    symbols = vocab_size - noise_vocab_size
    keys_n = symbols // 2
    pairs = seq_len // 2 - 1  # then the probe pair
    rows = np.arange(n)[:, None]
    noise = np.zeros((n, pairs), dtype=bool)
    if frac_noise > 0:
        redo = np.ones(n, dtype=bool)
        while redo.any():  # one pair (at a uniform index of seq_len / 2) is always a pair; a row of noise only is redrawn
            m = int(redo.sum())
            keep = rng.integers(0, pairs + 1, size=m)
            noise[redo] = (rng.random((m, pairs)) < frac_noise) & (np.arange(pairs)[None, :] != keep[:, None])
            redo = noise.all(axis=1)
    keys = rng.integers(0, keys_n, size=(n, pairs))
    table = rng.integers(keys_n, symbols, size=(n, keys_n))  # each key's value in its sequence
    values = table[rows, keys]
    shown = np.where(noise, keys_n, keys)  # a noise pair shows no key
    first = np.full((n, keys_n + 1), pairs)
    np.minimum.at(first, (np.repeat(np.arange(n), pairs), shown.ravel()), np.tile(np.arange(pairs), n))
    seen_before = (first[rows, shown] < np.arange(pairs)[None, :]) & ~noise
    seq = np.empty((n, seq_len), dtype=np.int64)
    seq[:, 0:2 * pairs:2] = np.where(noise, rng.integers(symbols, vocab_size, size=(n, pairs)) if frac_noise > 0
                                     else 0, keys)
    seq[:, 1:2 * pairs:2] = np.where(noise, rng.integers(symbols, vocab_size, size=(n, pairs)) if frac_noise > 0
                                     else 0, values)
    target = np.full((n, seq_len), -1, dtype=np.int64)
    target[:, 1:2 * pairs:2] = np.where(seen_before, values, -1)
    presented = first[:, :keys_n] < pairs
    probe = np.argmax(np.where(presented, rng.random((n, keys_n)), -1.0), axis=1)  # uniform among the keys shown
    seq[:, 2 * pairs], seq[:, 2 * pairs + 1] = probe, table[np.arange(n), probe]
    target[:, 2 * pairs + 1] = seq[:, 2 * pairs + 1]
    return seq, target


def _motifs(vocab: np.ndarray, size: int) -> np.ndarray:
    """Every ordered ``size``-tuple of distinct tokens of ``vocab``, (count, size)."""
    return np.array(list(permutations(vocab.tolist(), size)), dtype=np.int64).reshape(-1, size)


def fuzzy_recall(n: int, vocab_size: int, seq_len: int, k_motif_size: int, v_motif_size: int, training: bool,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n`` fuzzy in-context recall sequences of ``seq_len + 1`` tokens (left-padded) and their aligned
    targets: MAD's definition with ``multi_query`` and no noise, built motif by motif."""
    pad = vocab_size - 1
    symbols = vocab_size - 1
    key_vocab, value_vocab = np.arange(symbols // 2), np.arange(symbols // 2, symbols)
    key_sizes = list(range(1, k_motif_size + 1)) if training else [k_motif_size]
    value_sizes = list(range(1, v_motif_size + 1))
    keys = {m: _motifs(key_vocab, m) for m in key_sizes}
    values = {m: _motifs(value_vocab, m) for m in value_sizes}
    seqs = np.full((n, seq_len + 1), pad, dtype=np.int64)
    targets = np.full((n, seq_len + 1), -1, dtype=np.int64)
    for row in range(n):
        kp_size, vp_size = key_sizes[rng.integers(len(key_sizes))], value_sizes[rng.integers(len(value_sizes))]
        k_probe = tuple(keys[kp_size][rng.integers(len(keys[kp_size]))])
        v_probe = tuple(values[vp_size][rng.integers(len(values[vp_size]))])
        probe_size = kp_size + vp_size
        probe_at = rng.integers(seq_len - 2 * probe_size)
        added = False
        known: dict[tuple, tuple] = {}  # key -> its value in this sequence
        shown: set[tuple] = set()
        x: list[int] = []
        y: list[int] = []
        while len(x) < seq_len - probe_size - (k_motif_size + v_motif_size):
            k_size, v_size = key_sizes[rng.integers(len(key_sizes))], value_sizes[rng.integers(len(value_sizes))]
            if len(x) >= probe_at and not added:
                x += [*k_probe, *v_probe]
                y += [-1] * probe_size
                known[k_probe] = v_probe
                shown.add(k_probe)
                added = True
                continue
            k = tuple(keys[k_size][rng.integers(len(keys[k_size]))])
            if k == k_probe:
                v, added = v_probe, True
            elif k in known:
                v = known[k]
            else:
                v = known[k] = tuple(values[v_size][rng.integers(len(values[v_size]))])
            x += [*k, *v]
            y += [-1] * k_size + (list(v) if k in shown else [-1] * len(v))
            shown.add(k)
        x += [*k_probe, *v_probe]
        y += [-1] * kp_size + list(v_probe)
        seqs[row, seq_len + 1 - len(x):] = x
        targets[row, seq_len + 1 - len(y):] = y
    return seqs, targets


def memorization_map(vocab_size: int, seed: int) -> np.ndarray:
    """The fixed key -> value map of ``mad_memorization``: keys 0 .. (vocab_size - 1) // 2 - 1, each paired
    with a distinct value of the upper half (below the insert token), both orders shuffled by
    numpy's generator seeded with ``seed`` as MAD-lab shuffles them (with MAD-lab's seed, its map)."""
    symbols = vocab_size - 1
    rng = np.random.default_rng(seed)
    keys = [(k,) for k in range(symbols // 2)]
    values = [(v,) for v in range(symbols // 2, symbols)]
    rng.shuffle(keys)
    rng.shuffle(values)
    table = np.full(symbols // 2, -1, dtype=np.int64)
    for (k,), (v,) in zip(keys, values):
        table[k] = v
    return table


def memorization(n: int, vocab_size: int, seq_len: int, table: np.ndarray, rng: np.random.Generator):
    """``n`` memorization sequences: ``seq_len / 2`` (key, insert token) pairs, keys uniform over the map's
    keys; the target at each insert token is its key's value (aligned, unshifted)."""
    pairs = seq_len // 2
    keys = rng.integers(0, len(table), size=(n, pairs))
    seq = np.empty((n, 2 * pairs), dtype=np.int64)
    seq[:, 0::2], seq[:, 1::2] = keys, vocab_size - 1
    target = np.full_like(seq, -1)
    target[:, 1::2] = table[keys]
    return seq, target


def compression(n: int, vocab_size: int, seq_len: int, rng: np.random.Generator):
    """``n`` compression sequences: ``seq_len - 1`` tokens uniform over 0 .. vocab_size - 2, then the
    compression token; the target is the sequence itself (every position)."""
    seq = np.empty((n, seq_len), dtype=np.int64)
    seq[:, :-1] = rng.integers(0, vocab_size - 1, size=(n, seq_len - 1))
    seq[:, -1] = vocab_size - 1
    return seq, seq.copy()


class _MADTask(_RecallTask):
    """A MAD task: MAD's score (``mad_acc``) chooses the checkpoint and is the test metric."""

    monitor = "val/mad_acc"
    accuracy_name = None  # the per-position accuracy is train/val/test token_acc
    macro_accuracy_name = "mad_acc"
    metrics = {"mad_acc": MAD_ACC}
    #: train on every next token (MAD's recall tasks), not only the scored positions
    train_all_tokens = False

    def __init__(self, name: str, vocab_size: int, seq_len: int, train_size: int, val_size: int, test_size: int,
                 batch_size: int, seed: int, num_workers):
        super().__init__(name, vocab_size, train_size, val_size, test_size, batch_size, seed, num_workers)
        self.seq_len = int(seq_len)

    def generate(self, n: int, rng: np.random.Generator, training: bool) -> tuple[np.ndarray, np.ndarray]:
        """MAD's sequences and their aligned targets (before any shift)."""
        raise NotImplementedError

    #: whether the model reads sequence[:-1] and predicts sequence[1:] (the recall tasks), or reads the
    #: sequence and is scored at its own positions (memorization, compression)
    shifted = True

    def make_split(self, split: str, n: int, rng: np.random.Generator):
        seq, target = self.generate(n, rng, split == "train")
        if not self.shifted:
            return seq, target
        return seq[:, :-1], (seq[:, 1:] if split == "train" and self.train_all_tokens else target[:, 1:])

    def make(self, n, rng):
        return self.make_split("test", n, rng)

    def trained_length(self) -> None:  # MAD's tasks are evaluated at their training setting only
        return None


def _check(vocab_size: int, least: int, why: str, seq_len: int, even: bool = False) -> None:
    if vocab_size < least:
        raise ValueError(f"task.vocab_size must be at least {least} ({why}), got {vocab_size}")
    if even and (seq_len % 2 or seq_len < 4):
        raise ValueError(f"task.seq_len must be an even number of at least 4 (key-value pairs), got {seq_len}")


class MADRecall(_MADTask):
    train_all_tokens = True

    def __init__(self, name: str = "mad_recall", vocab_size: PositiveInt = 16, seq_len: PositiveInt = 128,
                 noise_vocab_size: int = 0, frac_noise: float = 0.0, train_size: PositiveInt = 12_800,
                 val_size: PositiveInt = 1280, test_size: PositiveInt = 1280, batch_size: PositiveInt = 128,
                 seed: int = 1234, num_workers="auto"):
        if not 0 <= frac_noise < 1:
            raise ValueError(f"task.frac_noise must be in [0, 1) (got {frac_noise})")
        if frac_noise > 0 and noise_vocab_size < 1:
            raise ValueError("task.frac_noise > 0 needs task.noise_vocab_size >= 1 (the noise tokens' own vocabulary)")
        if not 0 <= noise_vocab_size <= vocab_size - 2:
            raise ValueError(f"task.noise_vocab_size={noise_vocab_size} must leave at least 2 of task.vocab_size="
                             f"{vocab_size} for keys and values")
        _check(vocab_size - noise_vocab_size, 2, "a key and a value besides the noise tokens", seq_len, even=True)
        super().__init__(name, vocab_size, seq_len, train_size, val_size, test_size, batch_size, seed, num_workers)
        self.noise_vocab_size, self.frac_noise = int(noise_vocab_size), float(frac_noise)

    def generate(self, n, rng, training):
        return in_context_recall(n, self.vocab_size, self.seq_len, self.noise_vocab_size, self.frac_noise, rng)


class MADNoisyRecall(MADRecall):
    def __init__(self, name: str = "mad_noisy_recall", vocab_size: PositiveInt = 32, seq_len: PositiveInt = 128,
                 noise_vocab_size: int = 16, frac_noise: float = 0.2, train_size: PositiveInt = 12_800,
                 val_size: PositiveInt = 1280, test_size: PositiveInt = 1280, batch_size: PositiveInt = 128,
                 seed: int = 1234, num_workers="auto"):
        super().__init__(name, vocab_size, seq_len, noise_vocab_size, frac_noise, train_size, val_size, test_size,
                         batch_size, seed, num_workers)


class MADFuzzyRecall(_MADTask):
    train_all_tokens = True

    def __init__(self, name: str = "mad_fuzzy_recall", vocab_size: PositiveInt = 16, seq_len: PositiveInt = 128,
                 k_motif_size: PositiveInt = 3, v_motif_size: PositiveInt = 3, train_size: PositiveInt = 12_800,
                 val_size: PositiveInt = 1280, test_size: PositiveInt = 1280, batch_size: PositiveInt = 128,
                 seed: int = 1234, num_workers="auto"):
        halves = (vocab_size - 1) // 2
        if halves < max(k_motif_size, v_motif_size):
            raise ValueError(f"task.vocab_size={vocab_size} leaves {halves} key tokens, fewer than a motif of "
                             f"{max(k_motif_size, v_motif_size)} distinct tokens needs: raise task.vocab_size")
        if seq_len < 4 * (k_motif_size + v_motif_size):
            raise ValueError(f"task.seq_len={seq_len} must be at least 4 x (task.k_motif_size + task.v_motif_size) = "
                             f"{4 * (k_motif_size + v_motif_size)}")
        super().__init__(name, vocab_size, seq_len, train_size, val_size, test_size, batch_size, seed, num_workers)
        self.k_motif_size, self.v_motif_size = int(k_motif_size), int(v_motif_size)

    def generate(self, n, rng, training):
        return fuzzy_recall(n, self.vocab_size, self.seq_len, self.k_motif_size, self.v_motif_size, training, rng)


class MADMemorization(_MADTask):
    shifted = False

    def __init__(self, name: str = "mad_memorization", vocab_size: PositiveInt = 256, seq_len: PositiveInt = 32,
                 map_seed: int = 12345, train_size: PositiveInt = 256, val_size: PositiveInt = 1280,
                 test_size: PositiveInt = 1280, batch_size: PositiveInt = 128, seed: int = 1234, num_workers="auto"):
        _check(vocab_size, 4, "a key, a value and the insert token", seq_len, even=True)
        super().__init__(name, vocab_size, seq_len, train_size, val_size, test_size, batch_size, seed, num_workers)
        self.map_seed = int(map_seed)
        self.table = memorization_map(self.vocab_size, self.map_seed)

    def generate(self, n, rng, training):
        return memorization(n, self.vocab_size, self.seq_len, self.table, rng)


class MADCompression(_MADTask):
    shifted = False
    #: the model's read-out: every position decoded from the last position's state (MAD's auto-encoder)
    readout = "last_state"

    def __init__(self, name: str = "mad_compression", vocab_size: PositiveInt = 16, seq_len: PositiveInt = 32,
                 train_size: PositiveInt = 12_800, val_size: PositiveInt = 1280, test_size: PositiveInt = 1280,
                 batch_size: PositiveInt = 128, seed: int = 1234, num_workers="auto"):
        _check(vocab_size, 2, "a token and the compression token", seq_len)
        super().__init__(name, vocab_size, seq_len, train_size, val_size, test_size, batch_size, seed, num_workers)

    def generate(self, n, rng, training):
        return compression(n, self.vocab_size, self.seq_len, rng)


class MADSelectiveCopy(SelectiveCopy):
    """``task=selective_copy task.variant=mad`` at MAD's setting, its score choosing the checkpoint."""

    monitor = "val/mad_acc"

    def __init__(self, name: str = "mad_selective_copy", variant: str = "mad", vocab_size: PositiveInt = 16,
                 seq_len: PositiveInt = 256, num_tokens: PositiveInt = 16, train_size: PositiveInt = 12_800,
                 val_size: PositiveInt = 1280, test_size: PositiveInt = 1280, batch_size: PositiveInt = 128,
                 seed: int = 1234, num_workers="auto"):
        if variant != "mad":
            raise ValueError(f"task.variant must be mad for task=mad_selective_copy (got '{variant}'); the Mamba form "
                             "is task=selective_copy task.variant=mamba")
        super().__init__(name, variant, vocab_size, seq_len, num_tokens, train_size, val_size, test_size, batch_size,
                         seed, num_workers)


__all__ = ["MADRecall", "MADNoisyRecall", "MADFuzzyRecall", "MADMemorization", "MADCompression", "MADSelectiveCopy",
           "in_context_recall", "fuzzy_recall", "memorization", "memorization_map", "compression", "SPECIALS"]
