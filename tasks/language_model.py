"""Word-level language modelling (WikiText-2, WikiText-103) with context-window evaluation.

Each line becomes its words plus ``</s>`` (the end-of-line token counts, as in fairseq and
the published WikiText perplexities). Training cuts the token stream into blocks of
``tokens_per_sample``. Evaluation scores every token of the split exactly once: block k
predicts the next ``tokens_per_sample - context_window`` tokens with up to
``context_window`` earlier tokens as context (fairseq's ``--context-window``), so test
perplexity is over the full split with long context, not over isolated blocks.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from nas_cli.infra.options import PositiveInt

from .base import EOS, PAD, Task, loader_workers, pad_batch, worker_options
from .sources import (DataError, check_dir, check_hub_source, check_text_file, disk_split, existing, fingerprint, hub_split,
                      read_lines, resolve_source)
from .vocab import default_cache_dir, word_level

SPLITS = ("train", "valid", "test")


class _Blocks(Dataset):
    """Windows over a token stream: inputs stream[s:e-1], targets stream[s+1:e] with the
    targets before ``score_from`` replaced by PAD (context only, not scored)."""

    def __init__(self, stream: np.ndarray, windows: list[tuple[int, int, int]]):
        self.stream, self.windows = stream, windows

    def __len__(self):
        return len(self.windows)

    def __getitem__(self, i):
        start, end, score_from = self.windows[i]
        ids = self.stream[start: end - 1]
        target = self.stream[start + 1: end].copy()
        target[: max(0, score_from - start - 1)] = PAD
        return ids, target


def _collate(batch):
    ids, target = zip(*batch)
    return {"ids": pad_batch(ids), "target": pad_batch(target)}


def train_windows(n: int, block: int) -> list[tuple[int, int, int]]:
    """Consecutive blocks of ``block`` predictions: (start, start + block + 1, start + 1)."""
    return [(s, min(n, s + block + 1), s + 1) for s in range(0, n - 1, block)]


def eval_windows(n: int, block: int, context: int) -> list[tuple[int, int, int]]:
    """Every token 1..n-1 predicted exactly once; each window holds at most ``block``
    inputs, of which up to ``context`` are unscored left context."""
    if not 0 <= context < block:
        raise ValueError(f"task.context_window must be in [0, tokens_per_sample) (got {context}, {block})")
    stride = block - context
    out, first = [], 1  # first target index this window scores
    while first < n:
        last = min(n, first + (stride if first > 1 else block))  # first window: a full block, no context
        start = max(0, last - 1 - block)  # inputs start..last-2 (at most `block` of them)
        out.append((start, last, first))
        first = last
    return out


#: a local split's file names, in the order they are looked for: nas-run's ``<split>.txt``, then the names
#: WikiText is distributed under (``wiki.train.tokens``, ``wiki.valid.tokens``, ``wiki.test.tokens``; the
#: raw-character variant ``wiki.<split>.raw``); each also as ``.gz``
LOCAL_NAMES = ("{}.txt", "wiki.{}.tokens", "wiki.{}.raw")


def local_split_file(root: Path, name: str) -> Path | None:
    """The first of :data:`LOCAL_NAMES` for split file ``name`` that exists under ``root`` (or its .gz)."""
    for pattern in LOCAL_NAMES:
        path = existing(root / pattern.format(name))
        if path.is_file():
            return path
    return None


def split_file(root: Path, name: str, what: str) -> Path:
    """:func:`local_split_file`, or one line naming every file it looked for."""
    found = local_split_file(root, name)
    if found is None:
        looked = ", ".join(pattern.format(name) for pattern in LOCAL_NAMES)
        raise DataError(f"{what}: none of {looked} (nor .gz) in {root}; check task.path and the split names "
                        f"(task.splits)")
    return found


class LanguageModelTask(Task):
    kind = "lm"

    def __init__(self, name: str, source: str = "auto", path: str | None = None, hf_name: str | None = None,
                 hf_config: str | None = None, columns: list[str] | None = None, splits: dict | None = None, hub_splits: dict | None = None,
                 tokens_per_sample: PositiveInt = 256, context_window: int = 192, batch_size: PositiveInt = 16,
                 eval_batch_size: PositiveInt | None = None, max_vocab: int | None = None, cache_dir: str | None = None,
                 num_workers: int | str = 0, seed: int = 1, monitor: str = "val/loss", monitor_mode: str = "min"):
        super().__init__()
        self.name, self.source, self.path, self.hf_name, self.hf_config = name, source, path, hf_name, hf_config
        self.columns = list(columns) if columns else ["text"]
        # split names: files of the local layout, and splits of a hub / save_to_disk dataset
        self.split_names = {**{s: s for s in SPLITS}, **(dict(splits) if splits else {})}
        self.hub_split_names = {"train": "train", "valid": "validation", "test": "test",
                                **(dict(hub_splits) if hub_splits else {})}
        self.block, self.context = int(tokens_per_sample), int(context_window)
        if not 0 <= self.context < self.block:
            raise ValueError(f"task.context_window must be in [0, task.tokens_per_sample={self.block}) "
                             f"(got {self.context})")
        self.batch_size, self.eval_batch_size = int(batch_size), int(eval_batch_size or batch_size)
        self.max_vocab = max_vocab
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
        self.num_workers, self.seed = loader_workers(num_workers), int(seed)
        self.monitor, self.monitor_mode = monitor, monitor_mode
        self.streams: dict[str, np.ndarray] = {}
        self.tokenizer = None
        self.timings: dict[str, float] = {}

    def check_data(self) -> None:
        """Before the run directory is made: a local folder holds every split's file, as text."""
        kind = resolve_source(self.source, self.path, self.hf_name, self.name, "train.txt/valid.txt/test.txt")
        if kind == "local":
            root = check_dir(self.path)
            for split, name in self.split_names.items():
                check_text_file(split_file(root, name, f"{split} split"), f"{split} split")
        elif kind == "disk":
            check_dir(self.path)
        else:
            check_hub_source(self.name, self.hf_name, self.hf_config, str(self.cache_dir / "hf"),
                             "train.txt/valid.txt/test.txt")

    def _lines(self, split: str) -> list[str]:
        name = self.split_names[split]
        kind = resolve_source(self.source, self.path, self.hf_name, self.name, "train.txt/valid.txt/test.txt")
        if kind == "local":
            return read_lines(split_file(check_dir(self.path), name, f"{split} split"), f"{split} split")
        if kind == "disk":
            return disk_split(check_dir(self.path), self.hub_split_names[split], self.columns)[0]
        return hub_split(self.hf_name, self.hf_config, self.hub_split_names[split], self.columns,
                         str(self.cache_dir / "hf"))[0]

    def setup(self, stage=None):
        if self.streams:
            return
        t0 = time.perf_counter()
        lines = {split: self._lines(split) for split in SPLITS}
        self.timings["read_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        train_file = local_split_file(Path(str(self.path)).expanduser(), self.split_names["train"]) if self.path else None
        if train_file is not None and train_file.is_file():
            origin = fingerprint(train_file)
        else:
            origin = fingerprint(self.path, self.hf_name, self.hf_config, len(lines["train"]), lines["train"][:50])
        key = fingerprint(origin, "word-v2", self.max_vocab)  # v2: contiguous ids (vocab._contiguous_word_ids)
        self.tokenizer, self.tokenizer_cached = word_level(lines["train"], self.cache_dir / "tokenizers" /
                                                           f"word-{key}.json", self.max_vocab)
        self.timings["tokenizer_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        for split, text in lines.items():
            encoded = self.tokenizer.encode_batch(text)
            parts = [np.asarray(e.ids + [EOS], dtype=np.int32) for e in encoded]
            self.streams[split] = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
            if len(self.streams[split]) < 2:
                raise DataError(f"task '{self.name}': split '{self.split_names[split]}' has no text")
        self.timings["encode_s"] = time.perf_counter() - t0

    @property
    def src_vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def tokens_per_step(self, items: int | None = None) -> int:
        """Windows of ``tokens_per_sample`` inputs, ``batch_size`` (or ``items``) of them a step."""
        return min(self.batch_size, items or self.batch_size) * self.block

    def n_eval_tokens(self, split: str) -> int:
        """Tokens scored in an evaluation of ``split`` (every token after the first)."""
        return len(self.streams[split]) - 1

    def train_dataloader(self):
        ds = _Blocks(self.streams["train"], train_windows(len(self.streams["train"]), self.block))
        gen = torch.Generator().manual_seed(self.seed)
        return DataLoader(ds, batch_size=self.batch_size, shuffle=True, collate_fn=_collate, generator=gen,
                          pin_memory=torch.cuda.is_available(), **worker_options(self.num_workers, persistent=True))

    def _eval_loader(self, split):
        ds = _Blocks(self.streams[split], eval_windows(len(self.streams[split]), self.block, self.context))
        return DataLoader(ds, batch_size=self.eval_batch_size, shuffle=False, collate_fn=_collate,
                          **worker_options(self.num_workers))

    def trained_length(self) -> int:
        return self.block

    def check_length(self, length: int) -> None:
        if length < 2:
            raise ValueError(f"eval_lengths: {length} is too short for a window (at least 2 tokens)")

    def length_context(self, length: int) -> int:
        """The context of a ``length``-token evaluation window: each window scores the same share of
        new tokens as at the trained length (``tokens_per_sample - context_window`` of
        ``tokens_per_sample``), the rest of the window is context. WikiText-2 at 256/192: 64 new
        tokens with 192 of context at 256, 512 new with 1,536 of context at 2,048; every token of the
        split is scored once at every length."""
        new = max(1, round(length * (self.block - self.context) / self.block))
        return length - new

    def length_loader(self, split: str, length: int):
        split = {"val": "valid"}.get(split, split)
        ds = _Blocks(self.streams[split], eval_windows(len(self.streams[split]), length, self.length_context(length)))
        return DataLoader(ds, batch_size=max(1, self.eval_batch_size * self.block // length), shuffle=False,
                          collate_fn=_collate, **worker_options(self.num_workers))

    def val_dataloader(self):
        return self._eval_loader("valid")

    def test_dataloader(self):
        return self._eval_loader("test")

    def ids_to_text(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids if int(i) != PAD])
