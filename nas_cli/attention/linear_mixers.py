"""Linear-attention token mixers with a recurrent state, beside softmax attention (causal self-attention only:
``attention.decoder=<name>`` or a language model's ``attention=<name>``); the state's computations are
nas_cli/attention/recurrent.py's.

* ``linear_attention`` (Katharopoulos et al. 2020, "Transformers are RNNs"): phi(x) = elu(x) + 1,
  o_t = phi(q_t)^T S_t / phi(q_t)^T z_t with S_t = sum_{s<=t} phi(k_s) v_s^T, z_t = sum_{s<=t} phi(k_s).
* ``deltanet`` (Schlag et al. 2021; Yang et al. 2024): the delta rule S_t = (I - beta_t k_t k_t^T) S_{t-1} +
  beta_t k_t v_t^T, o_t = S_t^T q_t, with q and k through SiLU and L2-normalized per head, q scaled by
  1/sqrt(d), and beta_t = sigmoid(w . x_t + b) per head from the layer's input (as flash-linear-attention's
  DeltaNet layer defaults, without its short convolution and output gate).
* ``gla`` (Yang et al., ICML 2024, "Gated Linear Attention Transformers with Hardware-Efficient Training"):
  S_t = diag(a_t) S_{t-1} + k_t v_t^T, o_t = S_t^T q_t with q scaled by 1/sqrt(d); a decay per key feature
  a_t = sigma(W2 W1 x_t + b)^(1/tau), tau = 16, through a rank-16 map (here W1 of rank 16 per head, the layer's
  projection ``x_proj``, and W2 per head).
* ``gated_deltanet`` (Yang, Kautz and Hatamizadeh, ICLR 2025): S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} +
  beta_t k_t v_t^T with the decay a_t = exp(-exp(A_h) softplus(w . x_t + dt_h)) (Mamba-2's parameterization;
  A_h = log U(1, 16), dt_h the inverse softplus of a log-uniform draw in [0.001, 0.1] at initialization).

* ``mamba2`` (Dao and Gu, ICML 2024): the SSD recurrence, a decay per head and the write scaled by its step dt,
  with C, B, x the core's q, k, v and a skip D x_t (:class:`Mamba2`).

Each state is d x d numbers per head (``state_numbers``), the same at every length: summary.json's
``recurrent_state_bytes``. The layers around them in their papers' blocks: ``attention.conv`` (a short
convolution of q, k and v, nas_cli/attention/short_conv.py) and ``attention.gate`` (the output gate and norm,
:class:`~nas_cli.attention.recurrent.RecurrentMixer`).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from nas_cli.attention.base import AttentionCore
from nas_cli.attention.recurrent import RecurrentMixer, implicit_weights


def _padded_out(q_mask, *tensors):
    """Zero at padded positions (a padded key writes nothing; its gates neither decay nor write)."""
    if q_mask is None:
        return tensors
    keep = q_mask[:, None, :]
    return tuple(None if t is None else t * (keep[..., None] if t.dim() == 4 else keep).to(t.dtype) for t in tensors)


def mamba_decay(heads: int, seed: int) -> tuple[nn.Parameter, nn.Parameter]:
    """Mamba-2's decay parameters per head, as its reference code initializes them: A_log with A = exp(A_log)
    uniform in [1, 16], and dt's bias, the inverse softplus of a log-uniform draw in [0.001, 0.1]."""
    g = torch.Generator().manual_seed(seed)
    a_log = torch.empty(heads).uniform_(1, 16, generator=g).log()
    dt = torch.exp(torch.empty(heads).uniform_(math.log(1e-3), math.log(0.1), generator=g))
    return nn.Parameter(a_log), nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus(dt_bias) = dt


