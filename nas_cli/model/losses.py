"""The training loss of nas-run's models: label-smoothed cross entropy over the real (non-pad) targets."""
from __future__ import annotations

import torch
from torch.nn import functional as F


def label_smoothed_nll(logits: torch.Tensor, target: torch.Tensor, pad_id: int, smoothing: float = 0.0):
    """Mean label-smoothed cross entropy over non-pad targets; also returns the plain NLL sum
    and the token count (for perplexity)."""
    lprobs = F.log_softmax(logits.float(), dim=-1).flatten(0, -2)
    target = target.reshape(-1)
    keep = target != pad_id
    nll = -lprobs.gather(1, target[:, None]).squeeze(1)
    smooth = -lprobs.mean(dim=-1)
    loss = ((1 - smoothing) * nll + smoothing * smooth)[keep]
    n = keep.sum().clamp(min=1)
    return loss.sum() / n, nll[keep].sum().detach(), n
