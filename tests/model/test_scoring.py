"""Evaluation scores only the positions it counts (nas_cli/model/scoring.py), with the same numbers
as the full-logits computation it replaced: checked against that computation written out in plain
PyTorch (every position's logits, log-softmax, then the non-pad targets summed), on seeded models of
every kind (nas-run's and Hugging Face's, LM and seq2seq), context windows 0/96/192, several
evaluation batch sizes (the last batch padded) and the adaptive softmax."""
from __future__ import annotations

import pytest
import torch
import pytorch_lightning as pl
from torch.nn import functional as F

from datafiles import write_lm, write_parallel
from helpers import compose_cfg
from nas_cli.model.plan import AttentionPlan
from nas_cli.model.scoring import score_positions
from nas_cli.pipeline.parts import build_module, build_task

REL = 1e-6


def _module(tmp_path, *overrides):
    cfg = compose_cfg(*overrides, "logger=none", "diagnostics.enabled=false")
    pl.seed_everything(3, verbose=False)
    task = build_task(cfg)
    return build_module(cfg, task, AttentionPlan.from_config(cfg.attention).model_cores(cfg.model)).eval(), task


def _full_logits_reference(module, batch):
    """The computation evaluation did before: logits at every position, one log-softmax over them, the
    non-pad targets' NLL summed per row and over the batch, greedy hits counted."""
    pad = module.task.pad_id
    if module.task.kind == "lm":
        logits, _ = module.model(batch["ids"])
        target = batch["target"]
    else:
        logits, _ = module.model(batch["src"], batch["tgt_in"])
        target = batch["tgt_out"]
    keep = target != pad
    nll = -F.log_softmax(logits.double(), dim=-1).gather(-1, target[..., None]).squeeze(-1) * keep
    correct = ((logits.argmax(-1) == target) & keep).sum()
    return nll.sum(), keep.sum(), correct, nll.sum(-1), keep.sum(-1)


def _compare(module, loader):
    checked = scored = total = 0
    with torch.no_grad():
        for batch in loader:
            got = module.eval_scores(batch)
            nll, n, correct, row_nll, row_n = _full_logits_reference(module, batch)
            assert float(got.nll_sum) == pytest.approx(float(nll), rel=REL)
            assert int(got.tokens) == int(n) and int(got.correct) == int(correct)
            assert got.row_tokens.tolist() == row_n.tolist()
            assert got.row_nll.tolist() == pytest.approx(row_nll.tolist(), rel=REL)
            checked += 1
            scored += int(n)
            total += batch["target" if "target" in batch else "tgt_out"].numel()
    return checked, scored, total


LM_DATA = dict(n=(120, 90, 60))


@pytest.mark.parametrize("context", [0, 96, 192])
@pytest.mark.parametrize("eval_batch", [1, 5, 32])
def test_nas_run_lm_scores_equal_the_full_logits_computation(tmp_path, context, eval_batch):
    data = write_lm(tmp_path / "lm", **LM_DATA)
    module, task = _module(tmp_path, "task=wikitext2", f"task.path={data}", "model=tiny", "model.max_len=300",
                           "task.tokens_per_sample=256", f"task.context_window={context}",
                           f"task.eval_batch_size={eval_batch}")
    checked, scored, total = _compare(module, task.val_dataloader())
    assert checked >= 1 and scored < total  # padded targets (short last window, context) were left out


@pytest.mark.parametrize("model,extra", [
    ("hf_llama", ["model.d_model=32", "model.heads=4", "model.kv_heads=2", "model.decoder_layers=2", "model.ffn=64"]),
    ("hf_gpt2", ["model.d_model=32", "model.heads=4", "model.decoder_layers=2", "model.ffn=64"]),
    ("tiny", ["model.adaptive_softmax={cutoffs:[6,14],div_value:2}", "optim.label_smoothing=0"]),
])
def test_hf_and_adaptive_lm_scores_equal_the_full_logits_computation(tmp_path, model, extra):
    data = write_lm(tmp_path / "lm", **LM_DATA)
    module, task = _module(tmp_path, "task=wikitext2", f"task.path={data}", f"model={model}", *extra,
                           "model.max_len=300", "task.tokens_per_sample=128", "task.context_window=96",
                           "task.eval_batch_size=5", "attention=dnas")
    checked, scored, total = _compare(module, task.val_dataloader())
    assert checked >= 2 and scored < total


