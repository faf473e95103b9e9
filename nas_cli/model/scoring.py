"""Evaluation scores computed at the scored positions only.

An evaluation counts the loss of some positions and not others: a language model's window scores
its new tokens and not the ``task.context_window`` tokens of context before them (their targets are
padding), a padded batch scores no padding. The output layer is the costly part of scoring a
position (a ``d_model x vocab`` product and a softmax over the vocabulary: with WikiText-2's 33,278
words and windows of 256 scoring their last 64 tokens, 3 of every 4 rows of full ``(B, T, vocab)``
logits were never counted). :func:`score_positions` takes the model's final hidden states, keeps the
scored positions, and applies the output layer, one cross entropy over the flat ``(positions,
vocab)`` layout and the greedy prediction to those alone, in chunks whose logits hold at most
:data:`CHUNK_ELEMENTS` numbers, so evaluation memory depends neither on the context window nor,
beyond one chunk, on the vocabulary.

The per-row sums that the paired tests need (``nas_cli.report``) come from the same pass.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch.nn import functional as F

#: the most logits one chunk of scored positions holds (float32: 256 MiB): a 33k-word vocabulary
#: scores about 2,000 positions a chunk, a 267k-word one (WikiText-103) about 250
CHUNK_ELEMENTS = 1 << 26


@dataclass(frozen=True)
class Scores:
    """One batch's evaluation numbers (every tensor on the batch's device, no host sync)."""

    nll_sum: torch.Tensor  # () float64: summed negative log-likelihood of the scored targets
    tokens: torch.Tensor  # () int64: scored targets
    correct: torch.Tensor  # () int64: scored targets equal to the greedy (argmax) prediction
    row_nll: torch.Tensor  # (B,) float64: the NLL sum of each row (example, or LM window)
    row_tokens: torch.Tensor  # (B,) int64: the scored targets of each row
    predicted: torch.Tensor | None = None  # (N,) int64: the greedy prediction at each scored position
    targets: torch.Tensor | None = None  # (N,) int64: the target there (class-balanced accuracies count both)
    nll_each: torch.Tensor | None = None  # (N,) float32: the NLL of each scored position


def scored(hidden: torch.Tensor, target: torch.Tensor, pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The hidden states (N, d) of the positions whose target is not ``pad_id``, their targets (N,)
    and the row each came from (N,), from ``hidden`` (B, T, d) and ``target`` (B, T)."""
    keep = target != pad_id
    rows = keep.nonzero(as_tuple=True)[0]
    return hidden[keep], target[keep], rows


