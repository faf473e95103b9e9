"""What decoding keeps of a built model: the bytes its cache grows by per token (the key/value heads of every
causal self-attention layer, nas_cli/model/heads.py) and the bytes of its recurrent mixers' states; summary.json
and nas-report state both."""
from __future__ import annotations

import torch

from nas_cli.model.multihead import MultiHeadAttention


def _self_attention(model):
    """The causal self-attention modules of nas-run's model (a language model's layers, a decoder's), or None."""
    blocks = getattr(model, "layers", None) or getattr(model, "decoder", None)
    if not isinstance(blocks, torch.nn.ModuleList) or not all(
            isinstance(getattr(b, "self_attn", None), MultiHeadAttention) for b in blocks):
        return None
    return [b.self_attn for b in blocks]


def kv_cache_bytes_per_token(model) -> int | None:
    """Bytes the decoding cache grows by per generated token: every causal self-attention layer's keys and values
    (its key/value heads x head size x 2, or MLA's latent and rotary key) at the parameters' element size, a recurrent mixer's layer none (its
    state does not grow: :func:`recurrent_state_bytes`); None for a model without nas-run's attention modules
    (model=hf_*)."""
    found = _self_attention(model)
    if found is None:
        return None
    size = next(model.parameters()).element_size()
    return int(sum(m.cached_per_token() * size for m in found if not m.core.recurrent))


def windowed_cache_bytes(model) -> dict[str, int] | None:
    """With sliding-window layers (attention.window): ``{"per_token_beyond_windows": the growth per token once
    every window is full (the other layers' keys and values), "windows": the bytes the full windows hold}``;
    None without a windowed layer (the cache then grows by :func:`kv_cache_bytes_per_token` at every length)."""
    cached = [m for m in _self_attention(model) or [] if not m.core.recurrent]
    if all(getattr(m.core, "window", None) is None for m in cached):
        return None
    size = next(model.parameters()).element_size()
    per_token = {m: m.cached_per_token() * size for m in cached}
    return {"per_token_beyond_windows": int(sum(b for m, b in per_token.items() if m.core.window is None)),
            "windows": int(sum(b * m.core.window for m, b in per_token.items() if m.core.window is not None))}


def recurrent_state_bytes(model) -> int | None:
    """Bytes of the recurrent mixers' states per sequence (every layer whose core is one, at the parameters'
    element size): the same at every length; None where no layer has one."""
    found = [m for m in (_self_attention(model) or []) if m.core.recurrent]
    if not found:
        return None
    size = next(model.parameters()).element_size()
    return int(sum(m.core.state_numbers(m.d_head) * size for m in found))