@pytest.mark.parametrize("model,extra", [
    ("tiny", []),
    ("hf_bert", ["model.d_model=32", "model.heads=4", "model.encoder_layers=1", "model.decoder_layers=1",
                 "model.ffn=64"]),
])
@pytest.mark.parametrize("eval_tokens", [40, 150])
def test_seq2seq_scores_equal_the_full_logits_computation(tmp_path, model, extra, eval_tokens):
    data = write_parallel(tmp_path / "mt", n=(120, 40, 40))
    module, task = _module(tmp_path, "task=multi30k", f"task.path={data}", "task.splits.valid=valid",
                           "task.splits.test=test", "task.vocab_size=120", f"model={model}", *extra,
                           f"task.eval_max_tokens={eval_tokens}")
    checked, scored, total = _compare(module, task.val_dataloader())
    assert checked >= 2 and scored < total  # padding of the shorter targets was left out


def test_the_output_layer_sees_only_the_scored_positions_in_chunks():
    """The vocabulary projection runs on the scored positions alone (the context of a window and the
    padding get none), in chunks of at most chunk_elements logits; chunking changes no number."""
    torch.manual_seed(0)
    vocab, pad = 50, 0
    head = torch.nn.Linear(8, vocab)
    hidden = torch.randn(3, 20, 8)
    target = torch.randint(1, vocab, (3, 20))
    target[:, :15] = pad  # 15 positions of context per window
    target[2, 18:] = pad  # a short last window
    seen = []

    def logits_of(h):
        seen.append(h.size(0))
        return head(h)

    whole = score_positions(hidden, target, pad, logits_of)
    assert seen == [1, 12]  # the first position tells the vocabulary's size, then one chunk: 13 scored rows
    seen.clear()
    chunked = score_positions(hidden, target, pad, logits_of, chunk_elements=4 * vocab)
    assert seen == [1, 4, 4, 4] and sum(seen) == int((target != pad).sum())
    assert chunked.row_nll.tolist() == pytest.approx(whole.row_nll.tolist(), rel=1e-12)
    assert int(chunked.correct) == int(whole.correct)
    reference = F.cross_entropy(head(hidden).transpose(1, 2), target, ignore_index=pad, reduction="none").sum(-1)
    assert whole.row_nll.tolist() == pytest.approx(reference.tolist(), rel=1e-6)


@pytest.mark.parametrize("cutoffs,favour,chunk", [([6, 14], 0.0, 4), ([6, 14], 3.0, 4), ([50, 200, 900], 4.0, 1 << 20),
                                                  ([2000, 10000], 5.0, 1 << 20), ([2000, 10000], 5.0, 1)])
def test_adaptive_greedy_gives_the_tokens_of_the_full_argmax(cutoffs, favour, chunk):
    """The greedy words of an adaptive softmax without its (N, vocab) log-probabilities equal PyTorch's
    own ``predict`` (an argmax over the full log-probabilities) and an argmax over ``log_prob``, also where
    the head favours its clusters (most words then come from the tails), in chunks of one position or many."""
    from nas_cli.model.scoring import adaptive_greedy

    torch.manual_seed(0)
    vocab, d = cutoffs[-1] * 3, 32
    layer = torch.nn.AdaptiveLogSoftmaxWithLoss(d, vocab, cutoffs, div_value=2.0)
    h = torch.randn(300, d)
    with torch.no_grad():  # raise the clusters' logits along the mean hidden state
        layer.head.weight[cutoffs[0]:] += favour * h.mean(0) / h.mean(0).norm() ** 2
        reference, full = layer.predict(h), layer.log_prob(h).argmax(dim=1)
    tokens = adaptive_greedy(layer, h, chunk_elements=chunk)
    assert torch.equal(tokens, reference) and torch.equal(tokens, full)
    if favour >= 3.0:
        assert (tokens >= cutoffs[0]).float().mean() > 0.2  # the tails were searched, not only the head