class LinearAttention(RecurrentMixer, AttentionCore):
    name = "linear_attention"
    rows_sum_to_one = True
    nonnegative = True

    def __init__(self, heads: int, chunk: int = 64, **kw):
        super().__init__(heads, **kw)
        self.chunk = int(chunk)

    def state_numbers(self, d_head: int) -> int:  # S and the normalizer z
        return self.heads * d_head * (d_head + 1) + self._conv_numbers()

    def features(self, q, k, v, q_mask, x):
        phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
        v1 = torch.cat([v, torch.ones_like(v[..., :1])], -1)  # the normalizer z as one more value column
        phi_k, v1 = _padded_out(q_mask, phi_k, v1)
        return phi_q, phi_k, v1, None, None

    def finish(self, out, q, k, v, g, beta):
        return out[..., :-1] / out[..., -1:].clamp_min(torch.finfo(out.dtype).tiny)

    def implicit(self, q, k, g, beta):
        scores = (q @ k.transpose(-1, -2)).tril()
        return scores / scores.sum(-1, keepdim=True).clamp_min(torch.finfo(scores.dtype).tiny)


class DeltaNet(RecurrentMixer, AttentionCore):
    name = "deltanet"

    def __init__(self, heads: int, chunk: int = 64, **kw):
        super().__init__(heads, **kw)
        self.chunk = int(chunk)

    def mixer_features(self, d_head: int) -> int:
        return 1  # beta

    def _qk(self, q, k):
        d = q.size(-1)
        if self.short_conv is None:  # with the convolution, its SiLU is the one SiLU (flash-linear-attention's layer)
            q, k = F.silu(q), F.silu(k)
        return F.normalize(q, dim=-1) / math.sqrt(d), F.normalize(k, dim=-1)

    def features(self, q, k, v, q_mask, x):
        if x is None:
            raise ValueError(f"{self.name} needs the projection of its input x (the model's x_proj)")
        q, k = self._qk(q, k)
        beta = torch.sigmoid(x[..., 0].to(q.dtype))
        k, v, beta = _padded_out(q_mask, k, v, beta)
        return q, k, v, None, beta


class GatedDeltaNet(DeltaNet):
    name = "gated_deltanet"

    def mixer_features(self, d_head: int) -> int:
        return 2  # beta, and the decay's step

    def set_width(self, d_model: int) -> None:
        super().set_width(d_model)
        self.a_log, self.dt_bias = mamba_decay(self.heads, 1234 + self.layer)

    def features(self, q, k, v, q_mask, x):
        q, k, v, _, beta = super().features(q, k, v, q_mask, x)
        step = F.softplus(x[..., 1].to(q.dtype) + self.dt_bias[None, :, None].to(q.dtype))
        g = -self.a_log.exp()[None, :, None].to(q.dtype) * step
        (g,) = _padded_out(q_mask, g)
        return q, k, v, g, beta

    def learned(self) -> dict[str, torch.Tensor]:
        return {"decay_rate": self.a_log.exp()}


class GLA(RecurrentMixer, AttentionCore):
    name = "gla"
    #: the gate's rank per head (GLA's low-rank gate projection) and its temperature tau
    rank, tau = 16, 16.0

    def __init__(self, heads: int, chunk: int = 32, **kw):
        super().__init__(heads, **kw)
        self.chunk = int(chunk)

    def mixer_features(self, d_head: int) -> int:
        return self.rank

    def set_width(self, d_model: int) -> None:
        super().set_width(d_model)
        d = d_model // self.heads
        g = torch.Generator().manual_seed(4321 + self.layer)
        self.gate_up = nn.Parameter(torch.randn(self.heads, self.rank, d, generator=g) / math.sqrt(self.rank))
        self.gate_bias = nn.Parameter(torch.zeros(self.heads, d))

    def features(self, q, k, v, q_mask, x):
        if x is None:
            raise ValueError("gla needs the projection of its input x (the model's x_proj)")
        logits = torch.einsum("bhtr,hrd->bhtd", x.to(q.dtype), self.gate_up.to(q.dtype)) \
            + self.gate_bias.to(q.dtype)[None, :, None, :]
        g = F.logsigmoid(logits) / self.tau  # log a_t = log sigma(.) / tau
        k, v, g = _padded_out(q_mask, k, v, g)
        return q / math.sqrt(q.size(-1)), k, v, g, None


