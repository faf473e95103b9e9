"""Corpora as researchers have them: Moses-tokenized text with HTML entities,
validation subsets, loader workers, vocabulary size, empty outputs, no network."""
from __future__ import annotations

import json
import re
import random
import time
from pathlib import Path

import numpy as np
import pytest
import sacrebleu
from sacremoses import MosesDetokenizer, MosesTokenizer

from datafiles import WORDS_DE, WORDS_EN, write_parallel
from helpers import nas_run
from tasks.base import loader_workers
from tasks.sources import DataError, hub_split
from tasks.translation import TranslationTask, looks_pretokenized

RAW_EN = ['The man said "hello" to the well-known dog.', "It's a cat, isn't it?", "A e-mail (short) & more."]


def write_tokenized(root: Path, n=(120, 12, 12), seed=0) -> Path:
    """A WMT-like corpus as many repositories ship it: Moses-tokenized, entities escaped,
    hyphens split with @-@ (the word-by-word mapping of datafiles keeps it learnable)."""
    rng = random.Random(seed)
    tok_de, tok_en = MosesTokenizer(lang="de"), MosesTokenizer(lang="en")
    root.mkdir(parents=True, exist_ok=True)
    for split, count in zip(("train", "valid", "test"), n):
        de, en = [], []
        for _ in range(count):
            idx = [rng.randrange(len(WORDS_DE)) for _ in range(rng.randint(3, 7))]
            q = rng.random() < 0.5
            a = " ".join(WORDS_DE[i] for i in idx).capitalize()
            b = " ".join(WORDS_EN[i] for i in idx).capitalize()
            a, b = (f'"{a}", sagte-er.', f'"{b}", said-he.') if q else (a + ".", b + ".")
            de.append(tok_de.tokenize(a, return_str=True, escape=True, aggressive_dash_splits=True))
            en.append(tok_en.tokenize(b, return_str=True, escape=True, aggressive_dash_splits=True))
        (root / f"{split}.de").write_text("\n".join(de) + "\n", encoding="utf-8")
        (root / f"{split}.en").write_text("\n".join(en) + "\n", encoding="utf-8")
    return root


def test_pretokenized_text_is_recognised_and_raw_text_is_not():
    tok = MosesTokenizer(lang="en")
    tokenized = [tok.tokenize(s, return_str=True, escape=True, aggressive_dash_splits=True) for s in RAW_EN]
    assert any("&quot;" in t for t in tokenized) and any("@-@" in t for t in tokenized)
    assert looks_pretokenized(tokenized)
    assert not looks_pretokenized(RAW_EN)
    assert not looks_pretokenized([l.rstrip("\n") for l in (Path(__file__).parents[2] / "README.md")
                                   .read_text().splitlines() if l and not l.startswith(("|", "#", " ", "`"))])


