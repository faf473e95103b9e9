"""Long-context retrieval as synthetic training tasks (``task=retrieval``): a needle in a haystack, in the
forms of passkey retrieval (Mohtashami & Jaggi 2023), RULER's needle-in-a-haystack variants (Hsieh et al.
2024: one needle; several keys, one asked; several values of one key; several keys asked), RULER's
variable tracking, and phonebook lookup (Jelassi et al. 2024, "Repeat After Me"), over tokens of their own.

A sequence of ``task.seq_len`` tokens is a haystack of filler tokens (drawn from a filler alphabet of
their own) with the needle(s) inserted, then the query, then the answer, whose tokens are scored (teacher
forced: ``retrieval_acc``, the accuracy of the answer tokens). The asked needle sits at a **depth** of the
haystack (0% at its start, 100% at its end): training draws it uniformly, evaluation tests each of
``task.depths`` on a share of the test set of its own (``retrieval_acc_depth<d>``), and ``eval_lengths``
tests every depth again at each longer length (more filler, the same needles): the length x depth grid,
drawn as a heatmap (``retrieval_heatmap.png`` in the run directory and in W&B).

Forms (``task.form``), with markers N (needle), Q (query), S (separator), V (a variable's sign):

* ``passkey``: ``N v1..vn S`` in the haystack; ``Q`` asks; the answer is the n digits of the pass key;
* ``single``: ``N k1..km S v1..vn S``; ``Q k1..km S`` asks for that key's value;
* ``multikey``: ``task.needles`` needles of distinct keys, one asked (the others distract);
* ``multivalue``: ``task.needles`` needles of one key with different values; the answer is every value,
  in the order they appear;
* ``multiquery``: ``task.needles`` needles of distinct keys, each asked in turn, each answer scored;
* ``variable_tracking``: ``V x1 S v..`` then ``V x(i+1) S x(i) S`` for ``task.needles - 1`` hops at later
  depths; ``Q v.. S`` asks which variables hold the value; the answer is x1 .. x(hops+1) in order;
* ``phonebook``: no filler: the context is a list of (name, number) entries, ``Q name S`` asks for one
  entry's number (its depth: where the entry is in the list).

Each split is a seeded function of ``task.seed`` (its own stream; each length and depth its own too), as
MQAR's are. Token ids are shifted past nas-run's PAD, BOS and EOS.
"""
from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from nas_cli.infra.options import PositiveInt

from .base import worker_options
from .recall import _collate, _RecallTask, _Rows

FORMS = ("passkey", "single", "multikey", "multivalue", "multiquery", "variable_tracking", "phonebook")
N, Q, S, V = 0, 1, 2, 3  # markers
MARKERS = 4
DIGITS = 10  # values are digit strings


class Layout:
    """Token id ranges: markers, keys (``keys`` symbols), digits, filler (``filler`` symbols)."""

    def __init__(self, keys: int, filler: int):
        self.key0, self.digit0 = MARKERS, MARKERS + keys
        self.filler0 = self.digit0 + DIGITS
        self.keys, self.filler, self.size = keys, filler, self.filler0 + filler


def _needle_parts(form: str, rng, layout: Layout, needles: int, key_len: int, value_len: int):
    """(the needles' token lists in haystack order, the query tokens, the answer tokens, which needle is
    asked (its index among the needles, for the depth)) of one sequence."""
    def key():
        return list(layout.key0 + rng.integers(0, layout.keys, size=key_len))

    def value():
        return list(layout.digit0 + rng.integers(0, DIGITS, size=value_len))

    if form == "passkey":
        v = value()
        return [[N, *v, S]], [Q], v, 0
    if form in ("single", "multikey", "multiquery"):
        count = 1 if form == "single" else needles
        keys = []
        while len(keys) < count:  # distinct keys
            k = key()
            if k not in keys:
                keys.append(k)
        values = [value() for _ in keys]
        parts = [[N, *k, S, *v, S] for k, v in zip(keys, values)]
        if form == "multiquery":
            query, answer = [], []
            for k, v in zip(keys, values):  # each asked in turn: Q k S v (the answer, then the next query)
                query.append([Q, *k, S])
                answer.append(v)
            return parts, query, answer, int(rng.integers(count))
        asked = int(rng.integers(count))
        return parts, [Q, *keys[asked], S], values[asked], asked
    if form == "multivalue":
        k = key()
        values = [value() for _ in range(needles)]
        return [[N, *k, S, *v, S] for v in values], [Q, *k, S], [t for v in values for t in v], 0
    if form == "variable_tracking":
        names = list(layout.key0 + rng.choice(layout.keys, size=needles, replace=False))
        v = value()
        parts = [[V, names[0], S, *v, S]] + [[V, names[i + 1], S, names[i], S] for i in range(needles - 1)]
        return parts, [Q, *v, S], names, 0
    raise ValueError(form)