class Mamba2(RecurrentMixer, AttentionCore):
    """Mamba-2's state-space duality layer (SSD; Dao and Gu, ICML 2024, "Transformers are SSMs"), per head h:

        h_t = exp(dt_t A_h) h_{t-1} + dt_t B_t x_t^T,    y_t = C_t^T h_t + D_h x_t,    dt_t = softplus(w . u_t + b_h)

    with C, B and x the core's q, k and v (a B and C per head, Mamba-2's ngroups = heads; the state d x d per
    head), A_h = -exp(A_log) with A in [1, 16] at initialization, dt's bias the inverse softplus of a log-uniform
    draw in [0.001, 0.1], and D_h = 1 (the paper's reference code's initialization). The recurrence is linear
    attention's with a decay per head and the write scaled by dt (nas_cli/attention/recurrent.py); the D skip is
    added to the output. ``attention.state=N`` gives B and C N features per head (Mamba-2's d_state; the state
    N x d per head), null the head size; the short convolution (``attention.conv``) and the gate and norm
    (``attention.gate``) are the block's."""

    name = "mamba2"
    #: Mamba-2 gates before its norm: norm(y * silu(z)) (norm_before_gate=False in its reference code)
    norm_after_gate = True

    def __init__(self, heads: int, chunk: int = 64, state: int | None = None, **kw):
        super().__init__(heads, **kw)
        self.chunk = int(chunk)
        if state is not None and (not isinstance(state, int) or isinstance(state, bool) or state < 1):
            raise ValueError(f"attention.state must be null (the head size) or the state size N of B and C per "
                             f"head, a positive whole number (got {state!r})")
        #: N, the features of B and C per head (Mamba-2's d_state), or None: the head size
        self.state = state

    def qk_width(self, d_head: int) -> int:
        return d_head if self.state is None else self.state

    def mixer_features(self, d_head: int) -> int:
        return 1  # dt's projection

    def set_width(self, d_model: int) -> None:
        super().set_width(d_model)
        self.a_log, self.dt_bias = mamba_decay(self.heads, 2024 + self.layer)
        self.d_skip = nn.Parameter(torch.ones(self.heads))

    def features(self, q, k, v, q_mask, x):
        if x is None:
            raise ValueError("mamba2 needs the projection of its input x (the model's x_proj)")
        dt = F.softplus(x[..., 0].to(q.dtype) + self.dt_bias[None, :, None].to(q.dtype))  # (B, H, T)
        g = -self.a_log.exp()[None, :, None].to(q.dtype) * dt
        k, v, g = _padded_out(q_mask, k * dt[..., None], v, g)
        return q, k, v, g, None

    def finish(self, out, q, k, v, g, beta):  # the skip D x_t (x as the mixer reads it: convolved, 0 when padded)
        return out + self.d_skip[None, :, None, None].to(v.dtype) * v

    def forward(self, q, k, v, q_mask=None, k_mask=None, need_weights=False, x=None):
        res = super().forward(q, k, v, q_mask, k_mask, need_weights, x)
        if res.weights is not None and q_mask is not None:  # a padded position neither reads nor is read
            real = q_mask.to(res.weights.dtype)
            res.weights = res.weights * real[:, None, :, None] * real[:, None, None, :]
        return res

    def implicit(self, q, k, g, beta):
        """The SSD matrix C_i . (dt_j B_j) prod exp(dt A) over (j, i], with D_h on its diagonal: weights @ v is
        the output."""
        w = implicit_weights(q, k, g, beta)
        return w + torch.diag_embed(self.d_skip.to(w.dtype)[None, :, None].expand(w.shape[:-1]))

    def learned(self) -> dict[str, torch.Tensor]:
        return {"decay_rate": self.a_log.exp(), "skip": self.d_skip}
