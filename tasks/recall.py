"""The synthetic recall tasks the field tests attention mechanisms on first, for nas-run's language model.

``MQAR`` (``task=mqar``): multi-query associative recall as Arora et al. define it ("Zoology", 2023;
the definition of HazyResearch/zoology's ``zoology/data/multiquery_ar.py``). A sequence of
``seq_len`` tokens starts with ``num_kv_pairs`` key-value pairs (keys drawn without repetition from
the first half of the vocabulary, values from the second half), then the same keys again as queries,
each at an even offset of the rest of the sequence drawn without repetition with probability
proportional to ``power_a * g ** (power_a - 1)`` (power-law distances: most queries soon after the
pairs); the other positions hold random tokens (``random_non_queries``, the default of Zoology's
``MQARConfig``) or a blank (as Zoology's Figure 2 trains: ``experiment=zoology_fig2``). Only the position after each query is scored: its target is the key's value. The test
metric is the accuracy there (``query_acc``).

``SelectiveCopy`` (``task=selective_copy``): selective copying in its two published forms. ``task.variant=
mamba`` (the default) is the S4 repository's ``torch_copying_data(variable=True)``, the task of the Mamba
paper (Gu & Dao 2023, Appendix E.1): content tokens at uniformly drawn positions of a region of blanks,
then a copy marker per token, and the output at each marker is scored against the next content token.
``task.variant=mad`` is MAD-lab's (Poli et al. 2024): blanks inserted before the content tokens, a copy
token, then blanks whose outputs are the tokens, with MAD's class-balanced score beside the per-token
accuracy. In both, the answer region's inputs carry no content: every token is recalled from memory.

Both are seeded functions of ``task.seed`` (train, validation and test drawn from their own streams)
and vectorized (Gumbel top-k draws for sampling without replacement, exact for successive sampling).
Token ids are the task's tokens shifted past nas-run's PAD, BOS and EOS.
"""
from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from nas_cli.infra.options import PositiveInt

from .base import PAD, Task, loader_workers, worker_options

SPECIALS = 3  # PAD, BOS, EOS come first
#: MAD's score as a test metric (column title, higher is better, shown as a percentage): tasks/mad.py
MAD_ACC = ("MAD acc.", True, "pct")


def _distinct(rng: np.random.Generator, n: int, population: int, k: int, logp: np.ndarray | None = None) -> np.ndarray:
    """(n, k) draws without repetition from range(population) per row, with probabilities exp(logp)
    (uniform when None): the k largest of logp + Gumbel noise, in draw order. Uniform draws from a large
    population (MQAR's 4,096 keys) are drawn k at a time instead, each row with a repeat drawn again
    (an (n x population) noise table would be 3 GB for Zoology's 100,000 sequences)."""
    if logp is None and population > 4 * k * k:
        out = rng.integers(0, population, size=(n, k))
        while True:
            ordered = np.sort(out, axis=1)
            again = (ordered[:, 1:] == ordered[:, :-1]).any(axis=1)
            if not again.any():
                return out
            out[again] = rng.integers(0, population, size=(int(again.sum()), k))
    noise = rng.gumbel(size=(n, population))
    keys = noise if logp is None else noise + logp[None, :]
    return np.argsort(-keys, axis=1)[:, :k]