def test_bleu_of_a_tokenized_corpus_is_detokenized_sacrebleu(tmp_path):
    """End to end on a WMT-like corpus: trains, validates and tests without a crash; ``bleu``
    equals sacreBLEU of the Moses-detokenized hypotheses against the detokenized references,
    the signature says so, and the note is printed once."""
    data = write_tokenized(tmp_path / "wmt")
    run = tmp_path / "run"
    proc = nas_run("task=wmt14", f"task.path={data}", "task.src_lang=de", "task.tgt_lang=en", "task.vocab_size=150",
                   "task.max_tokens=512", "task.splits={train: train, valid: valid, test: test}", "model=tiny",
                   "trainer.max_steps=30", "trainer.val_check_interval=15", "trainer.max_epochs=-1",
                   "trainer.check_val_every_n_epoch=null", "optim.lr=3e-3", "logger=csv", "progress_bar=false",
                   f"hydra.run.dir={run}", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("look Moses-tokenized") == 1
    summary = json.loads((run / "summary.json").read_text())
    assert summary["bleu_signature"].startswith("detok:moses|nrefs:1")
    items = json.loads((run / "test_items.json").read_text())
    # test_items.json keeps the text as scored (detokenized), so nas-report tests the BLEU the table shows
    raw = [l.rstrip("\n") for l in (data / "test.en").read_text(encoding="utf-8").splitlines()]
    detok = MosesDetokenizer(lang="en")
    assert any("&quot;" in r for r in raw) and not any("&quot;" in r for r in items["refs"])
    assert items["refs"] == [detok.detokenize(r.split(), unescape=True) for r in raw[:len(items["refs"])]]
    expected = sacrebleu.corpus_bleu(items["hyps"], [items["refs"]]).score
    assert summary["test"]["test/bleu"] == pytest.approx(expected, abs=1e-4)
    from nas_cli.report.items import METRICS

    bleu = METRICS["test/bleu"]
    # the same number, exactly to the float32 in which Lightning logs it
    assert np.float32(bleu.score(bleu.stats(items).sum(0))) == np.float32(summary["test"]["test/bleu"])
    assert "test/empty" in summary["test"] and "tok. BLEU" in proc.stdout


def _task(path, **kw) -> TranslationTask:
    kw.setdefault("vocab_size", 150)
    return TranslationTask("toy", "de", "en", path=str(path), **kw)


def test_bleu_tok_keeps_entities_as_one_token(tmp_path):
    task = _task(tmp_path, detokenize="none")
    out = task.tokenized("he said &quot; yes &quot; &amp; left")
    assert "&quot;" in out.split() and "&amp;" in out.split() and "& quot ;" not in out
    # and the detokenized form Moses-tokenized again gives the plain quote as one token
    task = _task(tmp_path, detokenize="moses")
    assert task.detokenized("he said &quot; yes &quot; , a well @-@ known dog .") == 'he said "yes", a well-known dog.'


def test_tokenized_bleu_raises_no_forgot_to_detokenize_warning(tmp_path, caplog):
    # tok. BLEU scores Moses-tokenized text on purpose: sacreBLEU's "forgot to detokenize" warning
    # (100+ lines ending in " .") would tell the user something false at every validation
    task = _task(tmp_path, detokenize="none")
    refs = [f"A {w} sat on the mat." for w in WORDS_EN * 8][:120]  # plain text, as sacreBLEU wants it
    with caplog.at_level("WARNING", logger="sacrebleu"):
        out = task.score(refs, refs)
    assert out["bleu_tok"] == pytest.approx(100.0) and len(refs) >= 100
    assert not [r for r in caplog.records if "detokenize" in r.getMessage()]
    tokenized = [task.tokenized(r) for r in refs]
    assert all(t.endswith(" .") for t in tokenized)
    with caplog.at_level("WARNING", logger="sacrebleu"):  # the check is real: unforced, sacreBLEU warns
        sacrebleu.corpus_bleu(tokenized, [tokenized], tokenize="none")
    assert [r for r in caplog.records if "detokenize" in r.getMessage()]


def test_detokenize_none_scores_the_text_as_it_is(tmp_path):
    write_tokenized(tmp_path / "d", n=(40, 6, 6))
    task = _task(tmp_path / "d", detokenize="none", cache_dir=str(tmp_path / "cache"))
    task.setup()
    refs = task.text["test"][1]
    hyps = [r.replace(" .", "") for r in refs]
    assert task.score(hyps, refs)["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert task.bleu_signature.startswith("detok:none|")


def test_valid_subset_is_the_same_sentences_for_every_run_seed(tmp_path):
    write_parallel(tmp_path / "d", n=(60, 20, 10))
    chosen = []
    for seed in (1, 2):
        task = _task(tmp_path / "d", valid_subset=7, seed=seed, cache_dir=str(tmp_path / "cache"))
        task.setup()
        assert len(task.ids["valid"][0]) == 7 and len(task.text["valid"][1]) == 7
        chosen.append(task.text["valid"][1])
    assert chosen[0] == chosen[1]
    full = (tmp_path / "d" / "valid.en").read_text().splitlines()
    assert all(s in full for s in chosen[0]) and chosen[0] == [s for s in full if s in chosen[0]]  # split order
    with pytest.raises(DataError, match="task.valid_subset"):
        _task(tmp_path / "d", valid_subset=0)


def test_loader_workers_follow_the_machine(monkeypatch):
    import os

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert loader_workers("auto") == 0
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert loader_workers("auto") == 4
    assert loader_workers(3) == 3
    with pytest.raises(ValueError, match="task.num_workers"):
        loader_workers("many")


def test_a_large_vocabulary_for_a_small_corpus_is_warned_about_with_a_smaller_one(tmp_path, capsys):
    write_parallel(tmp_path / "d", n=(60, 8, 8))
    _task(tmp_path / "d", vocab_size=200, cache_dir=str(tmp_path / "cache")).setup()
    err = capsys.readouterr().err
    assert "task.vocab_size=200 is large for 60 training pairs" in err
    suggested = int(re.search(r"e\.g\. task\.vocab_size=(\d+)", err).group(1))
    assert suggested < 200  # the advice points down, not up (it said 1000)


def test_empty_hypotheses_are_counted_and_said_for_the_split_they_come_from(tmp_path):
    """A corpus whose validation and test splits have the same size: the note names the split that was
    decoded (it guessed "test" from the size, so a validation's 100% was said as the test's, while the
    table and summary.json said the test's 0%), and its share is the summary's."""
    data = write_parallel(tmp_path / "d", n=(40, 8, 8))
    task = _task(data, cache_dir=str(tmp_path / "cache"))
    task.setup()
    refs = task.text["test"][1]
    assert task.score(["" for _ in refs[:5]] + refs[5:], refs)["empty"] == pytest.approx(5 / 8)
    proc = nas_run("task=wmt14", f"task.path={data}", "task.src_lang=de", "task.tgt_lang=en", "task.vocab_size=150",
                   "task.max_tokens=512", "task.splits={train: train, valid: valid, test: test}", "model=tiny",
                   "debug=fast", "logger=none", "diagnostics.enabled=false", "trainer.max_steps=3",
                   "trainer.val_check_interval=3", "hydra.run.dir=run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    said = {kind: int(share) for share, kind in re.findall(r"(\d+)% of the (\w+) hypotheses are empty", proc.stderr)}
    assert set(said) <= {"validation", "test"}
    empty = summary["test"]["test/empty"]
    if empty > 0.2:
        assert said["test"] == round(100 * empty)
    else:
        assert "test" not in said


def test_without_network_the_hub_fails_at_once(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(DataError, match="no network and no local copy"):
        hub_split("nas-run/no-such-dataset", None, "train", ["a"], str(tmp_path / "hf"))
    assert time.perf_counter() - start < 20


def test_the_console_table_shows_each_tasks_own_metrics():
    from rich.console import Console

    from nas_cli.pipeline.launch.callbacks import summary_table

    base = {"scheme": "unas", "heads": 4, "parameters": 10, "tokens_per_s": 1.0, "run_dir": "x"}
    rows = [{**base, "task": "gigaword", "test": {"test/rouge1": 30.5, "test/rouge2": 12.0, "test/rougeL": 28.1,
                                                  "test/empty": 0.25}},
            {**base, "task": "wmt14", "test": {"test/bleu": 20.0, "test/bleu_tok": 21.5}}]
    console = Console(width=200, record=True)
    console.print(summary_table(rows, "t"))
    text = console.export_text()
    for column in ("ROUGE-1", "ROUGE-2", "ROUGE-L", "tok. BLEU", "empty"):
        assert column in text
    assert "30.50" in text and "25.0%" in text and "21.50" in text
    assert "exact match" not in text and "test ppl" not in text
