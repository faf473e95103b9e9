"""Translation (WMT14 en-de, IWSLT14 de-en, Multi30k) and headline generation (Gigaword).

Text comes from ``tasks.sources`` (local raw files, a ``save_to_disk`` dataset or the HF
hub), is encoded with a joint BPE (``tasks.vocab``, cached), filtered by ``max_len``
(training only) and batched by ``max_tokens`` with length bucketing.

Scores (each under its own name so numbers are never mixed up):
* ``bleu``: sacreBLEU (13a) of the output against the references as the corpus ships them,
  after ``task.detokenize``: ``none`` scores the text as it is; ``moses`` first detokenizes
  hypotheses *and* references with the Moses detokenizer, unescaping HTML entities
  (``&quot;`` -> ``"``) and joining ``@-@`` hyphens, which is what a pre-tokenized corpus
  (WMT as many repositories ship it, IWSLT14 from fairseq's script) needs for the
  detokenized sacreBLEU the literature reports; ``auto`` (the default) picks ``moses`` when
  the references look Moses-tokenized (:func:`looks_pretokenized`) and says so once. The
  signature saved with the score starts with ``detok:<none|moses>``;
* ``bleu_tok``: tokenized BLEU as the WMT14 en-de literature reports it: the (detokenized)
  text Moses-tokenized, entities kept as one token, compound splitting (``a-b`` -> ``a
  ##AT##-##AT## b``) when ``compound_split`` is on, BLEU without further tokenization;
* ``rouge1/rouge2/rougeL`` (summarization): F1 x 100 from the ``rouge-score`` package;
* ``empty``: the share of empty hypotheses (warned about when above 20%).
"""
from __future__ import annotations

import random
import re
import time
from functools import cached_property
from pathlib import Path

import numpy as np
import sacrebleu
import torch
from torch.utils.data import DataLoader

from nas_cli.infra.options import PositiveInt

from .base import EOS, Task, collate_seq2seq, empty_share, loader_workers, note, worker_options
from .batching import TokenBatchSampler
from .sources import (DataError, check_dir, check_hub_source, check_parallel, check_text_file, disk_split, fingerprint, hub_split,
                      local_parallel, resolve_source)
from .vocab import default_cache_dir, joint_bpe

SPLITS = ("train", "valid", "test")
DETOKENIZE = ("auto", "none", "moses")
#: what Moses tokenization leaves behind: HTML entities, aggressive-hyphen marks, and
#: punctuation split off words (" ," " ." at the end, " 's", " n't")
_TOKENIZED = re.compile(r"&(quot|apos|amp|lt|gt|#91|#93);| @-@ | [,;:!?] | \.$| 's\b| n't\b")
#: HTML entities stay one token in ``bleu_tok`` (Moses would split ``&quot;`` into ``& quot ;``)
_ENTITY = r"&[a-z]+;|&#[0-9]+;"


def looks_pretokenized(lines: list[str], share: float = 0.2) -> bool:
    """Whether at least ``share`` of the (non-empty) lines carry marks of Moses tokenization.
    Raw text has them rarely (a space before a comma is a typo); tokenized text in most lines."""
    lines = [line for line in lines[:2000] if line.strip()]
    return bool(lines) and sum(bool(_TOKENIZED.search(line)) for line in lines) >= share * len(lines)


class _Indexed(torch.utils.data.Dataset):
    def __init__(self, src: list[np.ndarray], tgt: list[np.ndarray]):
        self.src, self.tgt = src, tgt

    def __len__(self):
        return len(self.src)

    def __getitem__(self, i):
        return i, self.src[i], self.tgt[i]


def collate(batch):
    idx, src, tgt = zip(*batch)
    return {**collate_seq2seq(list(zip(src, tgt))), "index": torch.as_tensor(idx)}