def mqar(n: int, vocab_size: int, seq_len: int, num_kv_pairs: int, power_a: float, random_non_queries: bool,
         rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n`` MQAR sequences: (inputs (n, seq_len), targets (n, seq_len) with -1 where nothing is scored), tokens
    in 0..vocab_size-1 (0 is the blank)."""
    context = 2 * num_kv_pairs
    half = vocab_size // 2
    keys = 1 + _distinct(rng, n, half - 1, num_kv_pairs)  # 1 .. half-1
    values = half + _distinct(rng, n, vocab_size - half, num_kv_pairs)  # half .. vocab-1
    seq = np.zeros((n, seq_len + 1), dtype=np.int64)
    seq[:, 0:context:2], seq[:, 1:context:2] = keys, values
    space = (seq_len - context) // 2  # query slots: even offsets after the pairs
    g = np.arange(1, space + 1, dtype=np.float64)
    logp = np.log(power_a) + (power_a - 1) * np.log(g)
    gaps = _distinct(rng, n, space, num_kv_pairs, logp - np.log(np.exp(logp).sum()))
    rows = np.arange(n)[:, None]
    seq[rows, context + 2 * gaps] = keys
    target = np.full((n, seq_len + 1), -1, dtype=np.int64)
    target[rows, context + 2 * gaps + 1] = values
    inputs, target = seq[:, :-1], target[:, 1:]  # the target of position t is the token at t + 1
    if random_non_queries:
        blank = inputs == 0
        inputs = np.where(blank, rng.integers(0, vocab_size, size=inputs.shape), inputs)
    return inputs, target


def selective_copy_mamba(n: int, vocab_size: int, seq_len: int, num_tokens: int, rng: np.random.Generator):
    """``n`` selective-copying sequences as the S4 repository's ``torch_copying_data(variable=True)`` makes
    them and the Mamba paper (Gu & Dao 2023, Appendix E.1) trains on: a region of ``seq_len - num_tokens``
    positions holding ``num_tokens`` content tokens (drawn uniformly, with repetition, from the ``vocab_size
    - 2`` content symbols 2 .. vocab_size-1) at a uniformly drawn set of positions (in order) among blanks
    (0), then ``num_tokens`` copy markers (1). The output at the j-th marker is scored against the j-th
    content token: the answer region's inputs are markers only, so every token is recalled from memory.
    (inputs (n, seq_len), targets (n, seq_len) with -1 where nothing is scored.)"""
    region = seq_len - num_tokens
    content = rng.integers(2, vocab_size, size=(n, num_tokens))
    where = np.sort(_distinct(rng, n, region, num_tokens), axis=1)  # a uniform num_tokens-subset of the region
    rows = np.arange(n)[:, None]
    inputs = np.zeros((n, seq_len), dtype=np.int64)
    inputs[rows, where] = content
    inputs[:, region:] = 1
    target = np.full_like(inputs, -1)
    target[:, region:] = content
    return inputs, target


def selective_copy_mad(n: int, vocab_size: int, seq_len: int, num_tokens: int, rng: np.random.Generator):
    """``n`` selective-copying sequences as MAD-lab's ``generate_selective_copying_instance`` makes them
    (Poli et al. 2024): ``num_tokens`` content tokens (uniform, with repetition, over the ``vocab_size - 2``
    content symbols 2 .. vocab_size-1) with ``seq_len - 2 num_tokens - 1`` blanks (0) inserted before them,
    each blank before a content token chosen uniformly (so the blanks before the tokens are multinomial,
    and the last content token ends the region), then the copy token (1), then ``num_tokens`` blanks; the
    output at the j-th blank after the copy token is scored against the j-th content token. (inputs (n,
    seq_len), targets (n, seq_len) with -1 where nothing is scored.)"""
    blanks = seq_len - 2 * num_tokens - 1
    content = rng.integers(2, vocab_size, size=(n, num_tokens))
    slot = rng.integers(0, num_tokens, size=(n, blanks))  # the content token each blank goes before
    before = np.zeros((n, num_tokens), dtype=np.int64)
    np.add.at(before, (np.repeat(np.arange(n), blanks), slot.ravel()), 1)
    where = np.arange(num_tokens)[None, :] + np.cumsum(before, axis=1)
    rows = np.arange(n)[:, None]
    inputs = np.zeros((n, seq_len), dtype=np.int64)
    inputs[rows, where] = content
    copy_at = num_tokens + blanks
    inputs[:, copy_at] = 1
    target = np.full_like(inputs, -1)
    target[:, copy_at + 1:] = content
    return inputs, target


#: ``task.variant`` of selective copying -> its generator
SELECTIVE_COPY = {"mamba": selective_copy_mamba, "mad": selective_copy_mad}


class _Rows(Dataset):
    def __init__(self, inputs: np.ndarray, targets: np.ndarray):
        self.inputs, self.targets = torch.from_numpy(inputs), torch.from_numpy(targets)

    def __len__(self):
        return self.inputs.size(0)

    def __getitem__(self, i):
        return self.inputs[i], self.targets[i]


def _collate(batch):
    ids = torch.stack([b[0] for b in batch]) + SPECIALS
    target = torch.stack([b[1] for b in batch])
    return {"ids": ids, "target": torch.where(target < 0, torch.full_like(target, PAD), target + SPECIALS)}


class _RecallTask(Task):
    """A decoder-only LM task on generated (inputs, targets) rows; scored where a target is set."""

    kind = "lm"
    monitor_mode = "max"
    #: the name under which the accuracy at the scored positions is the task's test metric
    accuracy_name = "acc"

    def __init__(self, name: str, vocab_size: int, train_size: int, val_size: int, test_size: int, batch_size: int,
                 seed: int, num_workers):
        super().__init__()
        self.name, self.vocab_size, self.seed = name, int(vocab_size), int(seed)
        self.sizes = {"train": int(train_size), "val": int(val_size), "test": int(test_size)}
        self.batch_size, self.num_workers = int(batch_size), loader_workers(num_workers)
        self.splits: dict[str, _Rows] = {}

    @property
    def src_vocab_size(self) -> int:
        return SPECIALS + self.vocab_size

    def make(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def make_split(self, split: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """The rows of ``split``: :meth:`make`'s, unless a task trains on other targets than it scores."""
        return self.make(n, rng)

    def setup(self, stage=None):
        if self.splits:
            return
        for i, split in enumerate(("train", "val", "test")):  # each split its own stream of task.seed
            self.splits[split] = _Rows(*self.make_split(split, self.sizes[split], np.random.default_rng([self.seed, i])))

    def _loader(self, split, shuffle):
        return DataLoader(self.splits[split], batch_size=self.batch_size, shuffle=shuffle, collate_fn=_collate,
                          **worker_options(self.num_workers))

    def trained_length(self) -> int:
        return self.seq_len

    def positions_needed(self) -> tuple[int, str]:
        return self.seq_len, f"task.seq_len={self.seq_len}"

    def tokens_per_step(self, items: int | None = None) -> int:
        return min(self.batch_size, items or self.batch_size) * self.seq_len

    def at_length(self, length: int) -> dict:
        """The task's options at ``length`` (``eval_lengths``): ``seq_len`` and what grows with it."""
        raise NotImplementedError

    def check_length(self, length: int) -> None:
        options = self.at_length(length)
        try:
            type(self)(**options)
        except ValueError as err:
            shown = ", ".join(f"{k}={v}" for k, v in options.items() if k != "name")
            raise ValueError(f"eval_lengths: at {length} tokens the task would be {shown}: {err}") from None

    def length_loader(self, split: str, length: int):
        """``task.test_size`` (``val_size``) sequences at ``length``, drawn from their own stream of
        ``task.seed`` (one per split and length), never the training data's; at the trained length, the
        split itself (so that ``test/<metric>@<trained length>`` is ``test/<metric>``)."""
        index = {"val": 1, "valid": 1, "test": 2}[split]
        if length == self.seq_len:
            return self._loader("val" if index == 1 else "test", False)
        rows = type(self)(**self.at_length(length)).make(self.sizes["val" if index == 1 else "test"],
                                                          np.random.default_rng([self.seed, index, length]))
        batch = max(1, self.batch_size * self.seq_len // length)
        return DataLoader(_Rows(*rows), batch_size=batch, shuffle=False, collate_fn=_collate,
                          **worker_options(self.num_workers))

    def ids_to_text(self, ids) -> str:
        return " ".join(str(int(i) - SPECIALS) for i in ids if int(i) >= SPECIALS)


class MQAR(_RecallTask):
    accuracy_name = "query_acc"
    monitor = "val/query_acc"
    metrics = {"query_acc": ("query acc.", True, "pct")}

    def __init__(self, name: str = "mqar", vocab_size: PositiveInt = 8192, seq_len: PositiveInt = 64,
                 num_kv_pairs: PositiveInt = 4, power_a: float = 0.01, random_non_queries: bool = True,
                 train_size: PositiveInt = 100_000, val_size: PositiveInt = 1000, test_size: PositiveInt = 3000,
                 batch_size: PositiveInt = 64, seed: int = 1234, num_workers="auto"):
        if seq_len % 2 or 4 * num_kv_pairs > seq_len:
            raise ValueError(f"task.seq_len={seq_len} must be even and at least 4 x task.num_kv_pairs "
                             f"({4 * num_kv_pairs}): the pairs, then a query slot per pair among the rest")
        if vocab_size <= seq_len or vocab_size // 2 <= num_kv_pairs:
            raise ValueError(f"task.vocab_size={vocab_size} must exceed task.seq_len ({seq_len}) and hold "
                             f"task.num_kv_pairs={num_kv_pairs} distinct keys and values in each half")
        if not 0 < power_a <= 1:
            raise ValueError(f"task.power_a must be in (0, 1] (got {power_a})")
        super().__init__(name, vocab_size, train_size, val_size, test_size, batch_size, seed, num_workers)
        self.seq_len, self.num_kv_pairs, self.power_a = int(seq_len), int(num_kv_pairs), float(power_a)
        self.random_non_queries = bool(random_non_queries)

    def at_length(self, length: int) -> dict:
        """Proportionally more pairs: Zoology's grid keeps seq_len / num_kv_pairs at 16."""
        return dict(name=self.name, vocab_size=self.vocab_size, seq_len=length,
                    num_kv_pairs=max(1, self.num_kv_pairs * length // self.seq_len), power_a=self.power_a,
                    random_non_queries=self.random_non_queries)

    def make(self, n, rng):
        return mqar(n, self.vocab_size, self.seq_len, self.num_kv_pairs, self.power_a, self.random_non_queries, rng)


class SelectiveCopy(_RecallTask):
    accuracy_name = "copy_acc"
    monitor = "val/copy_acc"
    metrics = {"copy_acc": ("copy acc.", True, "pct")}

    def __init__(self, name: str = "selective_copy", variant: str = "mamba", vocab_size: PositiveInt = 16,
                 seq_len: PositiveInt = 256, num_tokens: PositiveInt = 16, train_size: PositiveInt = 20_000,
                 val_size: PositiveInt = 500, test_size: PositiveInt = 1000, batch_size: PositiveInt = 64,
                 seed: int = 1234, num_workers="auto"):
        if variant not in SELECTIVE_COPY:
            raise ValueError(f"task.variant must be one of {', '.join(SELECTIVE_COPY)} (got '{variant}'): mamba is S4's "
                             "and the Mamba paper's form (copy markers in the answer region), mad is MAD-lab's "
                             "(blanks there)")
        if variant == "mamba" and 2 * num_tokens > seq_len:
            raise ValueError(f"task.num_tokens={num_tokens} must be at most half of task.seq_len={seq_len} (the "
                             "region holding them, then a copy marker per token)")
        if variant == "mad" and 2 * num_tokens + 1 >= seq_len:
            raise ValueError(f"task.seq_len={seq_len} must exceed 2 x task.num_tokens + 1 = {2 * num_tokens + 1} "
                             "with task.variant=mad (the tokens and at least one blank, the copy token, the answer)")
        if vocab_size < 3:
            raise ValueError(f"task.vocab_size must be at least 3 (a blank, the copy marker, a content token), "
                             f"got {vocab_size}")
        super().__init__(name, vocab_size, train_size, val_size, test_size, batch_size, seed, num_workers)
        self.variant, self.seq_len, self.num_tokens = variant, int(seq_len), int(num_tokens)
        if variant == "mad":  # MAD-lab's own score beside the per-token accuracy (tasks/mad.py)
            self.macro_accuracy_name = "mad_acc"
            self.metrics = {**self.metrics, "mad_acc": MAD_ACC}

    def at_length(self, length: int) -> dict:
        """Proportionally more content tokens in a proportionally longer region."""
        return dict(name=self.name, variant=self.variant, vocab_size=self.vocab_size, seq_len=length,
                    num_tokens=max(1, self.num_tokens * length // self.seq_len))

    def make(self, n, rng):
        return SELECTIVE_COPY[self.variant](n, self.vocab_size, self.seq_len, self.num_tokens, rng)
