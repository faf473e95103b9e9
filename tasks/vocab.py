"""Tokenizers trained with HF ``tokenizers`` and cached on disk.

* ``joint_bpe``: one BPE vocabulary over source and target text (Sennrich et al.), with a
  Metaspace pre-tokenizer so decoding restores the original spacing (detokenized text
  for sacreBLEU).
* ``word_level``: whitespace words, the vocabulary of the training split (WikiText, as in
  the papers); unknown words map to ``<unk>``.

Special ids are fixed across both: 0 ``<pad>``, 1 ``<s>``, 2 ``</s>``, 3 ``<unk>`` (matching
tasks.base PAD/BOS/EOS). A tokenizer is trained once per (data, settings) fingerprint and
stored as ``<cache_dir>/<kind>-<fingerprint>.json``; a sweep's jobs reuse it.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from nas_cli.infra.atomic import atomic_write

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
UNK = 3


def default_cache_dir() -> Path:
    return Path(os.environ.get("NAS_RUN_CACHE", Path.home() / ".cache" / "nas-run"))


def _save_atomic(tok: Tokenizer, path: Path) -> None:
    atomic_write(path, lambda tmp: tok.save(str(tmp)))


def joint_bpe(texts: Iterable[str], vocab_size: int, cache: Path) -> tuple[Tokenizer, bool]:
    """Returns (tokenizer, loaded_from_cache)."""
    if cache.is_file():
        return Tokenizer.from_file(str(cache)), True
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=int(vocab_size), special_tokens=SPECIALS, min_frequency=2,
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    _save_atomic(tok, cache)
    return tok, False


def word_level(texts: Iterable[str], cache: Path, max_size: int | None = None) -> tuple[Tokenizer, bool]:
    if cache.is_file():
        return Tokenizer.from_file(str(cache)), True
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="\x00")  # joins words with spaces, changes nothing else
    trainer = trainers.WordLevelTrainer(vocab_size=int(max_size or 10**8), min_frequency=1, special_tokens=SPECIALS,
                                        show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    tok = _contiguous_word_ids(tok)
    _save_atomic(tok, cache)
    return tok, False


def _contiguous_word_ids(tok: Tokenizer) -> Tokenizer:
    """The same word vocabulary with ids 0..V-1 and no gaps: specials first, then the words in
    the trainer's (frequency) order.

    A corpus that itself contains a special token as a word (WikiText's ``<unk>``) makes the
    ``tokenizers`` trainer give that word a second, frequency-ranked id and leave the special's
    id unused, so the largest id equals ``get_vocab_size()`` and overflows an embedding of that
    size. Frequency order is kept (the adaptive softmax relies on it)."""
    vocab = tok.get_vocab()
    words = [w for w, _ in sorted(vocab.items(), key=lambda kv: kv[1]) if w not in SPECIALS]
    fixed = Tokenizer(models.WordLevel({w: i for i, w in enumerate(SPECIALS + words)}, unk_token="<unk>"))
    fixed.pre_tokenizer = tok.pre_tokenizer
    fixed.decoder = tok.decoder
    return fixed
