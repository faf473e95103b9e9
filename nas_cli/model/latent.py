"""Multi-head latent attention (MLA; DeepSeek-AI 2024, DeepSeek-V2 Sec. 2.1), ``model.mla``: the keys and values
of every head come from one compressed latent vector per position, and decoding caches that latent instead of the
heads' keys and values.

For an input h_t (d_model) and a head size D split into D - R "content" features and R rotary ones:

* c_KV = RMSNorm(W_DKV h_t) (``kv_rank`` features): the latent the cache keeps;
* k_C = W_UK c_KV, v = W_UV c_KV (every head's content keys and its values, up-projected from the latent);
* k_R = RoPE(W_KR h_t) (R features, one for all heads: the decoupled rotary key, also cached);
* queries from h_t directly (``q_rank`` null) or through their own latent c_Q = RMSNorm(W_DQ h_t), with the last R
  features of each head rotated;
* head i's key is [k_C,i ; k_R] and its query [q_C,i ; RoPE(q_R,i)], so the score is q_C . k_C + q_R . k_R.

RoPE is kept out of the latent so that position-free keys can be rebuilt from c_KV; without rotary positions
(``model.positions`` other than rope) R is 0 and every feature is a content feature. The projections have no bias,
as in DeepSeek-V2. The scheme's core receives the rebuilt queries, keys and values of every head, so the scheme is
unchanged; each decoding step rebuilds the keys and values from the cached latents (the "absorbed" form, which folds
W_UK into the queries, applies only to dot-product scores and is not used). The cache grows by kv_rank + R numbers
per token and layer, against 2 x heads x D for plain multi-head attention.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

EXAMPLE = "model.mla={kv_rank:64,q_rank:null,rope_dim:8}"


@dataclass(frozen=True)
class LatentSpec:
    kv_rank: int
    q_rank: int | None
    rope_dim: int

    @classmethod
    def from_option(cls, value, d_head: int, positions: str) -> "LatentSpec | None":
        """``model.mla``: null (none), true (the defaults) or {kv_rank, q_rank, rope_dim}, any of them left out at
        its default: kv_rank 4 x the head size (DeepSeek-V2's ratio), q_rank null (queries projected directly),
        rope_dim half the head size with rotary positions (0 without)."""
        if value is None or value is False:
            return None
        options = {} if value is True else value
        if not hasattr(options, "get"):
            raise ValueError(f"model.mla={value}: give true for the defaults or the latent sizes, e.g. {EXAMPLE}")
        unknown = sorted(set(options) - {"kv_rank", "q_rank", "rope_dim"})
        if unknown:
            raise ValueError(f"model.mla.{unknown[0]}: not an option of multi-head latent attention; it takes "
                             f"kv_rank, q_rank and rope_dim ({EXAMPLE})")
        rotary = positions == "rope"
        kv_rank, q_rank = options.get("kv_rank", 4 * d_head), options.get("q_rank")
        rope_dim = options.get("rope_dim", 2 * (d_head // 4) if rotary else 0)
        for name, size in (("kv_rank", kv_rank), ("q_rank", q_rank)):
            if size is not None and (not isinstance(size, int) or size < 1):
                raise ValueError(f"model.mla.{name}={size}: give the latent's size, a positive whole number "
                                 f"({EXAMPLE})")
        if kv_rank is None:
            raise ValueError(f"model.mla.kv_rank: the key/value latent needs a size ({EXAMPLE})")
        if not rotary and rope_dim:
            raise ValueError(f"model.mla.rope_dim={rope_dim}: the decoupled rotary features need "
                             f"model.positions=rope (got '{positions}'); leave rope_dim out or set it to 0")
        if rotary and (not isinstance(rope_dim, int) or rope_dim < 2 or rope_dim % 2 or rope_dim >= d_head):
            raise ValueError(f"model.mla.rope_dim={rope_dim}: with rotary positions MLA rotates a decoupled part of "
                             f"each query and key: give an even size from 2 to {d_head - 1} (the head size is "
                             f"{d_head})")
        return cls(int(kv_rank), None if q_rank is None else int(q_rank), int(rope_dim))

    def cached_per_token(self) -> int:
        """Numbers a layer's decoding cache grows by per token: the latent and the rotary key."""
        return self.kv_rank + self.rope_dim


class LatentProjections(nn.Module):
    """MLA's projections of one attention layer: queries (B, H, T, D), the cached entries ``{"c": c_KV (B, 1, T,
    kv_rank), "kr": k_R (B, 1, T, R)}`` and the keys and values (B, H, T, D) rebuilt from them."""

    def __init__(self, d_model: int, heads: int, d_head: int, spec: LatentSpec):
        super().__init__()
        self.heads, self.d_head, self.spec = heads, d_head, spec
        self.content = d_head - spec.rope_dim
        if spec.q_rank is None:
            self.q_down, self.q_norm = None, None
            self.q_up = nn.Linear(d_model, heads * d_head, bias=False)
        else:
            self.q_down = nn.Linear(d_model, spec.q_rank, bias=False)
            self.q_norm = nn.RMSNorm(spec.q_rank, eps=1e-6)
            self.q_up = nn.Linear(spec.q_rank, heads * d_head, bias=False)
        self.kv_down = nn.Linear(d_model, spec.kv_rank + spec.rope_dim, bias=False)  # [W_DKV; W_KR]
        self.kv_norm = nn.RMSNorm(spec.kv_rank, eps=1e-6)  # DeepSeek-V2's epsilon
        self.kv_up = nn.Linear(spec.kv_rank, heads * (self.content + d_head), bias=False)  # [W_UK; W_UV] per head

    def queries(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        latent = x if self.q_down is None else self.q_norm(self.q_down(x))
        return self.q_up(latent).view(b, t, self.heads, self.d_head).transpose(1, 2)

    def entries(self, x: torch.Tensor, rotate=None) -> dict:
        """What the cache keeps for the positions of x (B, T, C); ``rotate``: RoPE for the rotary key, or None."""
        b, t, _ = x.shape
        c, kr = self.kv_down(x).split([self.spec.kv_rank, self.spec.rope_dim], dim=-1)
        kr = kr.view(b, 1, t, self.spec.rope_dim)
        return {"c": self.kv_norm(c).view(b, 1, t, self.spec.kv_rank), "kr": kr if rotate is None else rotate(kr)}

    def keys_values(self, entries: dict) -> tuple[torch.Tensor, torch.Tensor]:
        c, kr = entries["c"], entries["kr"]
        b, _, t, _ = c.shape
        kv = self.kv_up(c[:, 0]).view(b, t, self.heads, self.content + self.d_head).transpose(1, 2)
        k_content, v = kv.split([self.content, self.d_head], dim=-1)
        return torch.cat([k_content, kr.expand(b, self.heads, t, self.spec.rope_dim)], dim=-1), v

    def rotate_queries(self, q: torch.Tensor, rotate) -> torch.Tensor:
        """Rotate the last R features of each head's queries only."""
        if not self.spec.rope_dim:
            return q
        return torch.cat([q[..., :self.content], rotate(q[..., self.content:])], dim=-1)
