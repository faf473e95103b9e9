"""Settings of nas-run's attention heads that today's models combine with any scheme, applied around the
scheme's core (nas_cli/model/transformer.py's MultiHeadAttention), so every scheme takes them unchanged:

* ``model.kv_heads``: grouped-query attention (Ainslie et al. 2023; multi-query with 1, Shazeer 2019): the keys
  and values have ``kv_heads`` heads, each shared by ``heads / kv_heads`` query heads (repeated for the core);
  the decoding cache keeps them unrepeated, which is what GQA is for (``nas_cli.model.memory.kv_cache_bytes_per_token``).
* ``model.qk_norm``: RMSNorm of each query and key head over its features, with a learned scale per feature,
  before rotary positions (as OLMo 2 and Gemma 3 place it).
* ``model.rope_scaling``: rotary positions for contexts longer than the trained one
  (``{type, factor, original_max_len}``): ``linear`` position interpolation (Chen et al. 2023: every frequency
  divided by the factor), ``ntk`` (NTK-aware: the base raised to ``base * factor ** (d / (d - 2))``, bloc97
  2023), ``yarn`` (Peng et al. 2023: frequencies whose wavelength fits ``beta_fast`` (32) times or more in the
  original context kept, those fitting ``beta_slow`` (1) times or fewer interpolated, a linear ramp over the
  dimensions between, rounded to whole dimensions as the authors' code does; and the attention temperature
  ``sqrt(1/t) = 0.1 ln(factor) + 1`` applied to the rotated queries and keys).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from nas_cli.model.latent import LatentSpec

#: the values of model.rope_scaling.type
ROPE_SCALINGS = ("linear", "ntk", "yarn")


@dataclass(frozen=True)
class RopeScaling:
    kind: str
    factor: float
    original_max_len: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0

    @classmethod
    def from_option(cls, value) -> "RopeScaling | None":
        if value is None:
            return None
        example = "model.rope_scaling={type:yarn,factor:4,original_max_len:256}"
        if not hasattr(value, "get"):
            raise ValueError(f"model.rope_scaling={value}: give the type, the factor and the trained length, e.g. "
                             f"{example} (or null for none)")
        kind, factor, original = value.get("type"), value.get("factor"), value.get("original_max_len")
        if kind not in ROPE_SCALINGS:
            raise ValueError(f"model.rope_scaling.type={kind}: choose one of {', '.join(ROPE_SCALINGS)} ({example})")
        if not isinstance(factor, (int, float)) or factor < 1:
            raise ValueError(f"model.rope_scaling.factor={factor}: give the context's growth, at least 1 ({example})")
        if not isinstance(original, int) or original < 1:
            raise ValueError(f"model.rope_scaling.original_max_len={original}: give the length the rotary "
                             f"frequencies were trained at, in tokens ({example})")
        return cls(str(kind), float(factor), int(original), float(value.get("beta_fast", 32.0)),
                   float(value.get("beta_slow", 1.0)))

    def frequencies(self, d: int, base: float) -> tuple[torch.Tensor, float]:
        """The inverse frequencies (d/2,) in float64 and the factor applied to cos and sin."""
        exponents = torch.arange(0, d, 2, dtype=torch.float64) / d
        plain = base ** -exponents
        if self.kind == "linear":
            return plain / self.factor, 1.0
        if self.kind == "ntk":
            return (base * self.factor ** (d / (d - 2))) ** -exponents, 1.0

        def dimension(rotations: float) -> float:  # the dimension whose wavelength fits `rotations` times
            return d * math.log(self.original_max_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low = max(math.floor(dimension(self.beta_fast)), 0)
        high = min(math.ceil(dimension(self.beta_slow)), d - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        keep = 1 - ramp  # 1: the frequency kept (extrapolated), 0: interpolated
        inv = plain / self.factor * (1 - keep) + plain * keep
        return inv, (0.1 * math.log(self.factor) + 1.0) if self.factor > 1 else 1.0


@dataclass(frozen=True)
class HeadSettings:
    kv_heads: int | None = None
    qk_norm: bool = False
    rope_scaling: RopeScaling | None = None
    latent: LatentSpec | None = None

    @classmethod
    def from_options(cls, heads: int, kv_heads=None, qk_norm=False, rope_scaling=None,
                     positions: str = "", mla=None, d_head: int = 0) -> "HeadSettings":
        if kv_heads is not None and (not isinstance(kv_heads, int) or kv_heads < 1 or heads % kv_heads):
            raise ValueError(f"model.kv_heads={kv_heads} must divide model.heads={heads} (each key/value head "
                             f"serves heads / kv_heads query heads): choose from "
                             f"{[k for k in range(1, heads + 1) if heads % k == 0]}, or null for one per query head")
        scaling = RopeScaling.from_option(rope_scaling)
        if scaling is not None and positions != "rope":
            raise ValueError(f"model.rope_scaling scales rotary positions: it needs model.positions=rope (got "
                             f"'{positions}')")
        latent = LatentSpec.from_option(mla, d_head, positions)
        if latent is not None:
            _check_latent(kv_heads, heads, qk_norm, scaling)
        return cls(None if kv_heads in (None, heads) else int(kv_heads), bool(qk_norm), scaling, latent)

    def kv_count(self, heads: int) -> int:
        return self.kv_heads or heads


def _check_latent(kv_heads, heads: int, qk_norm, scaling: RopeScaling | None) -> None:
    """The settings that multi-head latent attention replaces or cannot take."""
    if kv_heads not in (None, heads):
        raise ValueError(f"model.kv_heads={kv_heads} with model.mla: latent attention already shrinks the cache (one "
                         "latent per position instead of key/value heads); choose one of the two")
    if qk_norm:
        raise ValueError("model.qk_norm=true with model.mla: latent attention normalizes its latents (RMSNorm of "
                         "c_KV and c_Q) instead of each head's queries and keys; choose one of the two")
    if scaling is not None and scaling.kind == "yarn":
        raise ValueError("model.rope_scaling.type=yarn with model.mla: YaRN's temperature scales whole scores, while "
                         "MLA rotates only a decoupled part of each head; use type linear or ntk")


def expand(x: torch.Tensor, heads: int) -> torch.Tensor:
    """Keys or values (B, kv_heads, T, D) -> (B, heads, T, D): each key/value head for its group of query heads
    (query head h reads key/value head h // (heads / kv_heads))."""
    kv = x.size(1)
    return x if kv == heads else x.repeat_interleave(heads // kv, dim=1)
