"""Subword language modelling on local text (``task=subword_lm``): the pretraining setting of today's
attention papers at a size this machine runs, with bits per byte and the loss by position.

* **Documents** come from a folder or a list of files, plain text, JSONL or Parquet, each optionally
  compressed (tasks/documents.py). ``task.valid_docs`` and ``task.test_docs`` documents (a count, or a
  share when below 1) are held out, drawn with ``task.split_seed``; the rest train.
* **The tokenizer** is a ``tokenizer.json`` (``task.tokenizer``: any Hugging Face fast tokenizer saved
  locally; its ids are shifted past nas-run's PAD, BOS and EOS), or a byte-level BPE of
  ``task.vocab_size`` trained once with HF ``tokenizers`` on the training documents (the specials at
  nas-run's ids) and kept in the cache.
* **The token cache**: every split tokenized once (in parallel: ``encode_batch``), written as memory-mapped
  token files with the byte count of each token, under ``task.cache_dir`` (``$NAS_RUN_CACHE``, else
  ``~/.cache/nas-run``) in a folder named by a digest of the files, the tokenizer and the split options;
  every later run with the same data reads it back.
* **Windows**: each document's tokens end with the end-of-document token (EOS); ``task.pack=true`` joins
  the documents into one stream cut into windows of ``task.tokens_per_sample`` (a window may span
  documents, as nanoGPT and Megatron pack them), ``task.pack=false`` cuts each document on its own (no
  window crosses a document, so no attention does; a document's last window is shorter, padded).
  ``task.document_mask=true`` keeps the packed windows but runs each document in them as its own sequence
  (positions from 0, no attention or recurrent state across documents: nas_cli/model/documents.py).
  Evaluation scores every token of a split once (``task.context_window`` tokens of context before each
  window's scored ones; 0 by default, so that every position of a window is scored and the loss by position
  covers the whole window).
* **Metrics**: loss and perplexity per token, **bits per byte** (``bpb``: the summed loss in bits over the
  UTF-8 bytes of the text the scored tokens encode, the end-of-document token counted as one byte, the
  newline that separates documents; comparable across tokenizers), and the mean loss per position bucket
  of the window (``pos_loss_<lo>_<hi>``: positions lo .. hi - 1, powers of two up to the window's length).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from nas_cli.infra.options import PositiveInt

from .base import EOS, PAD, pad_batch, worker_options
from .documents import files_digest, read_corpus
from .language_model import LanguageModelTask, eval_windows, train_windows
from .sources import DataError
from .vocab import default_cache_dir

SPLITS = ("train", "valid", "test")
SPECIALS = ["<pad>", "<s>", "</s>"]  # nas-run's PAD, BOS, EOS
#: bump when what the cache holds changes
CACHE_VERSION = "subword-v1"
#: documents encoded in one batch (HF tokenizers encodes a batch in parallel; an encoding keeps its offsets
#: and masks, so a whole corpus in one batch would hold gigabytes)
ENCODE_CHUNK = 2048


def position_buckets(length: int) -> list[tuple[int, int]]:
    """The loss-by-position buckets of a window of ``length`` positions: [0, 1), [1, 2), [2, 4), ... up to
    the power of two at or above ``length`` (nas_cli.model.scoring.position_bucket numbers them)."""
    out, lo = [(0, 1)], 1
    while lo < length:
        out.append((lo, 2 * lo))
        lo *= 2
    return out


def held_out(n: int, valid: float, test: float, seed: int) -> dict[str, np.ndarray]:
    """Document indices of each split: ``test`` and ``valid`` documents (counts, or shares below 1) drawn
    with ``seed``, the rest train (each split in corpus order)."""
    count = {s: int(round(v * n)) if v < 1 else int(v) for s, v in (("valid", valid), ("test", test))}
    if count["valid"] < 1 or count["test"] < 1 or count["valid"] + count["test"] >= n:
        raise DataError(f"the corpus has {n} documents: task.valid_docs and task.test_docs must each hold at least "
                        f"one and leave some to train (got {count['valid']} and {count['test']})")
    order = np.random.default_rng(seed).permutation(n)
    test_idx, valid_idx = order[: count["test"]], order[count["test"]: count["test"] + count["valid"]]
    train = np.setdiff1d(np.arange(n), np.concatenate([test_idx, valid_idx]))
    return {"train": train, "valid": np.sort(valid_idx), "test": np.sort(test_idx)}


def train_bpe(docs, vocab_size: int):
    """A byte-level BPE (GPT-2's pre-tokenization) of ``vocab_size`` trained on ``docs``, nas-run's specials
    at ids 0-2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer)
    return tok