def score_positions(hidden: torch.Tensor, target: torch.Tensor, pad_id: int,
                    logits_of: Callable[[torch.Tensor], torch.Tensor],
                    chunk_elements: int = CHUNK_ELEMENTS) -> Scores:
    """:class:`Scores` of ``target`` (B, T) given the final hidden states ``hidden`` (B, T, d), with
    ``logits_of`` the output layer ((n, d) -> (n, vocab) logits) applied to the scored positions only."""
    h, tgt, rows = scored(hidden, target, pad_id)
    nll = torch.empty(tgt.shape, dtype=torch.float32, device=h.device)
    pred = torch.empty(tgt.shape, dtype=torch.long, device=h.device)
    start, step = 0, None
    while start < tgt.numel():
        end = start + (step or 1)
        logits = logits_of(h[start:end]).float()  # (n, vocab)
        if step is None:  # the first position tells the vocabulary's size: the chunk follows from it
            step = max(1, chunk_elements // logits.size(-1))
        nll[start:end] = F.cross_entropy(logits, tgt[start:end], reduction="none")
        pred[start:end] = logits.argmax(-1)
        start = end
    return _summed(nll, pred, tgt, rows, target.size(0))


def score_log_probs(hidden: torch.Tensor, target: torch.Tensor, pad_id: int,
                    log_prob: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                    predict: Callable[[torch.Tensor], torch.Tensor]) -> Scores:
    """:class:`Scores` from an output layer that gives the targets' log-probabilities without the
    vocabulary's logits (an adaptive softmax): ``log_prob(h, targets)`` and ``predict(h)``."""
    h, tgt, rows = scored(hidden, target, pad_id)
    h = h.float()
    return _summed(-log_prob(h, tgt).float(), predict(h), tgt, rows, target.size(0))


#: the most tail log-probabilities one chunk of :func:`adaptive_greedy` holds (float32: 4 MiB): small enough
#: to stay in the CPU's cache (benchmarks/adaptive_greedy.py times it against PyTorch's predict)
GREEDY_CHUNK_ELEMENTS = 1 << 20


@torch.no_grad()
def adaptive_greedy(layer: torch.nn.AdaptiveLogSoftmaxWithLoss, h: torch.Tensor,
                    chunk_elements: int = GREEDY_CHUNK_ELEMENTS) -> torch.Tensor:
    """The most probable word for each hidden state ``h`` (N, d) under an adaptive softmax: the same
    tokens as ``layer.predict(h)``, without its (N, vocab) matrix of log-probabilities. A tail word's
    log-probability is its cluster's plus a log-softmax (at most 0), so a cluster is scored only for
    the positions where the cluster's own log-probability beats the best word found so far, in chunks
    of positions; a word replaces the best only when strictly more probable (the first of equals wins,
    as an argmax over the whole vocabulary)."""
    head = F.log_softmax(layer.head(h), dim=1)
    best, token = head[:, :layer.shortlist_size].max(dim=1)
    for i, tail in enumerate(layer.tail):
        cluster = head[:, layer.shortlist_size + i]
        rows = (cluster > best).nonzero().squeeze(1)
        step = max(1, chunk_elements // (layer.cutoffs[i + 1] - layer.cutoffs[i]))
        for start in range(0, rows.numel(), step):
            r = rows[start:start + step]
            value, word = (F.log_softmax(tail(h[r]), dim=1) + cluster[r, None]).max(dim=1)
            won = value > best[r]
            best[r[won]], token[r[won]] = value[won], word[won] + layer.cutoffs[i]
    return token


def _summed(nll: torch.Tensor, pred: torch.Tensor, tgt: torch.Tensor, rows: torch.Tensor, batch: int) -> Scores:
    row_nll = torch.zeros(batch, dtype=torch.float64, device=nll.device).index_add_(0, rows, nll.double())
    row_tokens = torch.zeros(batch, dtype=torch.int64, device=nll.device).index_add_(
        0, rows, torch.ones_like(rows))
    return Scores(row_nll.sum(), row_tokens.sum(), (pred == tgt).sum(), row_nll, row_tokens, pred, tgt, nll)


def position_bucket(cols: torch.Tensor) -> torch.Tensor:
    """The bucket of each window position: 0 for position 0, then 1 + floor(log2(p)) ([1, 2), [2, 4), ...)."""
    return torch.where(cols > 0, torch.floor(torch.log2(cols.clamp(min=1).double())).long() + 1,
                       torch.zeros_like(cols))


def position_sums(scores: Scores, target: torch.Tensor, pad_id: int, buckets: int = 32) -> torch.Tensor:
    """(2, buckets) float64: per position bucket of the window, the summed NLL of its scored positions and
    their count (the scored positions in the order :func:`scored` keeps them: row by row)."""
    cols = (target != pad_id).nonzero(as_tuple=True)[1]
    which = position_bucket(cols).clamp(max=buckets - 1)
    out = torch.zeros(2, buckets, dtype=torch.float64, device=target.device)
    out[0].index_add_(0, which, scores.nll_each.double())
    out[1].index_add_(0, which, torch.ones_like(which, dtype=torch.float64))
    return out


def class_counts(scores: Scores, classes: int) -> torch.Tensor:
    """(3, classes) int64: per class, the scored positions predicted right (true positives), the
    scored positions of that target (support) and the positions predicted as it."""
    right = scores.targets[scores.predicted == scores.targets]
    return torch.stack([torch.bincount(t, minlength=classes)[:classes]
                        for t in (right, scores.targets, scores.predicted)])


def class_balanced_accuracy(counts: torch.Tensor) -> float:
    """The accuracy MAD-lab reports (torchmetrics' ``MulticlassAccuracy`` with its default macro
    average, over the scored positions): the mean over classes of right / support, over the classes
    that occur as a target or a prediction (a class only predicted counts 0)."""
    right, support, predicted = counts.double()
    present = (support + predicted) > 0
    recall = torch.where(support > 0, right / support.clamp(min=1), torch.zeros_like(right))
    return float(recall[present].mean()) if bool(present.any()) else 0.0


def per_byte_and_position(split: str, sums: dict) -> dict[str, float]:
    """Bits per byte (the summed NLL in bits over the scored targets' UTF-8 bytes) and the mean loss of each
    position bucket of the windows (``pos_loss_<lo>_<hi>``), where the evaluation counted them."""
    out = {}
    if sums.get("bytes") is not None and float(sums["bytes"]) > 0:
        out[f"{split}/bpb"] = float(sums["nll"]) / (math.log(2) * float(sums["bytes"]))
    if sums.get("positions") is not None:
        nll, count = sums["positions"]
        for i in range(count.numel()):
            if float(count[i]) > 0:
                lo, hi = (0, 1) if i == 0 else (2 ** (i - 1), 2 ** i)
                out[f"{split}/pos_loss_{lo}_{hi}"] = float(nll[i] / count[i])
    return out


def group_sums(scores: Scores, target: torch.Tensor, pad_id: int, group: torch.Tensor, groups: int) -> torch.Tensor:
    """(2, groups) float64: per group of rows (``group``: (B,) its index), the scored positions predicted
    right and the scored positions (a retrieval task's accuracy per needle depth)."""
    rows = (target != pad_id).nonzero(as_tuple=True)[0]
    hits = torch.zeros(target.size(0), dtype=torch.float64, device=target.device).index_add_(
        0, rows, (scores.predicted == scores.targets).double())
    out = torch.zeros(2, groups, dtype=torch.float64, device=target.device)
    out[0].index_add_(0, group, hits)
    out[1].index_add_(0, group, scores.row_tokens.double())
    return out


def group_accuracies(split: str, name: str, group_names, sums: torch.Tensor | None) -> dict[str, float]:
    """``<split>/<name>_<group>``: each group's accuracy, where the evaluation scored some of its rows."""
    if sums is None:
        return {}
    right, total = sums
    return {f"{split}/{name}_{g}": float(right[i] / total[i]) for i, g in enumerate(group_names) if float(total[i]) > 0}
