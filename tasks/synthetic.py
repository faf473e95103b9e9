"""Built-in synthetic tasks: no download, seeded, small enough to train on a laptop CPU.

``SyntheticSeq2Seq`` (``task=reverse``, the default; also ``task=sort``, and ``task.op=copy``):
the source is a random string of ``min_len..max_len`` symbols drawn from ``symbols``
letters; the target is that string reversed (or sorted, or copied). Reversal needs
every output position to attend to one specific, moving source position, so it
exercises cross-attention; a model that solves it reaches ~100% exact match and
sacreBLEU ~100.

``SyntheticLM`` (``task=copy_lm``): decoder-only language modelling on sequences
``x SEP x``; the second copy is predictable only by attending back, so the scored
(second-half) accuracy and perplexity show whether causal attention works.
"""
from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset

from nas_cli.infra.options import PositiveInt

from .base import BOS, EOS, PAD, Task, collate_seq2seq, loader_workers, pad_batch, worker_options

SPECIALS = 3  # PAD, BOS, EOS
ALPHABET = [f"{chr(97 + i % 26)}{i // 26 or ''}" for i in range(512)]  # a..z, a1..z1, ...


def _strings(n: int, min_len: int, max_len: int, symbols: int, gen: torch.Generator) -> list[list[int]]:
    """``n`` strings: a length each, then each string's symbols, drawn from ``gen`` in that order. The
    symbols of all strings come from one draw: PyTorch's CPU generator gives one value per element in
    order, so this is the same data as one draw per string (tests/tasks: checked against that), in a
    tenth of the time (about 0.4 s of every run's start on the default 20,000 training strings)."""
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=gen).tolist()
    flat = (torch.randint(0, symbols, (sum(lengths),), generator=gen) + SPECIALS).tolist()
    out, start = [], 0
    for length in lengths:
        out.append(flat[start:start + length])
        start += length
    return out


class _Pairs(Dataset):
    def __init__(self, pairs):
        self.pairs = pairs

    def __len__(self):
        return len(self.pairs)

    def __getitem__(self, i):
        return self.pairs[i]


class SyntheticSeq2Seq(Task):
    kind = "seq2seq"
    monitor = "val/exact_match"
    monitor_mode = "max"
    OPS = {"reverse": lambda s: s[::-1], "sort": sorted, "copy": list}

    def __init__(self, name: str = "reverse", op: str = "reverse", symbols: int = 16, min_len: int = 4,
                 max_len: int = 12, train_size: PositiveInt = 20000, val_size: PositiveInt = 500,
                 test_size: PositiveInt = 1000, batch_size: PositiveInt = 64, seed: int = 1234, num_workers=0):
        super().__init__()
        if op not in self.OPS:
            raise ValueError(f"task.op must be one of {sorted(self.OPS)} (got '{op}')")
        if not 1 <= symbols <= len(ALPHABET):
            raise ValueError(f"task.symbols must be in 1..{len(ALPHABET)} (got {symbols})")
        if not 1 <= min_len <= max_len:
            raise ValueError(f"need 1 <= task.min_len <= task.max_len (got {min_len}, {max_len})")
        self.name, self.op, self.symbols = name, op, symbols
        self.min_len, self.max_len = min_len, max_len
        self.sizes = {"train": train_size, "val": val_size, "test": test_size}
        self.batch_size, self.seed, self.num_workers = batch_size, seed, loader_workers(num_workers)
        self.splits: dict[str, _Pairs] = {}

    @property
    def src_vocab_size(self) -> int:
        return SPECIALS + self.symbols

    def setup(self, stage=None):
        if self.splits:
            return
        gen = torch.Generator().manual_seed(self.seed)  # data is a function of task.seed only
        seen: set[tuple] = set()
        fn = self.OPS[self.op]
        for split in ("test", "val", "train"):  # held-out strings never appear in train
            pairs = []
            for s in _strings(self.sizes[split], self.min_len, self.max_len, self.symbols, gen):
                if split == "train" and tuple(s) in seen:
                    continue
                seen.add(tuple(s))
                pairs.append((s, list(fn(s))))
            self.splits[split] = _Pairs(pairs)

    def _loader(self, split, shuffle):
        return DataLoader(self.splits[split], batch_size=self.batch_size, shuffle=shuffle,
                          collate_fn=collate_seq2seq, **worker_options(self.num_workers))

    def ids_to_text(self, ids) -> str:
        words = []
        for i in ids:
            i = int(i)
            if i == EOS:
                break
            if i >= SPECIALS:
                words.append(ALPHABET[i - SPECIALS])
        return " ".join(words)

    def max_decode_len(self, src_len: int) -> int:
        return src_len + 2

    def positions_needed(self) -> tuple[int, str]:
        return self.max_len + 1, f"task.max_len={self.max_len}"  # the decoder's BOS + target


class SyntheticLM(Task):
    """Decoder-only LM on ``x SEP x``; only the second copy (and its EOS) is scored."""

    kind = "lm"
    monitor = "val/loss"
    monitor_mode = "min"

    def __init__(self, name: str = "copy_lm", symbols: int = 16, min_len: int = 4, max_len: int = 12,
                 train_size: PositiveInt = 20000, val_size: PositiveInt = 500, test_size: PositiveInt = 1000,
                 batch_size: PositiveInt = 64, seed: int = 1234, num_workers=0):
        super().__init__()
        self.name = name
        self.inner = SyntheticSeq2Seq(name, "copy", symbols, min_len, max_len, train_size, val_size, test_size,
                                      batch_size, seed, num_workers)
        self.sep_id = SPECIALS + symbols
        self.batch_size, self.num_workers = batch_size, loader_workers(num_workers)

    @property
    def src_vocab_size(self) -> int:
        return SPECIALS + self.inner.symbols + 1

    def setup(self, stage=None):
        self.inner.setup(stage)

    def positions_needed(self) -> tuple[int, str]:
        return 2 * self.inner.max_len + 2, f"task.max_len={self.inner.max_len}"  # BOS x SEP x

    def _collate(self, batch):
        ids, target = [], []
        for src, _ in batch:
            seq = [BOS] + src + [self.sep_id] + src + [EOS]
            ids.append(seq[:-1])
            # predict only the copy: positions before SEP are unpredictable noise
            target.append([PAD] * (len(src) + 1) + seq[len(src) + 2:])
        return {"ids": pad_batch(ids), "target": pad_batch(target)}

    def _loader(self, split, shuffle):
        return DataLoader(self.inner.splits[split], batch_size=self.batch_size, shuffle=shuffle,
                          collate_fn=self._collate, **worker_options(self.num_workers))

    def ids_to_text(self, ids) -> str:
        return self.inner.ids_to_text(ids)