def make_sequence(form: str, rng, layout: Layout, seq_len: int, depth: float | None, needles: int, key_len: int,
                  value_len: int) -> tuple[np.ndarray, np.ndarray]:
    """One sequence (before the shift) and its target (the answer tokens where they stand, -1 elsewhere)."""
    if form == "phonebook":
        return _phonebook(rng, layout, seq_len, depth, key_len, value_len)
    parts, query, answer, asked = _needle_parts(form, rng, layout, needles, key_len, value_len)
    tail_len = sum(len(q) + len(a) for q, a in zip(query, answer)) if form == "multiquery" \
        else len(query) + len(answer)
    body = sum(len(p) for p in parts)
    filler = seq_len - body - tail_len
    if filler < len(parts):
        raise ValueError(f"task.seq_len={seq_len - 1} is too short for the needles, the query and the answer "
                         f"({body + tail_len} tokens) and some filler: raise it, or lower task.needles")
    # where each needle goes among the filler: the asked one at ``depth`` (uniform when None), the others
    # uniformly; a chain's later hops after the earlier ones
    spots = np.sort(rng.integers(0, filler + 1, size=len(parts)))
    if form == "variable_tracking":
        spots = np.sort(spots)
    d = rng.random() if depth is None else depth
    spots[asked] = int(round(d * filler))
    if form != "variable_tracking":
        order = np.argsort(spots, kind="stable")
        parts, spots = [parts[i] for i in order], spots[order]
    else:
        spots = np.maximum.accumulate(spots)
    if form == "multivalue":  # every value, in the order the needles stand in the haystack
        answer = [t for p in parts for t in p[2 + key_len:-1]]
    tail = [t for q, a in zip(query, answer) for t in (*q, *a)] if form == "multiquery" else [*query, *answer]
    scored = ([np.arange(len(q), len(q) + len(a)) + sum(len(q2) + len(a2) for q2, a2 in zip(query[:i], answer[:i]))
               for i, (q, a) in enumerate(zip(query, answer))] if form == "multiquery"
              else [np.arange(len(query), len(query) + len(answer))])
    hay = layout.filler0 + rng.integers(0, layout.filler, size=filler)
    seq, at = [], 0
    for p, spot in zip(parts, spots):
        seq += list(hay[at:spot]) + p
        at = spot
    seq += list(hay[at:]) + tail
    seq = np.asarray(seq, dtype=np.int64)
    target = np.full(seq_len, -1, dtype=np.int64)
    start = seq_len - len(tail)
    for idx in scored:
        target[start + idx] = seq[start + idx]
    return seq, target


def _phonebook(rng, layout: Layout, seq_len: int, depth, key_len: int, value_len: int):
    entry = key_len + 1 + value_len + 1  # name S number S
    tail_len = 1 + key_len + 1 + value_len
    count = (seq_len - tail_len) // entry
    if count < 1:
        raise ValueError(f"task.seq_len={seq_len - 1} holds no phonebook entry and the query ({entry + tail_len} "
                         "tokens): raise it")
    names = []
    while len(names) < count:
        k = list(layout.key0 + rng.integers(0, layout.keys, size=key_len))
        if k not in names:
            names.append(k)
    numbers = [list(layout.digit0 + rng.integers(0, DIGITS, size=value_len)) for _ in names]
    d = rng.random() if depth is None else depth
    asked = min(count - 1, int(d * count))
    pad = seq_len - count * entry - tail_len  # leading filler to the exact length
    seq = list(layout.filler0 + rng.integers(0, layout.filler, size=pad))
    for k, v in zip(names, numbers):
        seq += [*k, S, *v, S]
    seq += [Q, *names[asked], S, *numbers[asked]]
    seq = np.asarray(seq, dtype=np.int64)
    target = np.full(seq_len, -1, dtype=np.int64)
    target[seq_len - value_len:] = seq[seq_len - value_len:]
    return seq, target


class _Grouped(Dataset):
    """Rows with the group (the depth) of each: the evaluation's accuracy per depth."""

    def __init__(self, inputs, targets, groups):
        self.inputs, self.targets = torch.from_numpy(inputs), torch.from_numpy(targets)
        self.groups = torch.from_numpy(groups)

    def __len__(self):
        return self.inputs.size(0)

    def __getitem__(self, i):
        return self.inputs[i], self.targets[i], self.groups[i]


def _grouped_collate(batch):
    out = _collate([(b[0], b[1]) for b in batch])
    out["group"] = torch.stack([b[2] for b in batch])
    return out