class TranslationTask(Task):
    kind = "seq2seq"
    loader_splits = ("train", "valid", "test")

    def __init__(self, name: str, src_lang: str, tgt_lang: str, source: str = "auto", path: str | None = None,
                 hf_name: str | None = None, hf_config: str | None = None, columns: list[str] | None = None,
                 splits: dict | None = None, hub_splits: dict | None = None, vocab_size: PositiveInt = 8000,
                 max_tokens: PositiveInt = 4096, max_len: PositiveInt = 256, eval_max_tokens: PositiveInt | None = None,
                 cache_dir: str | None = None, num_workers: int | str = 0, seed: int = 1, beam: PositiveInt = 5,
                 lenpen: float = 1.0, max_len_a: float = 1.2, max_len_b: int = 10, valid_beam: PositiveInt = 1,
                 compound_split: bool = False, moses_lang: str | None = None,
                 monitor: str = "val/bleu", monitor_mode: str = "max", limit_train: int | None = None,
                 detokenize: str = "auto", valid_subset: int | None = None, valid_subset_seed: int = 0):
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
        self.num_workers, self.seed = loader_workers(num_workers), int(seed)
        if detokenize not in DETOKENIZE:
            raise DataError(f"task.detokenize must be one of {', '.join(DETOKENIZE)} (got '{detokenize}')")
        self.detokenize = detokenize
        if valid_subset is not None and int(valid_subset) < 1:
            raise DataError(f"task.valid_subset must be a number of sentences >= 1, or null (got {valid_subset})")
        self.valid_subset, self.valid_subset_seed = (None if valid_subset is None else int(valid_subset)), \
            int(valid_subset_seed)
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
    @property
    def _local_files(self) -> str:
        names = self.split_names
        return f"{names['train']}.{self.src_lang}/{names['train']}.{self.tgt_lang}, {names['valid']}.*, {names['test']}.*"

    def _resolve_source(self) -> str:
        return resolve_source(self.source, self.path, self.hf_name, self.name, self._local_files)

    def check_data(self) -> None:
        """Before the run directory is made: a local folder holds every split's two files, as text."""
        kind = self._resolve_source()
        if kind == "local":
            root = check_dir(self.path)
            for name in self.split_names.values():
                for lang, side in ((self.src_lang, "source side"), (self.tgt_lang, "target side")):
                    check_text_file(root / f"{name}.{lang}", side)
                check_parallel(root, name, self.src_lang, self.tgt_lang)
        elif kind == "disk":
            check_dir(self.path)
        else:
            check_hub_source(self.name, self.hf_name, self.hf_config, str(self.cache_dir / "hf"), self._local_files)

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
        self._choose_detokenizer()
        self._take_valid_subset()
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
        pairs = len(train_src)
        if self.vocab_size > pairs:
            smaller = min(suggested_vocab(pairs), self.vocab_size // 2)
            note(f"task.vocab_size={self.vocab_size} is large for {pairs:,} training pairs: most of its subwords are "
                 f"rare and poorly trained; a smaller vocabulary (e.g. task.vocab_size={smaller}) usually works "
                 "better on a corpus this small")
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

    def _choose_detokenizer(self) -> None:
        """``task.detokenize=auto``: Moses-detokenize for scoring when the evaluation references
        look tokenized (said once); otherwise score the text as it is."""
        if self.detokenize != "auto":
            return
        refs = self.text["test"][1] + self.text["valid"][1]
        self.detokenize = "moses" if looks_pretokenized(refs) else "none"
        if self.detokenize == "moses":
            note(f"task '{self.name}': the references look Moses-tokenized (HTML entities, @-@, split-off "
                 "punctuation): hypotheses and references are detokenized (Moses, entities unescaped) before "
                 "sacreBLEU, as published scores are; task.detokenize=none scores the text as it is")

    def _take_valid_subset(self) -> None:
        """``task.valid_subset=N``: validate on N sentences drawn once with ``valid_subset_seed``
        (the same ones for every run, whatever its seed), in the split's order."""
        src, tgt = self.text["valid"]
        if self.valid_subset is None or self.valid_subset >= len(src):
            return
        keep = sorted(random.Random(self.valid_subset_seed).sample(range(len(src)), self.valid_subset))
        self.text["valid"] = ([src[i] for i in keep], [tgt[i] for i in keep])

    @property
    def src_vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        src, tgt = self.ids[split]
        lengths = [max(len(s), len(t) + 1) for s, t in zip(src, tgt)]
        budget = self.max_tokens if shuffle else self.eval_max_tokens
        sampler = TokenBatchSampler(lengths, max(budget, max(lengths)), shuffle=shuffle, seed=self.seed)
        return DataLoader(_Indexed(src, tgt), batch_sampler=sampler, collate_fn=collate,
                          pin_memory=torch.cuda.is_available(), **worker_options(self.num_workers, persistent=True))

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

    @cached_property
    def _moses_detok(self):
        from sacremoses import MosesDetokenizer

        return MosesDetokenizer(lang=self.moses_lang)

    def detokenized(self, text: str) -> str:
        """The text as sacreBLEU should see it (``task.detokenize``)."""
        if self.detokenize != "moses":
            return text
        return self._moses_detok.detokenize(text.split(), unescape=True)

    def scored_text(self, hyps: list[str], refs: list[str]) -> tuple[list[str], list[str]]:
        """The text sacreBLEU scores: hypotheses and references after ``task.detokenize``."""
        return [self.detokenized(h) for h in hyps], [self.detokenized(r) for r in refs]

    def tokenized(self, text: str) -> str:
        out = self._moses.tokenize(text, return_str=True, escape=False, protected_patterns=[_ENTITY])
        if self.compound_split:  # as in the WMT14 en-de literature (tensor2tensor's get_ende_bleu.sh)
            out = re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", out)
        return out

    def score(self, hyps: list[str], refs: list[str]) -> dict[str, float]:
        if not hyps:
            return {}
        exact = sum(h == r for h, r in zip(hyps, refs)) / len(hyps)
        hyps, refs = self.scored_text(hyps, refs)
        metric = sacrebleu.BLEU()
        bleu = metric.corpus_score(hyps, [refs])
        self.bleu_signature = f"detok:{self.detokenize}|" + str(metric.get_signature())
        # force: this score is tokenized on purpose (sacreBLEU would warn that 100 lines end in " .")
        tok = sacrebleu.corpus_bleu([self.tokenized(h) for h in hyps], [[self.tokenized(r) for r in refs]],
                                    tokenize="none", force=True)
        self.bleu_tok_signature = (f"detok:{self.detokenize}|moses-tok:{self.moses_lang}|entities:one-token|"
                                   f"compound-split:{'yes' if self.compound_split else 'no'}|tok:none")
        return {"bleu": bleu.score, "bleu_tok": tok.score, "exact_match": exact, "empty": self._empty(hyps)}

    def _empty(self, hyps: list[str]) -> float:
        """The share of empty hypotheses (the runner warns when it is high, naming the split)."""
        return empty_share(hyps)


def suggested_vocab(pairs: int) -> int:
    """A joint BPE vocabulary for ``pairs`` training pairs: about a quarter of them, in hundreds (or
    thousands from 4,000 pairs on), at least 100 and below ``pairs``."""
    size = pairs // 4
    size = size // 1000 * 1000 if size >= 1000 else size // 100 * 100
    return max(100, min(size, max(100, pairs - 1)))


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
        return {**{k: 100 * v / len(hyps) for k, v in totals.items()}, "empty": self._empty(hyps)}
