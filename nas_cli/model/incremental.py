"""Incremental decoding of nas-run's Transformer: one new position at a time, each attention layer's keys and
values (and its core's running state) kept in a cache; equal to running the decoder on the whole prefix.

The functions take the model's layers as they are (an attention layer with its projections and core, a
block with its sublayers and norms) and do not import the model: transformer.py imports them."""
from __future__ import annotations

import torch
from torch import nn


def attention_step(mha: nn.Module, x_q, memory, k_mask, cache: dict):
    """One decoding step of ``mha`` for the newest position x_q (B, 1, C).

    Self-attention (``memory`` None): the new key/value is appended to ``cache``.
    Cross-attention: the memory's keys/values are projected once and kept in ``cache``.
    The core's running state (e.g. DNAS column normalizers) lives in cache["state"]."""
    q = mha.queries(x_q)
    if memory is None:
        seen = int(cache.get("n", 0))  # positions before this one
        pos = torch.tensor([seen], device=q.device) if mha.rotary else None  # as many as the positions before it
        q, new = mha.rotate_queries(q, pos), mha.kv_entries(x_q, pos)
        cache["n"] = seen + 1
        window = getattr(mha.core, "window", None)
        for name, entry in new.items():  # keys and values, or MLA's latent and rotary key (B, heads or 1, 1, D)
            if mha.core.recurrent:  # a recurrent mixer: its state holds the past, the cache only the newest key
                cache[name] = entry
                continue
            cache[name] = entry if name not in cache else torch.cat([cache[name], entry], dim=2)
            if window is not None:  # a sliding window: the positions that left it are never read again
                cache[name] = cache[name][:, :, -window:]
    elif "k" not in cache:
        cache.update(mha.kv_entries(memory))
    extra = {"alibi": mha.alibi} if mha.alibi is not None else {}
    # the cache holds the key/value heads unrepeated (model.kv_heads) or MLA's latents: each step rebuilds every
    # head's keys and values for the core
    k, v = mha.keys_values({name: cache[name] for name in mha.cache_names})
    out, cache["state"] = mha.core.step(q, k, v, k_mask, cache.get("state"), **mha.input_projection(x_q), **extra)
    b = out.size(0)
    return mha.dropout(mha.out_proj(out.transpose(1, 2).reshape(b, 1, mha.heads * mha.d_head)))


def can_step_of(mha: nn.Module) -> bool:
    core = mha.core
    return core.supports_step and not mha.input_positions and not core.uses_prev


def reorder_cache(cache, index: torch.Tensor):
    """Select rows (beam search): every tensor in the cache is batch-first."""
    if isinstance(cache, torch.Tensor):
        return cache.index_select(0, index)
    if isinstance(cache, dict):
        return {k: reorder_cache(v, index) for k, v in cache.items()}
    if isinstance(cache, (list, tuple)):
        return type(cache)(reorder_cache(v, index) for v in cache)
    return cache


def block_step(block: nn.Module, x, memory, memory_mask, cache: dict):
    """Block.forward for the newest position only, using and updating ``cache``."""
    sublayers = [lambda h: attention_step(block.self_attn, h, None, None, cache.setdefault("self", {}))]
    if block.cross_attn is not None:
        sublayers.append(lambda h: attention_step(block.cross_attn, h, memory, memory_mask, cache.setdefault("cross", {})))
    if block.ffn is not None:
        sublayers.append(block.ffn)
    for i, fn in enumerate(sublayers):
        x = x + fn(block.norms[i](x)) if block.norm_first else block.norms[i](x + fn(x))
    return x
