"""What scaling out needs beyond Lightning: data order, sharding, gathered metrics, step RNG.

* :class:`EpochBatches` makes the batches of epoch ``e`` a function of ``(seed, e)`` alone and
  gives each process every ``world``-th of them (training: the same number on every process;
  evaluation: all of them, nothing padded or repeated). :class:`ShardedData` puts it into
  the task's loaders (the datamodule Lightning sees), and the training loader reports its position to Lightning's checkpoint
  (the ``state_dict`` protocol), so a resumed run skips exactly the batches it had trained on.
* :func:`gather_eval` merges the validation/test statistics of all processes, so a metric under
  DDP equals the single-process value (sums of loss and token counts; hypotheses and references
  for BLEU/ROUGE/exact match).
* :class:`StepSeed` reseeds torch's RNG before every training batch from
  ``(seed, epoch, batch, rank)`` (as fairseq does per update): dropout and noise do not depend on
  how the run got there, so a resumed run draws what an uninterrupted one would.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, Sampler


def mix_seed(*parts: int) -> int:
    """A 63-bit seed from integers (numpy's SeedSequence hashing: nearby inputs, unrelated seeds)."""
    return int(np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts]).generate_state(1, np.uint64)[0] >> 1)


class EpochBatches(Sampler[list[int]]):
    """This process's batches of an epoch, and where a resumed epoch starts.

    ``base`` is the task's own batch sampler. A shuffling ``BatchSampler(RandomSampler)`` is
    replaced by a permutation seeded with ``(seed, epoch)``; any other sampler (e.g. the
    token-budget ``TokenBatchSampler``) keeps its batches and gets ``set_epoch(epoch)``.
    ``even``: drop the last ``len % world`` batches so every process steps equally often (DDP
    training); otherwise (evaluation) process ``r`` gets batches ``r, r + world, ...``.
    ``max_items``: each batch cut into consecutive pieces of at most this many items (the
    ``train_batch_items`` and ``eval_batch_items`` options: a token budget's batch of short
    sentences can hold hundreds).

    Lightning tells a loader the epoch by calling ``set_epoch`` on ``loader.sampler`` and on
    ``loader.batch_sampler.sampler`` only, never on the batch sampler itself. ``self.sampler``
    is therefore a small forwarder (:class:`_EpochHook`): without it every epoch would replay
    epoch 0's order."""

    def __init__(self, base: Any, seed: int, rank: int = 0, world: int = 1, even: bool = False,
                 max_items: int | None = None):
        self.base, self.seed, self.rank, self.world, self.even = base, int(seed), int(rank), max(1, int(world)), even
        self.max_items = int(max_items) if max_items else None
        self.epoch = 0
        self.sampler = _EpochHook(self)
        self._resume: tuple[int, int] | None = None
        self._cache: tuple[int, list[list[int]]] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def _all(self, epoch: int) -> list[list[int]]:
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        base = self.base
        if isinstance(base, BatchSampler) and isinstance(base.sampler, RandomSampler) and not base.sampler.replacement:
            n = len(base.sampler.data_source)
            order = torch.randperm(n, generator=torch.Generator().manual_seed(mix_seed(self.seed, epoch))).tolist()
            batches = [order[i: i + base.batch_size] for i in range(0, n, base.batch_size)]
            if base.drop_last and batches and len(batches[-1]) < base.batch_size:
                batches.pop()
        else:
            if hasattr(base, "set_epoch"):
                base.set_epoch(epoch)
            batches = [list(b) for b in base]
        if self.max_items:
            size = self.max_items
            batches = [b[i: i + size] for b in batches for i in range(0, len(b), size)]
        self._cache = (epoch, batches)
        return batches

    def batches(self, epoch: int) -> list[list[int]]:
        batches = self._all(epoch)
        if self.world == 1:
            return batches
        if self.even:
            batches = batches[: len(batches) // self.world * self.world]
        return batches[self.rank:: self.world]

    def resume(self, epoch: int, done: int) -> None:
        """Start at batch ``done`` of ``epoch`` (the next epoch if that one was finished)."""
        if done >= len(self.batches(epoch)):
            epoch, done = epoch + 1, 0
        self.epoch, self._resume = epoch, (epoch, done)

    def __len__(self) -> int:
        return len(self.batches(self.epoch))

    def __iter__(self) -> Iterator[list[int]]:
        # a generator: the epoch is read at the first batch, after Lightning's set_epoch
        epoch = self.epoch
        skip = self._resume[1] if self._resume is not None and self._resume[0] == epoch else 0
        self._resume = None
        yield from self.batches(epoch)[skip:]


class _EpochHook:
    """What Lightning finds at ``loader.batch_sampler.sampler``: passes ``set_epoch`` on."""

    def __init__(self, owner: EpochBatches):
        self.owner = owner

    def set_epoch(self, epoch: int) -> None:
        self.owner.set_epoch(epoch)


class ResumableLoader(DataLoader):
    """The training loader: Lightning stores ``state_dict()`` in every checkpoint and hands it
    back with ``load_state_dict`` on resume. ``position`` returns (epoch, batches trained)."""

    position: Callable[[], tuple[int, int]] | None = None

    def state_dict(self) -> dict[str, int]:
        epoch, done = self.position() if self.position else (0, 0)
        return {"epoch": int(epoch), "batches": int(done)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.batch_sampler.resume(int(state.get("epoch", 0)), int(state.get("batches", 0)))


class _WithIndex(Dataset):
    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        return i, self.dataset[i]


class _IndexCollate:
    """Collate as the task does and add the examples' dataset indices as ``batch['index']``."""

    def __init__(self, collate):
        self.collate = collate

    def __call__(self, samples):
        index, items = zip(*samples)
        batch = self.collate(list(items))
        if isinstance(batch, dict) and "index" not in batch:
            batch["index"] = torch.as_tensor(index)
        return batch


def _rebuild(loader: DataLoader, batch_sampler: EpochBatches, cls=DataLoader, index: bool = False) -> DataLoader:
    kw: dict[str, Any] = dict(num_workers=loader.num_workers, pin_memory=loader.pin_memory, timeout=loader.timeout,
                              worker_init_fn=loader.worker_init_fn, persistent_workers=loader.persistent_workers,
                              multiprocessing_context=loader.multiprocessing_context)
    if loader.num_workers > 0:
        kw["prefetch_factor"] = loader.prefetch_factor
    dataset, collate = loader.dataset, loader.collate_fn
    if index:
        dataset, collate = _WithIndex(dataset), _IndexCollate(collate)
    return cls(dataset, batch_sampler=batch_sampler, collate_fn=collate, **kw)


def _base_sampler(loader) -> Any:
    if not isinstance(loader, DataLoader) or loader.batch_sampler is None:
        return None  # iterable-style data: left as the task made it
    return loader.batch_sampler


class ShardedData(pl.LightningDataModule):
    """The task's loaders as this process reads them, each rebuilt with :class:`EpochBatches`
    (the batch order a function of the seed and the epoch, this process's share of it; the
    training loader resumable). Lightning gets this as the datamodule; the task itself is left as
    it is. Ranks are read when Lightning asks for a loader (``self.trainer`` is attached then)."""

    def __init__(self, task: pl.LightningDataModule, seed: int, train_batch_items: int | None = None,
                 eval_batch_items: int | None = None):
        super().__init__()
        self.task, self.seed = task, int(seed)
        self.train_batch_items, self.eval_batch_items = train_batch_items, eval_batch_items

    def prepare_data(self) -> None:
        self.task.prepare_data()

    def setup(self, stage: str | None = None) -> None:
        self.task.setup(stage)

    def _ranks(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def train_dataloader(self):
        loader = self.task.train_dataloader()
        base = _base_sampler(loader)
        if base is None:
            return loader
        rank, world = self._ranks()
        out = _rebuild(loader, EpochBatches(base, self.seed, rank, world, even=True, max_items=self.train_batch_items),
                       cls=ResumableLoader)
        trainer = self.trainer
        if trainer is not None:
            out.position = lambda: (trainer.fit_loop.epoch_progress.current.processed,
                                    trainer.fit_loop.epoch_loop.batch_progress.current.processed)
        return out

    def _eval_loader(self, loader):
        base = _base_sampler(loader)
        if base is None:
            return loader
        rank, world = self._ranks()
        return _rebuild(loader, EpochBatches(base, self.seed, rank, world, max_items=self.eval_batch_items), index=True)

    def val_dataloader(self):
        return self._eval_loader(self.task.val_dataloader())

    def test_dataloader(self):
        return self._eval_loader(self.task.test_dataloader())

    def unsharded_val_dataloader(self):
        """The whole validation split in one process's order (the diagnostics under DDP)."""
        loader = self.task.val_dataloader()
        base = _base_sampler(loader)
        if base is None or not self.eval_batch_items:
            return loader
        return _rebuild(loader, EpochBatches(base, self.seed, max_items=self.eval_batch_items))


def shard_and_resume(task: pl.LightningDataModule, seed: int, train_batch_items: int | None = None,
                     eval_batch_items: int | None = None) -> ShardedData:
    """The datamodule a run hands Lightning for ``task``: :class:`ShardedData`."""
    return ShardedData(task, seed, train_batch_items, eval_batch_items)


def gather_eval(sums: dict[str, torch.Tensor | None], text: tuple[list, ...]):
    """All processes' evaluation sums (added) and per-item lists (decoded text, item indices,
    per-item NLL and token counts; each concatenated); unchanged on one process.

    Every process must call it (a collective), also one that saw no batch (its sums are None)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return sums, text
    local = ({k: None if v is None else v.detach().double().cpu() for k, v in sums.items()},
             tuple(list(t) for t in text))
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, local)
    merged = {}
    for key in sums:
        values = [p[0][key] for p in parts if p[0][key] is not None]
        merged[key] = sum(values).to(torch.float64) if values else None  # scalars, or per-class counts
    return merged, tuple([x for p in parts for x in p[1][i]] for i in range(len(text)))


class StepSeed(pl.Callback):
    """Reseed torch (CPU and CUDA) before each training batch from (seed, epoch, batch, rank)."""

    def __init__(self, seed: int):
        self.seed = int(seed)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        torch.manual_seed(mix_seed(self.seed, trainer.current_epoch, batch_idx, trainer.global_rank))
