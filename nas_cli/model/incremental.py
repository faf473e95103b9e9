"""Incremental decoding of nas-run's Transformer: one new position at a time, each attention layer's keys and
values (and its core's running state) kept in a cache; equal to running the decoder on the whole prefix.

The functions take the model's layers as they are (an attention layer with its projections and core, a
block with its sublayers and norms) and do not import the model: transformer.py imports them."""
from __future__ import annotations

import torch
from torch import nn

from nas_cli.model.heads import expand


def attention_step(mha: nn.Module, x_q, memory, k_mask, cache: dict):
    """One decoding step of ``mha`` for the newest position x_q (B, 1, C).

    Self-attention (``memory`` None): the new key/value is appended to ``cache``.
    Cross-attention: the memory's keys/values are projected once and kept in ``cache``.
    The core's running state (e.g. DNAS column normalizers) lives in cache["state"]."""
    q = mha.queries(x_q)
    if memory is None:
        k_new, v_new = mha.keys(x_q), mha.values(x_q)
        seen = int(cache.get("n", 0))  # positions before this one
        if mha.rotary:  # the newest position: as many as the positions before it
            pos = torch.tensor([seen], device=q.device)
            q, k_new = mha.rotate(q, pos), mha.rotate(k_new, pos)
        cache["n"] = seen + 1
        if mha.core.recurrent:  # a recurrent mixer: its state holds the past, the cache only the newest key
            cache["k"], cache["v"] = k_new, v_new
        else:
            cache["k"] = k_new if "k" not in cache else torch.cat([cache["k"], k_new], dim=2)
            cache["v"] = v_new if "v" not in cache else torch.cat([cache["v"], v_new], dim=2)
            window = getattr(mha.core, "window", None)
            if window is not None:  # a sliding window: the keys that left it are never read again
                cache["k"], cache["v"] = cache["k"][:, :, -window:], cache["v"][:, :, -window:]
    elif "k" not in cache:
        cache["k"], cache["v"] = mha.keys(memory), mha.values(memory)
    extra = {"alibi": mha.alibi} if mha.alibi is not None else {}
    # the cache holds the key/value heads unrepeated (model.kv_heads): each step repeats them for the core
    out, cache["state"] = mha.core.step(q, expand(cache["k"], mha.heads), expand(cache["v"], mha.heads), k_mask,
                                        cache.get("state"), **mha.input_projection(x_q), **extra)
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
