"""Translation (WMT14 en-de, IWSLT14 de-en, Multi30k) and headline generation (Gigaword).

Text comes from ``tasks.sources`` (local raw files, a ``save_to_disk`` dataset or the HF
hub), is encoded with a joint BPE (``tasks.vocab``, cached), filtered by ``max_len``
(training only) and batched by ``max_tokens`` with length bucketing.

Scores (each under its own name so numbers are never mixed up):
* ``bleu``: sacreBLEU on detokenized output vs the raw references, signature recorded;
* ``bleu_tok``: tokenized BLEU as the WMT14 en-de literature reports it: Moses-tokenized
  hypotheses and references, compound splitting (``a-b`` -> ``a ##AT##-##AT## b``) when
  ``compound_split`` is on, BLEU without further tokenization;
* ``rouge1/rouge2/rougeL`` (summarization): F1 x 100 from the ``rouge-score`` package.
"""
from __future__ import annotations

import re
import time
from functools import cached_property
from pathlib import Path

import numpy as np
import sacrebleu
import torch
from torch.utils.data import DataLoader

from .base import BOS, EOS, PAD, Task
from .batching import TokenBatchSampler
from .sources import DataError, check_dir, disk_split, fingerprint, hub_split, local_parallel
from .vocab import default_cache_dir, joint_bpe

SPLITS = ("train", "valid", "test")


class _Indexed(torch.utils.data.Dataset):
    def __init__(self, src: list[np.ndarray], tgt: list[np.ndarray]):
        self.src, self.tgt = src, tgt

    def __len__(self):
        return len(self.src)

    def __getitem__(self, i):
        return i, self.src[i], self.tgt[i]


def _pad(seqs, extra_front=None, extra_back=None) -> torch.Tensor:
    n = max(len(s) for s in seqs) + (extra_front is not None) + (extra_back is not None)
    out = torch.full((len(seqs), n), PAD, dtype=torch.long)
    for i, s in enumerate(seqs):
        row = ([extra_front] if extra_front is not None else []) + list(s) + ([extra_back] if extra_back is not None else [])
        out[i, : len(row)] = torch.as_tensor(row)
    return out


def collate(batch):
    idx, src, tgt = zip(*batch)
    return {"src": _pad(src), "tgt_in": _pad(tgt, extra_front=BOS), "tgt_out": _pad(tgt, extra_back=EOS),
            "index": torch.as_tensor(idx)}