class Retrieval(_RecallTask):
    accuracy_name = "retrieval_acc"
    monitor = "val/retrieval_acc"
    metrics = {"retrieval_acc": ("retrieval acc.", True, "pct")}

    def __init__(self, name: str = "retrieval", form: str = "single", seq_len: PositiveInt = 256,
                 needles: PositiveInt = 4, key_len: PositiveInt = 2, value_len: PositiveInt = 4,
                 keys: PositiveInt = 64, filler: PositiveInt = 64, depths: list | None = None,
                 train_size: PositiveInt = 20_000, val_size: PositiveInt = 500, test_size: PositiveInt = 1000,
                 batch_size: PositiveInt = 64, seed: int = 1234, num_workers="auto"):
        if form not in FORMS:
            raise ValueError(f"task.form must be one of {', '.join(FORMS)} (got '{form}')")
        depths = [0, 25, 50, 75, 100] if depths is None else list(depths)
        bad = [d for d in depths if not isinstance(d, (int, float)) or isinstance(d, bool) or not 0 <= d <= 100]
        if bad or not depths:
            raise ValueError(f"task.depths must be needle depths in percent of the haystack, 0 to 100 (got "
                             f"{depths}); e.g. task.depths=[0,25,50,75,100]")
        if form == "variable_tracking" and needles > keys:
            raise ValueError(f"task.needles={needles} variables need as many names: raise task.keys (got {keys})")
        self.layout = Layout(int(keys), int(filler))
        super().__init__(name, self.layout.size, train_size, val_size, test_size, batch_size, seed, num_workers)
        self.form, self.seq_len, self.needles = form, int(seq_len), int(needles)
        self.key_len, self.value_len, self.keys, self.filler = int(key_len), int(value_len), int(keys), int(filler)
        self.depths = [float(d) for d in depths]
        self.group_names = [f"depth{int(d) if float(d).is_integer() else d}" for d in self.depths]
        self.make(1, np.random.default_rng(0))  # a length too short for the needles: refused here

    def make(self, n, rng, depth: float | None = None, groups: bool = False):
        """``n`` sequences (depth uniform, or ``depth`` in [0, 1]); with ``groups``, ``n`` per depth of
        ``task.depths``, each row's group (the depth's index) returned beside."""
        if groups:  # the depths interleaved, so that any first batches hold every depth
            rows = [self.make(n, rng, d / 100.0) for d in self.depths]
            inputs, target = np.stack([r[0] for r in rows], 1), np.stack([r[1] for r in rows], 1)
            return (inputs.reshape(-1, inputs.shape[-1]), target.reshape(-1, target.shape[-1]),
                    np.tile(np.arange(len(self.depths)), n))
        made = [make_sequence(self.form, rng, self.layout, self.seq_len + 1, depth, self.needles, self.key_len,
                              self.value_len) for _ in range(n)]
        seq = np.stack([m[0] for m in made])
        target = np.stack([m[1] for m in made])
        return seq[:, :-1], target[:, 1:]  # position t predicts the token at t + 1

    def make_split(self, split, n, rng):
        if split == "train":
            return self.make(n, rng)
        return self.make(max(1, n // len(self.depths)), rng, groups=True)

    def setup(self, stage=None):
        if self.splits:
            return
        for i, split in enumerate(("train", "val", "test")):  # each split its own stream of task.seed
            rows = self.make_split(split, self.sizes[split], np.random.default_rng([self.seed, i]))
            self.splits[split] = _Grouped(*rows) if len(rows) == 3 else _Rows(*rows)

    def _loader(self, split, shuffle):
        data = self.splits[split]
        collate = _grouped_collate if isinstance(data, _Grouped) else _collate
        return DataLoader(data, batch_size=self.batch_size, shuffle=shuffle, collate_fn=collate,
                          **worker_options(self.num_workers))

    def length_loader(self, split: str, length: int):
        """Every depth again at ``length`` (a stream of its own per split and length)."""
        index = {"val": 1, "valid": 1, "test": 2}[split]
        other = type(self)(**self.at_length(length))
        n = self.sizes["val" if index == 1 else "test"]
        rows = other.make(max(1, n // len(self.depths)), np.random.default_rng([self.seed, index, length]),
                          groups=True)
        batch = max(1, self.batch_size * self.seq_len // length)
        return DataLoader(_Grouped(*rows), batch_size=batch, shuffle=False, collate_fn=_grouped_collate,
                          **worker_options(self.num_workers))

    def at_length(self, length: int) -> dict:
        """The same needles in a longer haystack."""
        return dict(name=self.name, form=self.form, seq_len=length, needles=self.needles, key_len=self.key_len,
                    value_len=self.value_len, keys=self.keys, filler=self.filler, depths=self.depths)
