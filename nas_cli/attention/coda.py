"""CODA: cascaded head-colliding attention (Zheng et al. 2021), with its ablations.

Each head's logits are a Gaussian latent variable (Zheng et al. Sec. 4):

    z^l ~ N(mu^l, I),   a^l = softmax(z^l),
    mu^l = Q_h K_h^T / sqrt(d) + sigma(z^{l-1})                           (Eq. 4)

sigma is a small MLP over the *head* dimension with a residual link from its input
(Appendix A): at every (query, key) position the H logits of layer l-1 go through
H -> alpha*H -> H (paper: 2 layers, LeakyReLU, alpha in {2, 4, 8}; the released code:
H -> 4H -> 4H -> H, LeakyReLU(0.2), here ``mlp_layers: 3``), so
sigma(z) = z + MLP(z). It is neither shared across heads (it mixes them) nor across layers.
Prior and posterior share parameters, so the KL term cancels and training is ordinary
likelihood with reparameterized noise: z = mu + eps, eps ~ N(0, I) in training; the mean mu
in evaluation. The layer's z (its sample in training) is handed to the next layer at the
same location as ``aux["logits"]``; the model threads it per location (encoder self,
decoder self, cross), so the three cascades stay separate.

Ablations (Zheng et al. Table 4), the same class with other options:
    coda_cs     noise, no cascade (mu = QK^T / sqrt(d))             ``cascade: none``
    realformer  no noise, mu = QK^T / sqrt(d) + z^{l-1} (He et al.)  ``cascade: residual, noise_std: 0``

Masks: the cascade term is added to the *raw* logits of every (query, key) pair, padded or
future ones included (finite values computed from the padded/future q and k); the padding
and causal masks are applied only for the softmax. Masked logits therefore never reach the
next layer as -inf/NaN, and since sigma mixes heads at the same (i, j) only, entries that
are masked in layer l-1 only reach entries that are masked in layer l: the cascade adds
no leak and no padding dependence.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from nas_cli.attention.base import AttentionCore, check_choice, check_option, AttentionOutput, allowed_mask, masked_row_softmax, scaled_scores

CASCADES = ("mlp", "residual", "none")


class HeadMixer(nn.Module):
    """sigma(z) = z + MLP(z) over the head dimension: (B, H, Sq, Sk) -> (B, H, Sq, Sk).

    ``layers=2``: H -> alpha*H -> H (Zheng et al. App. A); ``layers=3``: H -> alpha*H ->
    alpha*H -> H (the released code, alpha = 4). LeakyReLU between layers."""

    def __init__(self, heads: int, alpha: int, layers: int, negative_slope: float):
        super().__init__()
        hidden = alpha * heads
        dims = [heads] + [hidden] * (layers - 1) + [heads]
        mods: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
            if i:
                mods.append(nn.LeakyReLU(negative_slope))
            mods.append(nn.Linear(a, b))
        self.mlp = nn.Sequential(*mods)

    @property
    def last(self) -> nn.Linear:
        return self.mlp[-1]

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        zt = z.permute(0, 2, 3, 1)  # (B, Sq, Sk, H): the paper's (B, m, n, H) layout
        return z + self.mlp(zt).permute(0, 3, 1, 2)


class CODA(AttentionCore):
    name = "coda"

    def __init__(self, heads: int, causal: bool = False, dropout: float = 0.0, cascade: str = "mlp",
                 noise_std: float = 1.0, alpha: int = 4, mlp_layers: int = 2, negative_slope: float = 0.2, **kw):
        super().__init__(heads, causal, dropout, **kw)
        check_choice("cascade", cascade, CASCADES)
        check_option("noise_std", noise_std, float(noise_std) >= 0, "be >= 0")
        check_option("alpha", alpha, int(alpha) >= 1, "be >= 1")
        check_option("mlp_layers", mlp_layers, int(mlp_layers) in (2, 3), "be 2 (paper) or 3 (released code)")
        self.cascade, self.noise_std = cascade, float(noise_std)
        self.alpha, self.mlp_layers = int(alpha), int(mlp_layers)
        #: the model hands this core the previous layer's output at the same location
        self.uses_prev = cascade != "none"
        self.mixer = HeadMixer(heads, self.alpha, self.mlp_layers, float(negative_slope)) if cascade == "mlp" else None

    def logits(self, q: torch.Tensor, k: torch.Tensor, prev_logits: torch.Tensor | None) -> torch.Tensor:
        """z^l (B, H, Sq, Sk): mean mu^l (Eq. 4), plus N(0, noise_std^2) noise in training."""
        z = scaled_scores(q, k)
        if prev_logits is not None and self.cascade != "none":
            if prev_logits.shape != z.shape:
                raise ValueError(f"{self.scheme_name()}: previous layer's logits have shape {tuple(prev_logits.shape)}, "
                                 f"this layer's {tuple(z.shape)}; the cascade needs the same location")
            z = z + (self.mixer(prev_logits) if self.cascade == "mlp" else prev_logits)
        if self.training and self.noise_std > 0:  # reparameterized sample z = mu + eps
            z = z + self.noise_std * torch.randn_like(z)
        return z

    def forward(self, q, k, v, q_mask=None, k_mask=None, need_weights=False, prev=None) -> AttentionOutput:
        prev_logits = prev.aux.get("logits") if prev is not None else None
        z = self.logits(q, k, prev_logits)
        allowed = allowed_mask(q_mask, k_mask, self.causal, q.size(-2), k.size(-2), q.device)
        w = masked_row_softmax(z, allowed)  # masks only here, after the cascade
        out = torch.matmul(F.dropout(w, self.dropout, self.training), v)  # (B, H, Sq, D)
        return AttentionOutput(out, w if need_weights else None, self.aux(z))

    def aux(self, z: torch.Tensor | None = None) -> dict[str, Any]:
        return {} if z is None else {"logits": z}

    def extra_repr(self) -> str:
        return (super().extra_repr() + f", cascade={self.cascade}, noise_std={self.noise_std}"
                + (f", alpha={self.alpha}, mlp_layers={self.mlp_layers}" if self.mixer is not None else ""))


class CODACS(CODA):
    """CODA-CS (Zheng et al. Table 4): head-colliding noise, no cascade."""

    name = "coda_cs"

    def __init__(self, heads: int, causal: bool = False, dropout: float = 0.0, cascade: str = "none",
                 noise_std: float = 1.0, **kw):
        super().__init__(heads, causal, dropout, cascade=cascade, noise_std=noise_std, **kw)


class RealFormer(CODA):
    """RealFormer (He et al. 2020) as in Zheng et al. Table 4: add layer l-1's logits, no noise, no MLP."""

    name = "realformer"

    def __init__(self, heads: int, causal: bool = False, dropout: float = 0.0, cascade: str = "residual",
                 noise_std: float = 0.0, **kw):
        super().__init__(heads, causal, dropout, cascade=cascade, noise_std=noise_std, **kw)