class TranslationTask(Task):
    kind = "seq2seq"
    loader_splits = ("train", "valid", "test")

    def __init__(self, name: str, src_lang: str, tgt_lang: str, source: str = "auto", path: str | None = None,
                 hf_name: str | None = None, hf_config: str | None = None, columns: list[str] | None = None,
                 splits: dict | None = None, hub_splits: dict | None = None, vocab_size: int = 8000, max_tokens: int = 4096, max_len: int = 256,
                 eval_max_tokens: int | None = None, cache_dir: str | None = None, num_workers: int = 0,
                 seed: int = 1, beam: int = 5, lenpen: float = 1.0, max_len_a: float = 1.2, max_len_b: int = 10,
                 valid_beam: int = 1, compound_split: bool = False, moses_lang: str | None = None,
                 monitor: str = "val/bleu", monitor_mode: str = "max", limit_train: int | None = None):
        super().__init__()
        self.name, self.src_lang, self.tgt_lang = name, src_lang, tgt_lang
        self.source, self.path, self.hf_name, self.hf_config = source, path, hf_name, hf_config
        self.columns = list(columns) if columns else [f"translation.{src_lang}", f"translation.{tgt_lang}"]
        # split names: files of the local layout, and splits of a hub / save_to_disk dataset
        self.split_names = {**{s: s for s in SPLITS}, **(dict(splits) if splits else {})}
        self.hub_split_names = {"train": "train", "valid": "validation", "test": "test",
                                **(dict(hub_splits) if hub_splits else {})}
        self.vocab_size, self.max_tokens, self.max_len = int(vocab_size), int(max_tokens), int(max_len)
        self.eval_max_tokens = int(eval_max_tokens or max_tokens)
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
        self.num_workers, self.seed = int(num_workers), int(seed)
        self.decoding = {"beam": int(beam), "lenpen": float(lenpen), "max_len_a": float(max_len_a),
                         "max_len_b": int(max_len_b)}
        self.valid_beam = int(valid_beam)
        self.compound_split, self.moses_lang = bool(compound_split), moses_lang or tgt_lang
        self.monitor, self.monitor_mode = monitor, monitor_mode
        self.limit_train = limit_train
        self.text: dict[str, tuple[list[str], list[str]]] = {}
        self.ids: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {}
        self.tokenizer = None
        self.timings: dict[str, float] = {}

    # ---- data --------------------------------------------------------------------------
    def _resolve_source(self) -> str:
        if self.source != "auto":
            if self.source not in ("local", "disk", "hub"):
                raise DataError(f"task.source must be auto, local, disk or hub (got '{self.source}')")
            return self.source
        if self.path:
            return "disk" if (Path(str(self.path)).expanduser() / "dataset_dict.json").is_file() else "local"
        if self.hf_name:
            return "hub"
        raise DataError(f"task '{self.name}' has no data: set task.path=<dir> (raw files or save_to_disk) "
                        "or task.hf_name=<dataset>")

    def _load_text(self, split: str) -> tuple[list[str], list[str]]:
        kind = self._resolve_source()
        name = self.split_names[split]
        if kind == "local":
            return local_parallel(check_dir(self.path), name, self.src_lang, self.tgt_lang)
        name = self.hub_split_names[split]
        if kind == "disk":
            a, b = disk_split(check_dir(self.path), name, self.columns)
        else:
            a, b = hub_split(self.hf_name, self.hf_config, name, self.columns, str(self.cache_dir / "hf"))
        if not a:
            raise DataError(f"task '{self.name}': split '{name}' is empty")
        return a, b

    def _sources_fingerprint(self) -> str:
        kind = self._resolve_source()
        if kind == "local":
            root = check_dir(self.path)
            files = [root / f"{self.split_names['train']}.{lang}" for lang in (self.src_lang, self.tgt_lang)]
            return fingerprint(*files)
        if kind == "disk":
            return fingerprint(*sorted(check_dir(self.path).rglob("*.arrow")))
        return fingerprint(self.hf_name, self.hf_config, self.split_names["train"])

    def setup(self, stage=None):
        if self.ids:
            return
        t0 = time.perf_counter()
        for split in SPLITS:
            self.text[split] = self._load_text(split)
        self.timings["read_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        key = fingerprint(self._sources_fingerprint(), "bpe", self.vocab_size, self.src_lang, self.tgt_lang,
                          self.columns, self.limit_train)
        train_src, train_tgt = self.text["train"]
        if self.limit_train:
            train_src, train_tgt = train_src[: self.limit_train], train_tgt[: self.limit_train]
            self.text["train"] = (train_src, train_tgt)
        self.tokenizer, self.tokenizer_cached = joint_bpe(
            (line for side in (train_src, train_tgt) for line in side), self.vocab_size,
            self.cache_dir / "tokenizers" / f"bpe-{key}.json")
        self.timings["tokenizer_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        for split in SPLITS:
            src, tgt = self.text[split]
            enc_s = [np.asarray(e.ids, dtype=np.int32) for e in self.tokenizer.encode_batch(src)]
            enc_t = [np.asarray(e.ids, dtype=np.int32) for e in self.tokenizer.encode_batch(tgt)]
            if split == "train":  # max-length filter (and drop empty lines) for training only
                keep = [i for i in range(len(enc_s)) if 0 < len(enc_s[i]) <= self.max_len and
                        0 < len(enc_t[i]) < self.max_len]
                enc_s, enc_t = [enc_s[i] for i in keep], [enc_t[i] for i in keep]
                if not enc_s:
                    raise DataError(f"task '{self.name}': no training pair is within task.max_len={self.max_len}")
            else:  # never drop evaluation data; truncate overlong sources to what the model accepts
                enc_s = [s[: self.max_len] if len(s) else np.asarray([EOS], dtype=np.int32) for s in enc_s]
                enc_t = [t[: self.max_len - 1] for t in enc_t]
            self.ids[split] = (enc_s, enc_t)
        self.timings["encode_s"] = time.perf_counter() - t0

    @property
    def src_vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        src, tgt = self.ids[split]
        lengths = [max(len(s), len(t) + 1) for s, t in zip(src, tgt)]
        budget = self.max_tokens if shuffle else self.eval_max_tokens
        sampler = TokenBatchSampler(lengths, max(budget, max(lengths)), shuffle=shuffle, seed=self.seed)
        return DataLoader(_Indexed(src, tgt), batch_sampler=sampler, collate_fn=collate, num_workers=self.num_workers,
                          pin_memory=torch.cuda.is_available(), persistent_workers=self.num_workers > 0)

    # ---- text and scores ---------------------------------------------------------------
    def ids_to_text(self, ids) -> str:
        out = []
        for i in ids:
            i = int(i)
            if i == EOS:
                break
            out.append(i)
        return self.tokenizer.decode(out, skip_special_tokens=True)

    def reference(self, split: str, index: int) -> str:
        """The raw reference text (not the BPE round trip) for sacreBLEU."""
        return self.text[split][1][index]

    def max_decode_len(self, src_len: int) -> int:
        return int(self.decoding["max_len_a"] * src_len + self.decoding["max_len_b"])

    @cached_property
    def _moses(self):
        from sacremoses import MosesTokenizer

        return MosesTokenizer(lang=self.moses_lang)

    def tokenized(self, text: str) -> str:
        out = self._moses.tokenize(text, return_str=True, escape=False)
        if self.compound_split:  # as in the WMT14 en-de literature (tensor2tensor's get_ende_bleu.sh)
            out = re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", out)
        return out

    def score(self, hyps: list[str], refs: list[str]) -> dict[str, float]:
        if not hyps:
            return {}
        metric = sacrebleu.BLEU()
        bleu = metric.corpus_score(hyps, [refs])
        self.bleu_signature = str(metric.get_signature())
        tok = sacrebleu.corpus_bleu([self.tokenized(h) for h in hyps], [[self.tokenized(r) for r in refs]],
                                    tokenize="none")
        exact = sum(h == r for h, r in zip(hyps, refs)) / len(hyps)
        return {"bleu": bleu.score, "bleu_tok": tok.score, "exact_match": exact}


class SummarizationTask(TranslationTask):
    """Headline generation (Gigaword): article -> title, scored with ROUGE-1/2/L F1."""

    def __init__(self, name: str = "gigaword", src_lang: str = "article", tgt_lang: str = "title", **kw):
        kw.setdefault("columns", ["document", "summary"])
        kw.setdefault("monitor", "val/loss")
        kw.setdefault("monitor_mode", "min")
        super().__init__(name, src_lang, tgt_lang, **kw)

    def score(self, hyps, refs):
        if not hyps:
            return {}
        from rouge_score import rouge_scorer

        scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
        totals = {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
        for h, r in zip(hyps, refs):
            for key, s in scorer.score(r, h).items():
                totals[key] += s.fmeasure
        return {k: 100 * v / len(hyps) for k, v in totals.items()}
