"""Real tasks on small real or generated data: every source type, tokenization caching,
batching, beam search, BLEU/ROUGE, checkpoint averaging, context-window perplexity."""
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import sacrebleu
import torch

from datafiles import MULTI30K, WIKITEXT2, write_lm, write_parallel
from nas_cli.model.decoding import beam_search
from nas_cli.pipeline.evaluation import average_checkpoints
from nas_cli.model.transformer import Seq2SeqTransformer
from nas_cli.model.plan import AttentionPlan, make_core_factory
from nas_cli.pipeline.run import train
from tasks.batching import TokenBatchSampler
from tasks.language_model import LanguageModelTask, eval_windows, train_windows
from tasks.sources import DataError
from tasks.translation import SummarizationTask, TranslationTask
from helpers import compose_cfg, run_command

NAS_EVAL = str(Path(sys.executable).parent / "nas-eval")




@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NAS_RUN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


# ---- end to end on every task and source type --------------------------------------------
def test_translation_local_end_to_end_and_nas_eval(tmp_path, cache):
    data = write_parallel(tmp_path / "toy")
    cfg = compose_cfg("task=iwslt14", f"task.path={data}", "task.vocab_size=200", "task.max_tokens=512",
                      "task.beam=3", "task.num_workers=0", "model=tiny", "attention=dnas", "logger=csv", "debug=fast",
                      "checkpoint.every_n_steps=5", "checkpoint.keep_last=3")
    run_dir = tmp_path / "run"
    summary = train(cfg, AttentionPlan.for_job(cfg), run_dir, group="t")
    for key in ("test/bleu", "test/bleu_tok", "test/loss", "test/ppl"):
        assert key in summary["test"]
    assert summary["bleu_signature"].startswith("detok:none|nrefs:1|case:mixed|eff:no|tok:13a")  # raw text: scored as it is
    # periodic checkpoints, the last 3 kept
    steps = sorted(p.name for p in (run_dir / "checkpoints").glob("step*.ckpt"))
    assert steps == ["step10.ckpt", "step15.ckpt", "step20.ckpt"]
    # the evaluation entry point, with checkpoint averaging
    (run_dir / ".hydra").mkdir()
    from omegaconf import OmegaConf
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
    proc = run_command([NAS_EVAL, str(run_dir), "--average-last", "3", "--beam", "2"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((run_dir / "eval" / "test-avg3-beam2.json").read_text())
    assert len(result["checkpoints"]) == 3 and "test/bleu" in result["metrics"]
    hyps = (run_dir / "eval" / "test-avg3-beam2.hyp.txt").read_text().splitlines()
    assert len(hyps) == 40  # every test sentence, in the original order
    proc = run_command([NAS_EVAL, str(run_dir), "--average-last", "9"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "only 3 periodic checkpoints" in proc.stderr and "Traceback" not in proc.stderr


def test_translation_from_save_to_disk(tmp_path, cache):
    from datasets import Dataset, DatasetDict

    pairs = {"de": ["ein hund läuft .", "eine katze spielt ."] * 30, "en": ["a dog runs .", "a cat plays ."] * 30}
    DatasetDict({s: Dataset.from_dict(pairs) for s in ("train", "validation", "test")}).save_to_disk(tmp_path / "dd")
    task = TranslationTask("m", "de", "en", path=str(tmp_path / "dd"), columns=["de", "en"], vocab_size=100)
    task.setup()
    assert task._resolve_source() == "disk"
    assert len(task.ids["train"][0]) == 60 and task.reference("test", 1) == "a cat plays ."
    # nested translation dicts, as on the hub
    nested = {"translation": [{"de": d, "en": e} for d, e in zip(pairs["de"], pairs["en"])]}
    DatasetDict({s: Dataset.from_dict(nested) for s in ("train", "valid", "test")}).save_to_disk(tmp_path / "nested")
    task = TranslationTask("m", "de", "en", path=str(tmp_path / "nested"), vocab_size=100,
                           hub_splits={"valid": "valid"})
    task.setup()
    assert task.text["valid"][1][0] == "a dog runs ."


def test_lm_local_and_disk_with_context_window(tmp_path, cache):
    data = write_lm(tmp_path / "lm")
    cfg = compose_cfg("task=wikitext2", f"task.path={data}", "task.tokens_per_sample=32", "task.context_window=24",
                      "model=tiny", "attention=hnas", "logger=csv", "debug=fast", "trainer.limit_test_batches=null")
    summary = train(cfg, AttentionPlan.for_job(cfg), tmp_path / "run", group="t")
    from datasets import Dataset, DatasetDict
    lines = {s: (data / f"{s}.txt").read_text().splitlines() for s in ("train", "valid", "test")}
    DatasetDict({s: Dataset.from_dict({"text": v}) for s, v in lines.items()}).save_to_disk(tmp_path / "dd")
    task = LanguageModelTask("w", path=str(tmp_path / "dd"), tokens_per_sample=32, context_window=24,
                             hub_splits={"valid": "valid"})
    task.setup()
    local = LanguageModelTask("w", path=str(data), tokens_per_sample=32, context_window=24)
    local.setup()
    assert np.array_equal(task.streams["test"], local.streams["test"])  # same text, same ids
    # the whole test split was scored: one target per token after the first
    words = sum(len(line.split()) + 1 for line in lines["test"])
    assert local.n_eval_tokens("test") == words - 1
    assert summary["test"]["test/ppl"] == pytest.approx(math.exp(summary["test"]["test/loss"]), rel=1e-4)


def test_gigaword_local_rouge(tmp_path, cache):
    data = write_parallel(tmp_path / "giga", src="article", tgt="title", n=(120, 20, 20))
    cfg = compose_cfg("task=gigaword", f"task.path={data}", "task.vocab_size=150", "task.max_tokens=512",
                      "task.beam=2", "task.num_workers=0", "model=tiny", "logger=none", "debug=fast")
    summary = train(cfg, AttentionPlan.for_job(cfg), tmp_path / "run", group="t")
    assert {"test/rouge1", "test/rouge2", "test/rougeL"} <= set(summary["test"])
    task = SummarizationTask(path=str(data))
    scores = task.score(["the cat sat", "a dog"], ["the cat sat", "a red dog"])
    from rouge_score import rouge_scorer
    ref = rouge_scorer.RougeScorer(["rouge1"], use_stemmer=True)
    expect = 100 * (ref.score("the cat sat", "the cat sat")["rouge1"].fmeasure
                    + ref.score("a red dog", "a dog")["rouge1"].fmeasure) / 2
    assert scores["rouge1"] == pytest.approx(expect)


@pytest.mark.skipif(not MULTI30K.is_dir(), reason="../shared/data/multi30k not present")
def test_multi30k_real_data_pipeline_and_cache(tmp_path, cache):
    kw = dict(path=str(MULTI30K), vocab_size=2000, splits={"valid": "val", "test": "test_2016_flickr"})
    task = TranslationTask("multi30k", "de", "en", **kw)
    task.setup()
    assert not task.tokenizer_cached
    assert len(task.ids["test"][0]) == 1000 and len(task.ids["valid"][0]) == 1014
    assert len(task.ids["train"][0]) > 28_900  # max-length filter drops almost nothing
    again = TranslationTask("multi30k", "de", "en", **kw)
    again.setup()
    assert again.tokenizer_cached and again.tokenizer.get_vocab() == task.tokenizer.get_vocab()
    assert len(list((cache / "tokenizers").glob("bpe-*.json"))) == 1
    # BPE round trip restores the raw text (detokenized output for sacreBLEU)
    src = task.text["test"][1][5]
    assert task.tokenizer.decode(task.tokenizer.encode(src).ids) == src
    batch = next(iter(task.train_dataloader()))
    assert batch["src"].numel() <= 4096 and batch["tgt_in"][:, 0].eq(1).all()


@pytest.mark.skipif(not WIKITEXT2.is_dir(), reason="../shared/data/wikitext-2 not present")
def test_wikitext2_real_vocabulary(tmp_path, cache):
    task = LanguageModelTask("wikitext2", path=str(WIKITEXT2))
    task.setup()
    # the published 33,278 types count <unk> and the end-of-line token; + <pad> and <s>
    assert task.src_vocab_size == 33_278 + 2
    assert len(task.streams["train"]) == 2_088_628
    # every id fits the embedding (WikiText's own "<unk>" word is the <unk> special, id 3)
    assert max(int(s.max()) for s in task.streams.values()) == task.src_vocab_size - 1
    assert task.tokenizer.token_to_id("<unk>") == 3 and task.tokenizer.token_to_id("the") == 4


def test_word_vocabulary_ids_are_contiguous_when_the_corpus_contains_specials(tmp_path, cache):
    root = tmp_path / "lm"
    root.mkdir()
    text = "the cat <unk> sat on the <unk> mat <unk> . the dog <pad> ran\n"
    for split in ("train", "valid", "test"):
        (root / f"{split}.txt").write_text(text * 5)
    task = LanguageModelTask("toy", path=str(root))
    task.setup()
    vocab = task.tokenizer.get_vocab()
    assert sorted(vocab.values()) == list(range(task.src_vocab_size))  # no gaps, no id past the size
    assert vocab["<unk>"] == 3 and vocab["the"] == 4  # specials first, then by frequency
    assert task.tokenizer.encode("the zebra").ids == [4, 3]


# ---- bad data: one clear line each --------------------------------------------------------
def test_bad_data_messages(tmp_path, cache):
    with pytest.raises(DataError, match="task.path=.*nowhere is not a directory"):
        TranslationTask("x", "de", "en", path=str(tmp_path / "nowhere")).setup()
    bad = write_parallel(tmp_path / "bad")
    (bad / "valid.en").write_text("only one line\n")
    with pytest.raises(DataError, match=r"valid.de has 40 lines but .*valid.en has 1"):
        TranslationTask("x", "de", "en", path=str(bad)).setup()
    empty = write_parallel(tmp_path / "empty")
    (empty / "test.de").write_text("")
    with pytest.raises(DataError, match=r"test.de is empty"):
        TranslationTask("x", "de", "en", path=str(empty)).setup()
    binary = write_lm(tmp_path / "binary")
    (binary / "valid.txt").write_bytes(b"fine line\nbad \xff\xfe bytes\n")
    with pytest.raises(DataError, match=r"valid.txt is not valid UTF-8 \(byte 14, line 2\)"):
        LanguageModelTask("w", path=str(binary)).setup()
    with pytest.raises(DataError, match="has no data: set task.path"):
        TranslationTask("x", "de", "en").setup()


def test_bad_data_from_the_command_line(tmp_path):
    proc = run_command([str(Path(sys.executable).parent / "nas-run"), "task=multi30k",
                           f"task.path={tmp_path / 'missing'}", "debug=fast", "logger=none"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert f"task.path={tmp_path / 'missing'} is not a directory" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_mismatched_parallel_corpus_is_one_line_before_anything_is_made(tmp_path):
    """Multi30k with 10 German and 9 English lines in one split: refused in one line, exit 2, before the
    run directory (and its failed.json) exists; line endings counted as they are read (CRLF too)."""
    data = tmp_path / "m30k"
    data.mkdir()
    for split in ("train", "val", "test_2016_flickr"):
        (data / f"{split}.de").write_text("".join(f"ein satz {i}\n" for i in range(10)))
        (data / f"{split}.en").write_bytes(b"".join(b"a sentence %d\r\n" % i for i in range(10)))
    (data / "val.en").write_text("".join(f"a sentence {i}\n" for i in range(9)))
    proc = run_command([str(Path(sys.executable).parent / "nas-run"), "task=multi30k", f"task.path={data}",
                        "debug=fast", "logger=none"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert "val.de has 10 lines but" in lines[0] and "val.en has 9" in lines[0]
    assert not (tmp_path / "outputs").exists()


# ---- pieces against references --------------------------------------------------------------
def test_token_batches_respect_budget_and_cover_everything():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 60, size=500).tolist()
    sampler = TokenBatchSampler(lengths, max_tokens=256, shuffle=True, seed=3)
    batches = list(sampler)
    assert sorted(i for b in batches for i in b) == list(range(500))
    assert all(max(lengths[i] for i in b) * len(b) <= 256 for b in batches)
    assert list(sampler) != batches  # a new order next epoch
    with pytest.raises(ValueError, match="task.max_tokens=10 is smaller than the longest example"):
        TokenBatchSampler(lengths, max_tokens=10, shuffle=False)


@pytest.mark.parametrize("n,block,context", [(100, 16, 12), (37, 10, 0), (5, 8, 3), (64, 16, 15)])
def test_eval_windows_score_every_token_once(n, block, context):
    scored = []
    for start, end, first in eval_windows(n, block, context):
        assert end - 1 - start <= block  # inputs per window
        scored.extend(range(first, end))
    assert scored == list(range(1, n))
    assert [t for s, e, f in train_windows(n, block) for t in range(f, e)] == list(range(1, n))


def _model(seed=0):
    torch.manual_seed(seed)
    f = make_core_factory(compose_cfg("attention=dnas").attention, 4)
    return Seq2SeqTransformer(30, 30, f, d_model=32, heads=4, encoder_layers=1, decoder_layers=2, ffn=64,
                              dropout=0.0).eval()


def test_beam_one_is_greedy():
    m = _model()
    src = torch.randint(4, 30, (6, 7))
    greedy = m.greedy_decode(src, 1, 2, max_len=12)
    beam, _ = beam_search(m, src, 1, 2, 0, beam=1, max_len=12)
    w = max(greedy.size(1), beam.size(1))
    pad = lambda t: torch.nn.functional.pad(t, (0, w - t.size(1)))  # noqa: E731
    assert torch.equal(pad(greedy), pad(beam))


@pytest.mark.parametrize("lenpen", [1.0, 0.6])
def test_beam_scores_equal_teacher_forced_log_probability(lenpen):
    m = _model(1)
    src = torch.randint(4, 30, (4, 6))
    hyps, scores = beam_search(m, src, 1, 2, 0, beam=4, max_len=10, lenpen=lenpen)
    for i in range(4):
        hyp = [t for t in hyps[i].tolist() if t != 0]
        tgt_in = torch.tensor([[1] + hyp[:-1]])
        logits, _ = m(src[i: i + 1], tgt_in)
        lp = torch.log_softmax(logits.float(), -1)  # the model's own log-probabilities
        total = sum(lp[0, t, tok].item() for t, tok in enumerate(hyp))
        assert scores[i].item() == pytest.approx(total / len(hyp) ** lenpen, abs=1e-4)


def test_bleu_equals_sacrebleu_and_tokenized_bleu_splits_compounds(tmp_path):
    task = TranslationTask("w", "en", "de", compound_split=True)
    hyps = ["Das ist ein Test-Fall.", "Hallo Welt!"]
    refs = ["Das ist ein Testfall.", "Hallo, Welt!"]
    out = task.score(hyps, refs)
    assert out["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert task.tokenized("Test-Fall.") == "Test ##AT##-##AT## Fall ."
    tok = sacrebleu.corpus_bleu([task.tokenized(h) for h in hyps], [[task.tokenized(r) for r in refs]], tokenize="none")
    assert out["bleu_tok"] == pytest.approx(tok.score)


def test_average_checkpoints(tmp_path):
    m = _model()
    state = {"state_dict": {k: v.clone() for k, v in m.state_dict().items()}}
    torch.save(state, tmp_path / "a.ckpt")
    torch.save(state, tmp_path / "b.ckpt")
    avg = average_checkpoints([tmp_path / "a.ckpt", tmp_path / "b.ckpt"])
    for k, v in m.state_dict().items():
        assert torch.equal(avg[k], v), k
    other = {"state_dict": {k: v * 3 if v.is_floating_point() else v for k, v in m.state_dict().items()}}
    torch.save(other, tmp_path / "c.ckpt")
    avg = average_checkpoints([tmp_path / "a.ckpt", tmp_path / "c.ckpt"])
    k = "generator.weight"
    torch.testing.assert_close(avg[k], m.state_dict()[k] * 2)


# ---- adaptive softmax (language models) ----------------------------------------------------
def test_adaptive_softmax_lm_scores_the_same_distribution_it_trains(tmp_path, cache):
    """With model.adaptive_softmax the training/eval loss (target log-probs only) equals the NLL
    of the full distribution the model's forward returns, that distribution is normalized, and a
    run reports perplexity = exp(loss)."""
    data = write_lm(tmp_path / "lm")
    cfg = compose_cfg("task=wikitext2", f"task.path={data}", "task.tokens_per_sample=32", "task.context_window=24",
                      "model=tiny", "model.adaptive_softmax={cutoffs:[6,14],div_value:2}",
                      "optim.label_smoothing=0", "logger=none", "debug=fast", "trainer.limit_test_batches=null")
    summary = train(cfg, AttentionPlan.for_job(cfg), tmp_path / "run", group="t")
    assert summary["test"]["test/ppl"] == pytest.approx(math.exp(summary["test"]["test/loss"]), rel=1e-4)
    from nas_cli.pipeline.lit import NasLitModule
    task = LanguageModelTask("w", path=str(data), tokens_per_sample=32, context_window=24)
    task.setup()
    module = NasLitModule(cfg.model, AttentionPlan.for_job(cfg).model_cores(cfg.model), cfg.optim, task).eval()
    assert isinstance(module.model.generator, torch.nn.AdaptiveLogSoftmaxWithLoss)
    batch = next(iter(task.test_dataloader()))
    with torch.no_grad():
        loss, nll_sum, n, correct = module._step(batch, 0.0)
        logp, _ = module.model(batch["ids"])
    assert torch.allclose(logp.exp().sum(-1), torch.ones(()), atol=1e-5)  # a normalized distribution
    keep = batch["target"] != task.pad_id
    full_nll = -logp.gather(-1, batch["target"][..., None]).squeeze(-1)[keep]
    assert float(nll_sum) == pytest.approx(float(full_nll.sum()), rel=1e-5)
    assert int(correct) == int((logp.argmax(-1) == batch["target"])[keep].sum())
    assert float(loss) == pytest.approx(float(full_nll.mean()), rel=1e-5)


@pytest.mark.parametrize("overrides,needle", [
    (["optim.label_smoothing=0.1"], "optim.label_smoothing must be 0 with model.adaptive_softmax"),
    (["optim.label_smoothing=0", "model.adaptive_softmax.cutoffs=[14,6]"], "model.adaptive_softmax.cutoffs"),
])
def test_adaptive_softmax_bad_settings_are_one_line_errors(tmp_path, cache, overrides, needle):
    data = write_lm(tmp_path / "lm")
    proc = run_command([str(Path(sys.executable).parent / "nas-run"), "task=wikitext2", f"task.path={data}",
                           "task.tokens_per_sample=32", "task.context_window=24",
                           "model.adaptive_softmax={cutoffs:[6,14],div_value:2}", *overrides, "logger=none",
                           "debug=fast", f"hydra.run.dir={tmp_path / 'run'}"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr


def test_adaptive_softmax_is_refused_for_translation(tmp_path, cache):
    data = write_parallel(tmp_path / "toy")
    cfg = compose_cfg("task=iwslt14", f"task.path={data}", "task.vocab_size=200", "model=tiny",
                      "model.adaptive_softmax={cutoffs:[50]}", "logger=none", "debug=fast")
    from nas_cli.errors import UserError
    with pytest.raises(UserError, match="adaptive_softmax is for language-model tasks"):
        train(cfg, AttentionPlan.for_job(cfg), tmp_path / "run", group="t")


def test_windows_line_endings_bom_and_gzip_files_are_read_as_plain_text(tmp_path, capfd):
    """CRLF and a UTF-8 BOM are normalized (one note each file), .gz splits are read."""
    import gzip

    clean = write_parallel(tmp_path / "clean")
    messy = tmp_path / "messy"
    messy.mkdir()
    for f in clean.iterdir():
        text = f.read_text(encoding="utf-8")
        if f.name.startswith("train"):
            (messy / f"{f.name}.gz").write_bytes(gzip.compress(text.encode()))
        else:
            (messy / f.name).write_bytes(("\ufeff" + text.replace("\n", "\r\n")).encode("utf-8"))
    tasks = []
    for root in (clean, messy):
        task = TranslationTask("x", "de", "en", path=str(root), vocab_size=120, cache_dir=str(tmp_path / "cache"))
        task.setup()
        tasks.append(task)
    err = capfd.readouterr().err
    assert "removed a UTF-8 byte-order mark; converted Windows line endings (CRLF) to \\n (40 lines)" in err
    assert tasks[0].text == tasks[1].text  # the same sentences, nothing added
    vocab = tasks[1].tokenizer.get_vocab()
    assert not [t for t in vocab if "\r" in t or "\ufeff" in t]
    with pytest.raises(DataError, match=r"valid.de not found \(nor valid.de.gz\)"):
        (messy / "valid.de").unlink()
        TranslationTask("x", "de", "en", path=str(messy), vocab_size=120, cache_dir=str(tmp_path / "c2")).setup()


def test_sources_longer_than_the_model_refused_before_training_and_decoding_capped(tmp_path):
    """An evaluation source longer than the model takes is refused before training (not at the first
    validation, minutes in), and decoding is capped at the model's length."""
    data = write_parallel(tmp_path / "mt")
    long = " ".join(["groß rot blau klein"] * 20) + "."
    (data / "test.de").write_text((data / "test.de").read_text() + long + "\n")
    (data / "test.en").write_text((data / "test.en").read_text() + "big.\n")
    nas_run = str(Path(sys.executable).parent / "nas-run")
    common = ["task=iwslt14", f"task.path={data}", "task.vocab_size=200", "task.max_tokens=1024", "task.num_workers=0",
              "debug=fast", "logger=none", "progress_bar=false", "trainer.max_steps=4", "trainer.val_check_interval=2",
              "eval_batch_items=null"]  # the test's batches whole: the long source is among them
    proc = run_command([nas_run, *common, "model.max_len=40", f"hydra.run.dir={tmp_path / 'a'}"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2 and "the longest test source has" in proc.stderr and "model.max_len=40" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "a" / "checkpoints").exists()
    # sources fit, but max_len_a x length + max_len_b does not: decoding is capped, said once
    ok = run_command([nas_run, *common, "model.max_len=40", "task.max_len=40", "task.max_len_a=3",
                         f"hydra.run.dir={tmp_path / 'b'}"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert ok.stderr.count("decoding stops at model.max_len - 1 = 39 tokens") == 1


@pytest.mark.parametrize("n,lo,hi,symbols", [(20000, 4, 12, 16), (3000, 1, 40, 512), (500, 7, 7, 2)])
def test_synthetic_strings_are_one_draw_per_string_in_order(n, lo, hi, symbols):
    # the synthetic tasks' data is a function of task.seed: drawing all symbols at once must give exactly the strings
    # of the plain definition (a length per string, then each string's symbols, one draw per string), or every
    # synthetic run, documented number and committed result would silently change with it
    from tasks.synthetic import SPECIALS, SyntheticSeq2Seq, _strings

    gen, ref_gen = torch.Generator().manual_seed(1234), torch.Generator().manual_seed(1234)
    for _ in range(3):  # the three splits, from one generator
        lengths = torch.randint(lo, hi + 1, (n,), generator=ref_gen)
        ref = [(torch.randint(0, symbols, (int(L),), generator=ref_gen) + SPECIALS).tolist() for L in lengths]
        assert _strings(n, lo, hi, symbols, gen) == ref
    task = SyntheticSeq2Seq(train_size=200, val_size=20, test_size=30)
    task.setup()
    first = task.splits["test"].pairs[0]
    assert first[1] == first[0][::-1] and len(task.splits["val"]) == 20


def test_wikitext_under_its_own_file_names_trains_and_a_missing_split_names_every_file_looked_for(tmp_path):
    """WikiText-2 as it is distributed (wiki.train.tokens, wiki.valid.tokens, wiki.test.tokens) reads the
    same text as train.txt/valid.txt/test.txt; an empty or non-UTF-8 one says so, about that file; a
    missing split names the files it looked for."""
    plain = write_lm(tmp_path / "plain")
    wiki = tmp_path / "wiki"
    wiki.mkdir()
    for split in ("train", "valid", "test"):
        (wiki / f"wiki.{split}.tokens").write_bytes((plain / f"{split}.txt").read_bytes())
    a = LanguageModelTask("w", path=str(plain), tokens_per_sample=32, context_window=24)
    b = LanguageModelTask("w", path=str(wiki), tokens_per_sample=32, context_window=24)
    for task in (a, b):
        task.check_data()
        task.setup()
    assert all(np.array_equal(a.streams[s], b.streams[s]) for s in a.streams)
    (wiki / "wiki.valid.tokens").write_text("")
    with pytest.raises(DataError, match=r"wiki.valid.tokens is empty"):
        LanguageModelTask("w", path=str(wiki)).check_data()
    (wiki / "wiki.valid.tokens").write_bytes(b"fine line\nbad \xff\xfe bytes\n")
    with pytest.raises(DataError, match=r"wiki.valid.tokens is not valid UTF-8"):
        LanguageModelTask("w", path=str(wiki)).check_data()
    (wiki / "wiki.valid.tokens").write_bytes((plain / "valid.txt").read_bytes())
    (wiki / "wiki.test.tokens").unlink()
    with pytest.raises(DataError, match=r"test split: none of test.txt, wiki.test.tokens, wiki.test.raw \(nor .gz\)"):
        LanguageModelTask("w", path=str(wiki)).check_data()
