"""What every task provides to the trainer.

A task is a LightningDataModule plus the little the model and metrics need to know:
its kind (``seq2seq`` or ``lm``), vocabulary sizes and special ids, how to turn ids
back into text, and how to score hypotheses. Adding a task = ``tasks/<name>.py`` with a
subclass + ``conf/task/<name>.yaml`` whose ``_target_`` names it.

Batches are dicts of LongTensors:
  seq2seq: ``src`` (B, S), ``tgt_in`` (B, T) = BOS + y, ``tgt_out`` (B, T) = y + EOS
  lm:      ``ids`` (B, T), ``target`` (B, T) (next tokens; pad_id where not scored)
"""
from __future__ import annotations

import os
import sys

import pytorch_lightning as pl
import sacrebleu
import torch

PAD, BOS, EOS = 0, 1, 2

#: share of empty hypotheses above which an evaluation says so (a model that learned to stop at once)
EMPTY_WARNING = 0.2


def loader_workers(value) -> int:
    """``task.num_workers``: a number, or ``auto`` = what this machine can spare: none on 1-2
    cores (the training threads need them; PyTorch warns when workers exceed the cores), else
    up to 4, one core left for the training process."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if str(value) == "auto":
        return 0 if cores <= 2 else min(4, cores - 1)
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"task.num_workers must be auto or a number >= 0 (got '{value}')") from None
    if n < 0:
        raise ValueError(f"task.num_workers must be auto or a number >= 0 (got {n})")
    return n


class WorkerInit:
    """A DataLoader worker's ``worker_init_fn``: the worker ignores the signals that stop a run
    (SIGTERM, SIGUSR1, SIGUSR2, SIGINT, SIGHUP), which the training process answers by saving
    ``last.ckpt`` and exiting with a resume hint. A cluster's time limit or preemption (SLURM
    signals every process of a job step), ``timeout``, ``kill -TERM -<group>`` and Ctrl-C in a
    terminal signal the workers too; a worker killed by the signal made PyTorch raise
    "DataLoader worker ... is killed by signal" in the training process before it could save
    (and a worker ends its loop on Ctrl-C). The training process ends its workers itself, and a
    worker whose training process is gone exits on its own (PyTorch's watchdog). Then, as
    Lightning's own worker_init_fn would (it adds one only where there is none), each worker is
    seeded after ``seed_everything(workers=True)``."""

    def __call__(self, worker_id: int) -> None:
        import signal

        for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT, signal.SIGHUP):  # ..STOP_SIGNALS
            signal.signal(sig, signal.SIG_IGN)
        if int(os.environ.get("PL_SEED_WORKERS", 0)):
            from lightning_fabric.utilities.seed import pl_worker_init_function

            pl_worker_init_function(worker_id)


def worker_options(num_workers: int, persistent: bool = False) -> dict:
    """DataLoader keywords for ``num_workers`` worker processes (none: ``{"num_workers": 0}``).

    * The workers ignore the signals that stop a run (:class:`WorkerInit`).
    * Inside a joblib sweep job (``hydra/launcher=joblib``) the process's default start method is
      joblib's own (loky), which cannot start a DataLoader worker (every job failed with
      "'Process' object has no attribute 'env'" on a 16-core machine, where
      ``task.num_workers=auto`` gives workers): the workers start with the platform's standard
      method instead (fork on Linux, as PyTorch does outside joblib; spawn elsewhere)."""
    if num_workers <= 0:
        return {"num_workers": 0}
    import multiprocessing

    opts = {"num_workers": num_workers, "persistent_workers": persistent, "worker_init_fn": WorkerInit()}
    if multiprocessing.get_start_method(allow_none=True) not in (None, "fork", "spawn", "forkserver"):
        opts["multiprocessing_context"] = multiprocessing.get_context(
            "fork" if sys.platform.startswith("linux") else "spawn")
    return opts


def pad_batch(seqs, front: int | None = None, back: int | None = None, pad_id: int = PAD) -> torch.Tensor:
    """Sequences of token ids (lists, tuples or arrays) -> one (B, longest) LongTensor, the rest
    ``pad_id``; ``front`` / ``back``: one id put before / after every sequence (BOS / EOS)."""
    extra = (front is not None) + (back is not None)
    out = torch.full((len(seqs), max(len(s) for s in seqs) + extra), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        row = ([front] if front is not None else []) + [int(t) for t in s] + ([back] if back is not None else [])
        out[i, : len(row)] = torch.as_tensor(row, dtype=torch.long)
    return out


def collate_seq2seq(batch) -> dict[str, torch.Tensor]:
    """[(source ids, target ids), ...] -> a seq2seq batch (see the module docstring):
    ``src``, ``tgt_in`` = BOS + target, ``tgt_out`` = target + EOS, all padded with PAD."""
    src, tgt = zip(*batch)
    return {"src": pad_batch(src), "tgt_in": pad_batch(tgt, front=BOS), "tgt_out": pad_batch(tgt, back=EOS)}


def note(message: str) -> None:
    print(f"nas-run: note: {message}", file=sys.stderr)


def empty_share(hyps: list[str]) -> float:
    """Fraction of hypotheses that are empty (after stripping whitespace)."""
    return sum(not h.strip() for h in hyps) / len(hyps) if hyps else 0.0


class Task(pl.LightningDataModule):
    kind: str = "seq2seq"
    name: str = "task"
    pad_id, bos_id, eos_id = PAD, BOS, EOS
    #: validation metric that chooses the best checkpoint, and whether higher is better
    monitor: str = "val/loss"
    monitor_mode: str = "min"

    @property
    def src_vocab_size(self) -> int:
        raise NotImplementedError

    @property
    def tgt_vocab_size(self) -> int:
        return self.src_vocab_size

    #: the task's own names of its training, validation and test splits
    loader_splits: tuple[str, str, str] = ("train", "val", "test")

    #: the task's own test metrics, keys of what :meth:`score` returns beyond the built-in ones
    #: (tasks/scores.py): {key: (column title, higher is better: True/False/None[, format
    #: "p2"/"p3"/"pct"])}; recorded in summary.json, read by the result table and nas-report
    #: (its columns, ``--metrics`` and the direction of the verdict)
    metrics: dict = {}

    # ---- optional members: what the runner reads when a task has them (defaults: it has not) ----
    #: the test metric that is the greedy accuracy at the scored positions (``query_acc``): logged per split
    accuracy_name: str | None = None
    #: the test metric that is the class-balanced accuracy there (MAD's score, ``mad_acc``): the mean over the
    #: classes of each class's accuracy (nas_cli.model.scoring.class_balanced_accuracy)
    macro_accuracy_name: str | None = None
    #: a language model whose evaluation also reports the mean loss per position bucket of its windows
    #: (``<split>/pos_loss_<lo>_<hi>``, powers of two) and, where its batches carry each target's byte count
    #: (``target_bytes``), bits per byte (``<split>/bpb``)
    loss_by_position: bool = False
    #: the names of the groups of rows an evaluation batch tells apart (its ``group``: the index): the accuracy
    #: of each is ``<split>/<accuracy_name>_<name>`` (a retrieval task's needle depths: ``depth50``)
    group_names: list | None = None
    #: how a language model's outputs are read: None (each position's own state) or ``"last_state"`` (every
    #: position decoded from the last position's final state: MAD's compression, nas_cli/model/readout.py)
    readout: str | None = None
    #: beam search for test decoding, {"beam", "lenpen", "max_len_a", "max_len_b"}; None: greedy
    decoding: dict | None = None
    #: beam width for validation decoding (with ``decoding``)
    valid_beam: int = 1
    #: encoded splits {"valid"/"test": (sources, targets)}: the runner refuses, before training,
    #: evaluation sources longer than the model's positions; None: not known in advance
    ids: dict | None = None
    #: sacreBLEU's signatures of the scores ``score()`` computed (set by it), for summary.json
    bleu_signature: str | None = None
    bleu_tok_signature: str | None = None
    #: seconds spent reading, training the tokenizer and encoding (summary.json's data_timings)
    timings: dict | None = None

    def tokens_per_step(self, items: int | None = None) -> int | None:
        """The input tokens of one training step (a batch cut to at most ``items`` items,
        ``train_batch_items``): what a token budget (``train_tokens``) counts in; None where batches vary."""
        return None

    def positions_needed(self) -> tuple[int, str] | None:
        """The longest sequence a training batch can hold, known from the options alone, and the
        option that sets it (``(301, "task.max_len=300")``): nas-run refuses a model with fewer
        positions before anything is made. None: known only once the data are read."""
        return None

    #: the length of the sequences it trains on, where the test split can also be evaluated at other
    #: lengths (``eval_lengths``: :meth:`length_loader`); None: it cannot
    def trained_length(self) -> int | None:
        return None

    def check_length(self, length: int) -> None:
        """Refuse (ValueError, one line naming the option) a length :meth:`length_loader` cannot make."""

    def length_loader(self, split: str, length: int):
        """The loader of ``split`` at ``length`` tokens a sequence (after :meth:`setup`): what
        ``eval_lengths`` evaluates. Only tasks whose :meth:`trained_length` is not None have one."""
        raise NotImplementedError

    def check_data(self) -> None:
        """Called before the run directory is made (nas-run's option checks): refuse, with a
        DataError naming the path, data that cannot be read (a missing or empty file, a binary
        one, a data path that is a file). Default: nothing to check (generated data)."""

    def reference(self, split: str, index: int) -> str | None:
        """The raw reference text of item ``index`` of ``split`` ("valid"/"test"), scored instead of
        the decoded target ids (a subword round trip is not the reference); None: use the ids."""
        return None

    def _loader(self, split: str, shuffle: bool):
        raise NotImplementedError

    def train_dataloader(self):
        return self._loader(self.loader_splits[0], True)

    def val_dataloader(self):
        return self._loader(self.loader_splits[1], False)

    def test_dataloader(self):
        return self._loader(self.loader_splits[2], False)

    def ids_to_text(self, ids) -> str:
        """Token ids (up to EOS) -> detokenized text for BLEU."""
        raise NotImplementedError

    def max_decode_len(self, src_len: int) -> int:
        return src_len + 10

    def scored_text(self, hyps: list[str], refs: list[str]) -> tuple[list[str], list[str]]:
        """The hypotheses and references exactly as :meth:`score` hands them to sacreBLEU (here:
        as they are). ``test_items.json`` keeps this text, so that nas-report's per-item tests
        are about the very BLEU the run reports. A task that rewrites text before scoring
        (detokenization) overrides it."""
        return hyps, refs

    def score(self, hyps: list[str], refs: list[str]) -> dict[str, float]:
        """Corpus-level quality of decoded outputs. sacreBLEU on the text as given, and
        exact-match accuracy (the fraction of outputs identical to the reference)."""
        if not hyps:
            return {}
        bleu = sacrebleu.corpus_bleu(hyps, [refs])
        exact = sum(h == r for h, r in zip(hyps, refs)) / len(hyps)
        return {"bleu": bleu.score, "exact_match": exact, "empty": empty_share(hyps)}
