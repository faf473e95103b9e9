"""``attention=flex``: softmax attention changed by a FlexAttention ``score_mod`` and ``mask_mod`` written elsewhere
(meta-pytorch/attention-gym's mods, or your own), named by their import path::

    nas-run task=copy_lm attention=flex attention.score_mod=mymods.relative_bias attention.mask_mod=mymods.prefix_lm

A mod has FlexAttention's signature (PyTorch's ``torch.nn.attention.flex_attention``):
``score_mod(score, b, h, q_idx, kv_idx) -> score`` and ``mask_mod(b, h, q_idx, kv_idx) -> bool``, on the scores
q_i . k_j / sqrt(d). A factory that makes one (attention-gym's ``generate_alibi_bias(H)``,
``generate_sliding_window(window_size)``) is called with ``attention.score_mod_kwargs`` /
``attention.mask_mod_kwargs`` when they are given.

* **On CUDA**, without the weights asked for: PyTorch's FlexAttention, compiled, with the mask_mod joined to the
  padding and (causal) j <= i in its block mask: the fused kernel, forward and backward.
* **Elsewhere** (the CPU, which has no FlexAttention backward; the weights for the diagnostics; one-query decoding
  steps): the same mods applied to the whole score tensor, with b, h, q_idx and kv_idx as index tensors shaped to
  broadcast against it ((B,1,1,1), (1,H,1,1), (1,1,Sq,1), (1,1,1,Sk)). For a mod written with elementwise tensor
  operations, as FlexAttention requires, that is what FlexAttention's vmap over (b, h, q_idx, kv_idx) computes.

A mask_mod can only take keys away: the causal mask and the padding are applied besides it, so no mod lets a
position see the future. Decoding steps give the newest query its position in the sequence.
"""
from __future__ import annotations

import functools
import importlib
from typing import Callable

import torch

from nas_cli.attention.base import SchemeError, check_option
from nas_cli.attention.unas import UNAS


def load_mod(option: str, path: str | None, kwargs: dict | None) -> Callable | None:
    """The function ``path`` names (``package.module.function`` or ``package.module:function``), or what it
    returns when called with ``kwargs`` (a factory); one line naming the option when it cannot be had."""
    if path is None:
        return None
    check_option(option, path, isinstance(path, str) and ("." in path or ":" in path),
                 "be an import path, package.module.function")
    module, _, name = path.rpartition(":") if ":" in path else path.rpartition(".")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise SchemeError(f"attention.{option}={path}: cannot be imported ({err}); give the import path of a "
                          "function on the Python path (a module of your own, or attention-gym's attn_gym.mods)") from None
    if kwargs is not None:
        try:
            fn = fn(**dict(kwargs))
        except TypeError as err:
            raise SchemeError(f"attention.{option}_kwargs={dict(kwargs)}: {path} does not take them ({err})") from None
    if not callable(fn):
        raise SchemeError(f"attention.{option}={path}: {type(fn).__name__} is not a function")
    return fn


class FlexMods(UNAS):
    name = "flex"
    #: the mods decide which keys a query sees: a sliding window is a mask_mod here, and ALiBi a score_mod
    takes_window = False
    takes_alibi = False

    def __init__(self, heads: int, causal: bool = False, dropout: float = 0.0, prefix_queries: bool = False,
                 location: str = "?", layer: int = 0, name: str | None = None, score_mod: str | None = None,
                 mask_mod: str | None = None, score_mod_kwargs: dict | None = None,
                 mask_mod_kwargs: dict | None = None, **score_options):
        super().__init__(heads, causal, dropout, prefix_queries, location, layer, name, **score_options)
        self.score_mod_path, self.mask_mod_path = score_mod, mask_mod
        self.score_mod = load_mod("score_mod", score_mod, score_mod_kwargs)
        self.mask_mod = load_mod("mask_mod", mask_mod, mask_mod_kwargs)

    @property
    def eager_scores(self) -> bool:  # the CPU and one-query steps: the mods on the score tensor
        return True

    def modded(self, scores: torch.Tensor, allowed: torch.Tensor | None, first: int):
        """The mods on (B, H, Sq, Sk) scores of the queries at positions first .. first + Sq - 1."""
        b, h, sq, sk = scores.shape
        dev = scores.device
        index = (torch.arange(b, device=dev)[:, None, None, None], torch.arange(h, device=dev)[None, :, None, None],
                 torch.arange(first, first + sq, device=dev)[None, None, :, None],
                 torch.arange(sk, device=dev)[None, None, None, :])
        if self.score_mod is not None:
            scores = self.score_mod(scores, *index).expand(b, h, sq, sk)
        if self.mask_mod is not None:
            keep = torch.as_tensor(self.mask_mod(*index), device=dev).to(torch.bool)
            allowed = keep if allowed is None else allowed & keep
        return scores, allowed

    def forward(self, q, k, v, q_mask=None, k_mask=None, need_weights=False, alibi=None):
        fused = q.device.type == "cuda" and self.softcap is None and self.sink is None and not (
            self.training and self.dropout > 0)  # FlexAttention has no attention dropout
        if need_weights or not fused:
            return self._eager(q, k, v, q_mask, k_mask, need_weights, alibi)
        from nas_cli.attention.base import AttentionOutput

        out = flex_forward(self, q, k, v, k_mask)
        if q_mask is not None:
            out = out * q_mask[:, None, :, None].to(out.dtype)
        return AttentionOutput(out, None, self.aux())

    def extra_repr(self) -> str:
        mods = "".join(f", {k}={v}" for k, v in (("score_mod", self.score_mod_path), ("mask_mod", self.mask_mod_path))
                       if v)
        return super().extra_repr() + mods


def flex_forward(core: FlexMods, q, k, v, k_mask) -> torch.Tensor:
    """PyTorch's FlexAttention with the core's mods, the padding and (causal) j <= i in one block mask; compiled on
    CUDA (elsewhere it runs eagerly, forward only: what the tests compare with the score-tensor path)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    user, causal = core.mask_mod, core.causal

    def mask_mod(b, h, qi, kj):
        keep = qi >= kj if causal else qi >= 0
        if k_mask is not None:
            keep = keep & k_mask[b, kj]
        return keep & user(b, h, qi, kj) if user is not None else keep

    block = create_block_mask(mask_mod, q.size(0), None, q.size(-2), k.size(-2), device=q.device)
    run = _compiled() if q.device.type == "cuda" else flex_attention
    return run(q, k, v, score_mod=core.score_mod, block_mask=block)


@functools.lru_cache(maxsize=1)
def _compiled():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=None)
