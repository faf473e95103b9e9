"""Batched beam search for the encoder-decoder.

Scores are sums of token log-probabilities (EOS included when a hypothesis ends with it)
divided by ``length ** lenpen`` (fairseq's convention; ``length`` counts EOS). As in
fairseq, an EOS candidate finishes a hypothesis only if it ranks among the top ``beam``
candidates of its step, so beam 1 is exactly greedy decoding. Decoding is incremental
(cached keys/values, and for the prefix-normalized DNAS/HNAS/Sinkhorn a running column
normalizer per key) when every decoder core supports ``step``; otherwise the decoder is
re-run on the whole prefix. Both equal teacher forcing.
"""
from __future__ import annotations

import torch

from nas_cli.model.incremental import reorder_cache

NEG_INF = float("-inf")


@torch.no_grad()
def beam_search(model, src: torch.Tensor, bos_id: int, eos_id: int, pad_id: int, beam: int, max_len: int,
                lenpen: float = 1.0, incremental: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """src (B, S) -> (tokens (B, <= max_len) without BOS, EOS kept, pad after; scores (B,))."""
    b, k = src.size(0), beam
    memory, memory_mask, _ = model.encode(src)
    memory = memory.repeat_interleave(k, 0)  # (B*K, S, C)
    memory_mask = memory_mask.repeat_interleave(k, 0)
    tokens = torch.full((b * k, 1), bos_id, dtype=torch.long, device=src.device)
    scores = torch.full((b, k), NEG_INF, device=src.device)
    scores[:, 0] = 0.0  # all beams start identical: expand only the first
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(b)]
    done = torch.zeros(b, dtype=torch.bool)
    offsets = (torch.arange(b, device=src.device) * k)[:, None]  # (B, 1)
    cache = {} if incremental and model.can_step else None
    for step in range(max_len):
        lprobs = _next_log_probs(model, tokens, memory, memory_mask, cache, (pad_id, bos_id))  # (B*K, V)
        vocab = lprobs.size(-1)
        cand = (scores.unsqueeze(-1) + lprobs.view(b, k, vocab)).view(b, k * vocab)
        top_s, top_i = cand.topk(2 * k, dim=-1)  # (B, 2K)
        top_beam, top_tok = top_i // vocab, top_i % vocab
        is_eos = (top_tok == eos_id) & (top_s > NEG_INF)
        _finish_at_eos(finished, done, tokens, top_s, top_beam, is_eos, k, eos_id, lenpen)
        done |= torch.tensor([len(f) >= k for f in finished])
        if bool(done.all()):
            break
        # the K best non-EOS candidates continue (at most K of the 2K are EOS: one per beam)
        live = ~is_eos
        keep = live & (live.cumsum(-1) <= k)
        order = torch.sort((~keep).to(torch.int8), dim=-1, stable=True).indices[:, :k]  # (B, K)
        sel_beam, sel_tok, sel_s = top_beam.gather(1, order), top_tok.gather(1, order), top_s.gather(1, order)
        rows = (offsets + sel_beam).view(-1)
        tokens = torch.cat([tokens[rows], sel_tok.view(-1, 1)], dim=1)
        if cache is not None:
            cache = reorder_cache(cache, rows)
        scores = sel_s.masked_fill(done[:, None].to(sel_s.device), NEG_INF)
    return _best_hypotheses(finished, tokens, scores, k, pad_id, lenpen)


def _next_log_probs(model, tokens, memory, memory_mask, cache, banned: tuple[int, ...]) -> torch.Tensor:
    """Log-probabilities (B*K, V) of every beam's next token (one decoder step with the cache, else the
    whole prefix decoded again), the ``banned`` tokens (padding, BOS) impossible."""
    if cache is not None:
        last = model.decode_step(tokens[:, -1:], memory, memory_mask, cache)
    else:
        last = model.decode(tokens, memory, memory_mask, last_only=True)[0][:, -1]
    lprobs = torch.log_softmax(last.float(), dim=-1)
    lprobs[:, list(banned)] = NEG_INF
    return lprobs


def _finish_at_eos(finished, done, tokens, top_s, top_beam, is_eos, k: int, eos_id: int, lenpen: float) -> None:
    """An EOS among a sentence's top K candidates finishes a hypothesis (its length counts the EOS),
    scored by its log-probability over length ** ``lenpen``, until the sentence has K of them."""
    for i, j in (is_eos[:, :k] & ~done[:, None].to(is_eos.device)).nonzero().tolist():
        if len(finished[i]) < k:
            hyp = tokens[i * k + int(top_beam[i, j]), 1:].tolist() + [eos_id]
            finished[i].append((float(top_s[i, j]) / len(hyp) ** lenpen, hyp))


def _best_hypotheses(finished, tokens, scores, k: int, pad_id: int, lenpen: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sentence's best finished hypothesis (those still alive at ``max_len`` count, without an
    EOS), as padded tokens (B, longest) and their scores (B,)."""
    b = len(finished)
    for i in range(b):
        if len(finished[i]) < k:
            for j in range(k):
                sc = float(scores[i, j])
                if sc > NEG_INF:
                    hyp = tokens[i * k + j, 1:].tolist()
                    finished[i].append((sc / max(1, len(hyp)) ** lenpen, hyp))
    best = [max(f, key=lambda x: x[0]) if f else (NEG_INF, []) for f in finished]
    width = max(1, max(len(h) for _, h in best))
    out = torch.full((b, width), pad_id, dtype=torch.long, device=tokens.device)
    for i, (_, hyp) in enumerate(best):
        out[i, : len(hyp)] = torch.tensor(hyp, dtype=torch.long)
    return out, torch.tensor([s for s, _ in best])