def token_bytes(doc: str, offsets) -> np.ndarray:
    """The UTF-8 bytes each token of ``doc`` stands for: the text from its start (a character offset) to the
    next token's (the last to the end), so that a document's tokens add up to its bytes exactly (a character
    split over several byte-level tokens counts once, at the last of them)."""
    if not len(offsets):
        return np.zeros(0, dtype=np.uint32)
    starts = np.maximum.accumulate(np.asarray(offsets, dtype=np.int64)[:, 0])
    starts[0] = 0
    code = np.frombuffer(doc.encode("utf-32-le"), dtype=np.uint32)
    size = 1 + (code >= 0x80).astype(np.int64) + (code >= 0x800) + (code >= 0x10000)
    at = np.concatenate([[0], np.cumsum(size)])  # the byte offset of each character
    ends = np.append(starts[1:], len(code))
    return (at[ends] - at[starts]).astype(np.uint32)


def byte_lengths(tokenizer) -> np.ndarray | None:
    """The bytes each token id stands for, where the tokenizer is byte-level (GPT-2's pre-tokenization:
    every character of a token is one byte), specials 0; None for another tokenizer (its offsets then
    count the bytes, :func:`token_bytes`)."""
    from tokenizers import pre_tokenizers

    if not isinstance(tokenizer.pre_tokenizer, pre_tokenizers.ByteLevel):
        return None
    table = np.zeros(tokenizer.get_vocab_size(with_added_tokens=True), dtype=np.uint32)
    special = {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}
    for token, i in tokenizer.get_vocab(with_added_tokens=True).items():
        table[i] = 0 if token in special else len(token)
    return table


class _Windows(Dataset):
    """Windows over a split's token stream and its byte counts: inputs, targets (PAD before the scored
    part) and the byte count of each target."""

    def __init__(self, stream: np.ndarray, nbytes: np.ndarray, windows):
        self.stream, self.nbytes, self.windows = stream, nbytes, windows

    def __len__(self):
        return len(self.windows)

    def __getitem__(self, i):
        start, end, score_from = self.windows[i]
        ids = np.asarray(self.stream[start: end - 1], dtype=np.int64)
        target = np.asarray(self.stream[start + 1: end], dtype=np.int64).copy()
        target[: max(0, score_from - start - 1)] = PAD
        return ids, target, np.asarray(self.nbytes[start + 1: end], dtype=np.int64)


def _collate(batch):
    ids, target, nbytes = zip(*batch)
    return {"ids": pad_batch(ids), "target": pad_batch(target), "target_bytes": pad_batch(nbytes)}


def doc_windows(bounds: np.ndarray, block: int, make) -> list[tuple[int, int, int]]:
    """``make`` (train_windows / a context-window form) applied to each document's range on its own."""
    out = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        out += [(a + s, a + e, a + f) for s, e, f in make(int(b - a))]
    return out


