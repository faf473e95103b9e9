"""Token-budget batching with length bucketing (as fairseq's ``--max-tokens``).

Examples are sorted by length (ties broken randomly per epoch) and cut into batches
whose padded size ``max_len_in_batch * n`` stays within ``max_tokens``; the batch order
is shuffled each epoch. Similar lengths share a batch, so little compute goes to padding.
"""
from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np
from torch.utils.data import Sampler


def token_batches(lengths: Sequence[int], max_tokens: int, order: np.ndarray) -> list[list[int]]:
    batches, cur, cur_max = [], [], 0
    for i in order:
        n = int(lengths[i])
        new_max = max(cur_max, n)
        if cur and new_max * (len(cur) + 1) > max_tokens:
            batches.append(cur)
            cur, new_max = [], n
        cur.append(int(i))
        cur_max = new_max
    if cur:
        batches.append(cur)
    return batches


class TokenBatchSampler(Sampler[list[int]]):
    def __init__(self, lengths: Sequence[int], max_tokens: int, shuffle: bool, seed: int = 0):
        if max_tokens < max(lengths, default=0):
            raise ValueError(f"task.max_tokens={max_tokens} is smaller than the longest example "
                             f"({max(lengths)} tokens); raise task.max_tokens or lower task.max_len")
        self.lengths = np.asarray(lengths)
        self.max_tokens, self.shuffle, self.seed = max_tokens, shuffle, seed
        self.epoch = 0
        self._batches = None if shuffle else self._make(0)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _make(self, epoch: int) -> list[list[int]]:
        rng = np.random.default_rng(self.seed + epoch)
        tiebreak = rng.random(len(self.lengths)) if self.shuffle else np.arange(len(self.lengths))
        order = np.lexsort((tiebreak, self.lengths))
        batches = token_batches(self.lengths, self.max_tokens, order)
        if self.shuffle:
            rng.shuffle(batches)
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        batches = self._batches if self._batches is not None else self._make(self.epoch)
        if self.shuffle:
            self.epoch += 1  # a fresh order next epoch even if nobody calls set_epoch
        return iter(batches)

    def __len__(self) -> int:
        return len(self._batches if self._batches is not None else self._make(self.epoch))
