"""Selective attention, Leviathan et al. 2025, "Selective Attention Improves Transformer" (ICLR 2025).

    logits_ij = s_ij - F_ij,   F_ij = sum_{k<i} S_kj,   S_kj = relu(s0_kj)

Head 0's scores s0 also say, for each earlier query k, how much key j is no longer needed; the
sum of those votes over the queries before i is subtracted from every head's logits for query i,
then a softmax over the keys j <= i. A token never masks itself (S_kk = 0) and the first token is
never masked (S_k0 = 0), as in the paper: the sequence's first real token, so that a left-padded
sequence (a batch of prompts in a Hugging Face model) is computed as it is without its padding. The
weights are a distribution (a softmax).

Defined for causal self-attention only (F sums over earlier queries of the same sequence):
``attention.decoder=selective``. :meth:`step` carries F for the next query, (B, 1, 1, Sk): the
running column sums. Blocks of queries carry it too (:mod:`nas_cli.attention.rowwise`).
"""
from __future__ import annotations

import torch

from nas_cli.attention.base import masked_row_softmax
from nas_cli.attention.rowwise import RowwiseCore, below_normal


class SelectiveAttention(RowwiseCore):
    name = "selective"
    causal_self_only = True
    carries_state = True
    #: its selection is computed from a head's scores: ALiBi's bias would change what is selected
    takes_alibi = False
    #: its votes are summed over every earlier key and carried: a window would cut them (softcap it takes)
    takes_window = False

    def initial_carry(self, q, sk):
        return q.new_zeros(q.size(0), 1, 1, sk, dtype=torch.float32 if q.dtype in (torch.float16, torch.bfloat16)
                           else q.dtype)

    def block_weights(self, s, allowed, a, carry):
        c, sk = s.size(-2), s.size(-1)
        if carry.size(-1) < sk:  # keys added since the carry was made (decoding): nobody voted on them yet
            carry = torch.nn.functional.pad(carry, (0, sk - carry.size(-1)))
        carry = carry[..., :sk].to(s.dtype)
        rows = torch.arange(a, a + c, device=s.device)[:, None]
        cols = torch.arange(sk, device=s.device)[None, :]
        # the sequence's first real key is never masked: column 0, or the first one after left padding
        first = allowed.any(dim=1, keepdim=True).to(torch.int8).argmax(dim=-1, keepdim=True)  # (B, 1, c, 1)
        votes = torch.relu(s[:, :1]) * (allowed & (cols != rows) & (cols != first))  # (B, 1, c, Sk)
        before = torch.cumsum(votes, dim=-2) - votes  # votes of the block's earlier rows
        logits = s - (carry + before)
        top = logits.masked_fill(~allowed, float("-inf")).amax(-1, keepdim=True).detach()
        far = below_normal(logits - torch.where(torch.isfinite(top), top, torch.zeros_like(top)))
        weights = masked_row_softmax(logits, allowed & ~far)  # a weight exp(-88) or less is 0
        return weights, carry + votes.sum(-2, keepdim=True)