class SubwordLMTask(LanguageModelTask):
    metrics = {"bpb": ("bits/byte", False, "p3")}
    loss_by_position = True

    def __init__(self, name: str = "subword_lm", path=None, text_field: str = "text", text_docs: str = "file",
                 tokenizer: str | None = None, vocab_size: PositiveInt = 8192, valid_docs: float = 0.01,
                 test_docs: float = 0.01, split_seed: int = 1234, pack: bool = True, document_mask: bool = False,
                 tokens_per_sample: PositiveInt = 256, context_window: int = 0, batch_size: PositiveInt = 16,
                 eval_batch_size: PositiveInt | None = None, cache_dir: str | None = None, num_workers="auto",
                 seed: int = 1):
        if text_docs not in ("file", "line"):
            raise ValueError(f"task.text_docs must be file or line (got '{text_docs}')")
        if tokenizer is None and vocab_size < 256 + len(SPECIALS):
            raise ValueError(f"task.vocab_size={vocab_size} is below the byte alphabet a byte-level BPE starts from "
                             f"(256 + {len(SPECIALS)} specials): give at least {256 + len(SPECIALS)}")
        super().__init__(name, source="local", path=path, tokens_per_sample=tokens_per_sample,
                         context_window=context_window, batch_size=batch_size, eval_batch_size=eval_batch_size,
                         cache_dir=cache_dir, num_workers=num_workers, seed=seed)
        self.text_field, self.text_docs, self.tokenizer_file = text_field, text_docs, tokenizer
        self.vocab_size, self.valid_docs, self.test_docs = int(vocab_size), float(valid_docs), float(test_docs)
        self.split_seed, self.pack = int(split_seed), bool(pack)
        #: document masking (nas_cli/model/documents.py): packed windows run one document per sequence
        self.document_end = EOS if document_mask else None
        self.bytes: dict[str, np.ndarray] = {}
        self.bounds: dict[str, np.ndarray] = {}
        self.offset = 0  # added to a loaded tokenizer's ids (past PAD, BOS, EOS)
        self.cache_hit = False

    # ---- before the run: the files and the tokenizer parse ----
    def check_data(self) -> None:
        from .documents import corpus_files

        corpus_files(self.path)
        if self.tokenizer_file is not None:
            self._load_tokenizer()

    def _load_tokenizer(self):
        from tokenizers import Tokenizer

        path = Path(str(self.tokenizer_file)).expanduser()
        if not path.is_file():
            raise DataError(f"task.tokenizer={self.tokenizer_file}: no such file; give a tokenizer.json saved by a "
                            "Hugging Face fast tokenizer, or leave it out to train a BPE (task.vocab_size)")
        try:
            return Tokenizer.from_file(str(path))
        except Exception as err:  # noqa: BLE001 - the library's parse error, in one line naming the file
            raise DataError(f"task.tokenizer={self.tokenizer_file}: not a tokenizer.json that HF tokenizers can "
                            f"read ({str(err).splitlines()[0][:120]})") from None

    # ---- the data ----
    def setup(self, stage=None):
        if self.streams:
            return
        from tokenizers import Tokenizer

        from .documents import corpus_files

        t0 = time.perf_counter()
        files = corpus_files(self.path)
        if self.tokenizer_file is not None:
            self.tokenizer, self.offset = self._load_tokenizer(), len(SPECIALS)
            tok_key = Path(str(self.tokenizer_file)).expanduser().read_text()
        else:
            tok_key = f"bpe-{self.vocab_size}"
        key = files_digest(files) + "-" + _digest(CACHE_VERSION, tok_key, self.valid_docs, self.test_docs,
                                                  self.split_seed, self.text_field, self.text_docs)
        folder = self.cache_dir / "subword" / key
        self.cache_hit = (folder / "meta.json").is_file()
        self.timings["read_s"] = time.perf_counter() - t0
        if self.cache_hit:  # the documents need not be read again
            if self.tokenizer_file is None:
                self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        else:
            t0 = time.perf_counter()
            docs, _ = read_corpus(self.path, self.text_field, self.text_docs)
            splits = held_out(len(docs), self.valid_docs, self.test_docs, self.split_seed)
            self.timings["read_s"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            if self.tokenizer_file is None:
                self.tokenizer = train_bpe([docs[i] for i in splits["train"]], self.vocab_size)
            self.timings["tokenizer_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            self._write_cache(folder, docs, splits)
            self.timings["encode_s"] = time.perf_counter() - t0
        for split in SPLITS:
            self.streams[split] = np.load(folder / f"{split}.tokens.npy", mmap_mode="r")
            self.bytes[split] = np.load(folder / f"{split}.bytes.npy", mmap_mode="r")
            self.bounds[split] = np.load(folder / f"{split}.bounds.npy")
        self.cache_folder = folder

    def _write_cache(self, folder: Path, docs: list[str], splits: dict[str, np.ndarray]) -> None:
        """Tokenize every split (HF tokenizers' parallel batch encoding) and write it, atomically (a folder
        renamed into place once complete)."""
        import os
        import shutil
        import tempfile

        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=folder.parent))
        try:
            counts = {}
            table = byte_lengths(self.tokenizer)
            for split in SPLITS:
                chosen = [docs[i] for i in splits[split]]
                ids, nbytes = [], []
                for start in range(0, len(chosen), ENCODE_CHUNK):  # chunks: the encodings' offsets stay small
                    part = chosen[start:start + ENCODE_CHUNK]
                    for d, e in zip(part, self.tokenizer.encode_batch(part)):
                        x = np.asarray(e.ids, dtype=np.int32)
                        ids.append(np.append(x + self.offset, EOS))
                        per_token = table[x] if table is not None else token_bytes(d, e.offsets)
                        nbytes.append(np.append(per_token, 1))  # the end-of-document token: 1
                lengths = np.array([len(x) for x in ids], dtype=np.int64)
                stream = np.concatenate(ids).astype(np.int32)
                byte = np.concatenate(nbytes).astype(np.uint32)
                np.save(tmp / f"{split}.tokens.npy", stream)
                np.save(tmp / f"{split}.bytes.npy", byte)
                np.save(tmp / f"{split}.bounds.npy", np.concatenate([[0], np.cumsum(lengths)]))
                counts[split] = {"documents": len(chosen), "tokens": int(len(stream)), "bytes": int(byte.sum())}
            if self.tokenizer_file is None:
                self.tokenizer.save(str(tmp / "tokenizer.json"))
            (tmp / "meta.json").write_text(json.dumps({"version": CACHE_VERSION, "splits": counts}, indent=1))
            try:
                os.replace(tmp, folder)
            except OSError:  # another job wrote the same folder first: theirs is the same
                shutil.rmtree(tmp, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    @property
    def src_vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size() + self.offset

    def _windows(self, split: str, block: int, context: int | None):
        n = len(self.streams[split])
        if context is None:  # training: consecutive blocks
            make = lambda m: train_windows(m, block)  # noqa: E731
        else:
            make = lambda m: eval_windows(m, block, context)  # noqa: E731
        if self.pack:
            return make(n)
        return doc_windows(self.bounds[split], block, make)

    def train_dataloader(self):
        ds = _Windows(self.streams["train"], self.bytes["train"], self._windows("train", self.block, None))
        gen = torch.Generator().manual_seed(self.seed)
        return DataLoader(ds, batch_size=self.batch_size, shuffle=True, collate_fn=_collate, generator=gen,
                          pin_memory=torch.cuda.is_available(), **worker_options(self.num_workers, persistent=True))

    def _eval_loader(self, split):
        ds = _Windows(self.streams[split], self.bytes[split], self._windows(split, self.block, self.context))
        return DataLoader(ds, batch_size=self.eval_batch_size, shuffle=False, collate_fn=_collate,
                          **worker_options(self.num_workers))

    def length_loader(self, split: str, length: int):
        split = {"val": "valid"}.get(split, split)
        ds = _Windows(self.streams[split], self.bytes[split],
                      self._windows(split, length, self.length_context(length)))
        return DataLoader(ds, batch_size=max(1, self.eval_batch_size * self.block // length), shuffle=False,
                          collate_fn=_collate, **worker_options(self.num_workers))

    def length_context(self, length: int) -> int:
        return 0 if self.context == 0 else super().length_context(length)

    def ids_to_text(self, ids) -> str:
        return self.tokenizer.decode([int(i) - self.offset for i in ids if int(i) >= self.offset and int(i) != PAD])


def _digest(*parts) -> str:
    import hashlib

    return hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).hexdigest()[:16]


__all__ = ["SubwordLMTask", "position_buckets", "held_out", "train_bpe", "token_bytes"]
