"""Attention as a kernel smoother: Tsai et al. 2019, "Transformer Dissection".

    Attention(x_q; M(x_q, S)) = sum_{x_k in M} k(x_q, x_k) v(x_k) / sum_{x_k' in M} k(x_q, x_k')   (Eq. 2)

with x = (f, t): f the token feature, t the position. Three orthogonal options pick the
pieces of Eq. 2 (``conf/attention/kernel_*.yaml`` and ``pe_*.yaml``):

``kernel`` -- the kernel on features, on projected q = f W_q, k = f W_k (Table 2):
    exp         exp(<q, k> / sqrt(d))                        (Eq. 3; = standard attention)
    linear      <q, k>                                        (can be negative: did not converge)
    polynomial  <q, k>^degree  (degree 2 in the paper; computed on <q, k>/sqrt(d), the
                scale cancels in the normalization)
    rbf         exp(-||q - k||^2 / sqrt(d))
``symmetric`` -- W_q = W_k (a valid, symmetric kernel). Projections live in
    :class:`nas_cli.model.transformer.MultiHeadAttention`; this core sets ``tie_qk`` and the model
    then projects keys with the query projection (no ``k_proj`` is created).
``positions`` -- where the positional embedding t enters (Table 1):
    direct_sum         k(f_q + t_q, f_k + t_k) (Eq. 4): the model adds absolute positions at
                       the input (``model.positions=sinusoidal|learned``); nothing here.
    direct_sum_layer   the same sum, but this layer adds sinusoids to its own q/k input
                       (needs ``model.positions=none``); lets ``value_pe`` pick Eq. 7 or 8.
    lookup             L_{t_q - t_k, f_q} * k(f_q, f_k), L = exp(q . a_{clip(t_q - t_k)} / sqrt(d))
                       (Eq. 6, Shaw et al. 2018): a learned table a of 2 * max_distance + 1
                       vectors of size d_head, shared by the heads.
    product_xl         k(f_q, f_k) * k_{f_q}(t_q, t_k), log k_{f_q} = q . (r_{t_q - t_k} W_R) / sqrt(d)
                       with r the d_model sinusoid of the relative distance (Eq. 5, Transformer-XL
                       without its global biases).
    product_symmetric  k_F(f_q, f_k) * k_T(t_q, t_k), k_T = exp(<t_q W_T, t_k W_T> / sqrt(d)) with
                       t the absolute d_model sinusoid (Eq. 9, Tsai et al.); with symmetric=true
                       the attention has W_F (= W_q = W_k) and W_T: 33% fewer than W_q, W_K, W_R.
    All but direct_sum put position into the kernel and need ``model.positions=none``.
``value_pe`` -- v = (f + t) W_v (Eq. 7, true) or f W_v (Eq. 8, false; the default). The model
    adds the sinusoids before its value projection (``input_positions`` hook). With
    ``direct_sum`` the model's input already carries t, so it cannot be chosen there.

The set filter M is the mask: full for encoder self- and cross-attention, causal prefix for
decoder self-attention, padding removed everywhere. Every factor here depends on one
(query, key) pair only, so no scheme in this file aggregates over queries and all are causal.

Positional kernels are exponentials, so with exp/rbf the product is a sum of logits
followed by a masked softmax; with linear/polynomial the positional factor multiplies the
kernel values (after subtracting its row maximum, which cancels in the normalization).

The linear kernel (and an odd polynomial degree) can be negative, so its normalizer
sum_j k(q_i, k_j) can reach 0: its weights need not be >= 0 (``nonnegative = False``) and a
non-finite weight stops training with :class:`KernelDiverged`, naming the kernel.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from nas_cli.errors import NonFiniteLoss
from nas_cli.attention.positions import sinusoids
from nas_cli.attention.base import NEG_INF, AttentionCore, check_choice, check_option, AttentionOutput, allowed_mask, masked_row_softmax, scaled_scores

KERNELS = ("exp", "linear", "polynomial", "rbf")
POSITIONS = ("direct_sum", "direct_sum_layer", "lookup", "product_xl", "product_symmetric")


class KernelDiverged(NonFiniteLoss):
    """A kernel smoother whose normalizer reached 0 (or whose inputs were non-finite)."""


class KernelSmoother(AttentionCore):
    name = "kernel"
    carries_state = False  # each step: the query against the keys, nothing carried

    def __init__(self, heads: int, causal: bool = False, dropout: float = 0.0, kernel: str = "exp",
                 symmetric: bool = False, degree: int = 2, positions: str = "direct_sum", max_distance: int = 16,
                 value_pe: bool | None = None, **kw):
        super().__init__(heads, causal, dropout, **kw)
        check_choice("kernel", kernel, KERNELS)
        check_choice("positions", positions, POSITIONS)
        check_option("degree", degree, int(degree) >= 1, "be >= 1")
        check_option("max_distance", max_distance, int(max_distance) >= 0, "be >= 0")
        if positions == "direct_sum" and value_pe is not None:
            raise ValueError("attention.value_pe needs positions in the kernel: with attention.positions=direct_sum "
                             "the model adds positions at the input, so values already carry them; use "
                             "attention.positions=direct_sum_layer with model.positions=none to choose")
        self.kernel, self.positions = kernel, positions
        self.degree, self.max_distance = int(degree), int(max_distance)
        self.value_pe = bool(value_pe)
        # contract flags (nas_cli/attention/base.py) that follow the options: W_q = W_k,
        # sinusoids at a layer's input, positions placed by the kernel itself
        self.tie_qk = bool(symmetric)
        self.input_positions = frozenset(
            (("qk",) if positions == "direct_sum_layer" else ()) + (("v",) if self.value_pe else ()))
        self.requires_no_input_positions = positions != "direct_sum"
        #: exp/rbf are exp(logit): the smoother is a softmax. linear/polynomial are raw values.
        self.log_kernel = kernel in ("exp", "rbf")
        self.nonnegative = not (kernel == "linear" or (kernel == "polynomial" and self.degree % 2 == 1))
        # fused scaled_dot_product_attention when no positional factor sits in the kernel
        self.fused = self.log_kernel and positions in ("direct_sum", "direct_sum_layer")
        #: incremental decoding (``step``): with a positional factor the step would need the
        #: query's position, which the model's step does not pass
        self.supports_step = positions == "direct_sum"
        self.d_model: int | None = None

    # ---- parameters that depend on the model width -------------------------------------
    def set_width(self, d_model: int) -> None:
        """Create the positional parameters; MultiHeadAttention calls this at construction.
        (A core used on its own creates them at its first call, from q's head size.)"""
        if self.d_model is not None:
            return
        self.d_model = d_model
        d_head = d_model // self.heads
        if self.positions == "lookup":
            # Shaw et al.: one d_head vector per clipped relative distance, shared by the heads
            self.rel_table = nn.Parameter(torch.randn(2 * self.max_distance + 1, d_head) * d_head**-0.5)
        elif self.positions == "product_xl":
            self.w_r = nn.Linear(d_model, d_model, bias=False)  # W_R: relative sinusoid -> per-head key
        elif self.positions == "product_symmetric":
            self.w_t = nn.Linear(d_model, d_model, bias=False)  # W_T of Eq. 9

    def _ensure_width(self, q: torch.Tensor) -> None:
        if self.d_model is None and self.positions in ("lookup", "product_xl", "product_symmetric"):
            self.set_width(self.heads * q.size(-1))
            self.to(device=q.device, dtype=q.dtype)

    # ---- the kernel on features ---------------------------------------------------------
    def feature_logits(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """log k_F for exp and rbf: (B, H, Sq, D) x (B, H, Sk, D) -> (B, H, Sq, Sk)."""
        if self.kernel == "exp":
            return scaled_scores(q, k)  # Eq. 3
        # rbf: -||q - k||^2 / sqrt(d) = (2 q.k - |q|^2 - |k|^2) / sqrt(d); kept whole (symmetric)
        sq_dist = q.square().sum(-1)[..., :, None] + k.square().sum(-1)[..., None, :] - 2 * q @ k.transpose(-1, -2)
        return -sq_dist / math.sqrt(q.size(-1))

    def feature_kernel(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """k_F itself for linear and polynomial: (B, H, Sq, Sk), any sign for linear."""
        if self.kernel == "linear":
            return q @ k.transpose(-1, -2)
        return scaled_scores(q, k).pow(self.degree)

    # ---- the positional factor -----------------------------------------------------------
    def positional_logits(self, q: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        """log of the positional factor for integer positions q_pos (Sq,), k_pos (Sk,):
        (B|1, H, Sq, Sk), or None for direct sums (positions are in the features)."""
        if self.positions in ("direct_sum", "direct_sum_layer"):
            return None
        self._ensure_width(q)
        b, h, sq, d = q.shape
        scale = math.sqrt(d)
        rel = q_pos[:, None] - k_pos[None, :]  # (Sq, Sk) t_q - t_k
        if self.positions == "lookup":  # Eq. 6
            idx = rel.clamp(-self.max_distance, self.max_distance) + self.max_distance
            qa = torch.einsum("bhid,rd->bhir", q, self.rel_table.to(q.dtype)) / scale  # (B, H, Sq, 2K+1)
            return qa.gather(-1, idx.expand(b, h, sq, -1))
        if self.positions == "product_xl":  # Eq. 5: c = q W_R, dotted with r_{t_q - t_k}
            lo = int(rel.min())
            dists = torch.arange(lo, int(rel.max()) + 1, device=q.device)
            r = F.linear(sinusoids(dists, self.d_model).to(q.dtype), self.w_r.weight.to(q.dtype)).view(-1, h, d)
            qr = torch.einsum("bhid,lhd->bhil", q, r) / scale  # (B, H, Sq, L)
            return qr.gather(-1, (rel - lo).expand(b, h, sq, -1))
        # product_symmetric, Eq. 9: <t_q W_T, t_k W_T> / sqrt(d) per head
        w_t = self.w_t.weight.to(q.dtype)
        tq = F.linear(sinusoids(q_pos, self.d_model).to(q.dtype), w_t).view(-1, h, d).transpose(0, 1)  # (H, Sq, D)
        tk = F.linear(sinusoids(k_pos, self.d_model).to(q.dtype), w_t).view(-1, h, d).transpose(0, 1)  # (H, Sk, D)
        return (tq @ tk.transpose(-1, -2) / scale)[None]

    # ---- the smoother --------------------------------------------------------------------
    def kernel_weights(self, q, k, allowed, q_pos=None, k_pos=None) -> torch.Tensor:
        """Normalized kernel weights (B, H, Sq, Sk) of Eq. 2; positions default to 0..T-1."""
        if q_pos is None:
            q_pos = torch.arange(q.size(-2), device=q.device)
        if k_pos is None:
            k_pos = torch.arange(k.size(-2), device=k.device)
        pos = self.positional_logits(q, q_pos, k_pos)
        if self.log_kernel:
            logits = self.feature_logits(q, k)
            return masked_row_softmax(logits if pos is None else logits + pos, allowed)
        kern = self.feature_kernel(q, k)
        if pos is not None:  # exp(pos - row max over allowed keys): the max cancels below
            m = pos if allowed is None else pos.masked_fill(~allowed, NEG_INF)
            m = torch.nan_to_num(m.amax(-1, keepdim=True).detach(), neginf=0.0)
            kern = kern * torch.exp(pos - m)
        return self._normalize(kern, allowed, q, k)

    def _normalize(self, kern, allowed, q, k) -> torch.Tensor:
        """k_ij / sum_j' k_ij' over allowed keys; rows without an allowed key are 0."""
        if allowed is not None:
            kern = kern.masked_fill(~allowed, 0.0)
        denom = kern.sum(-1, keepdim=True)
        if allowed is not None:
            denom = torch.where(allowed.any(-1, keepdim=True), denom, torch.ones_like(denom))
        w = kern / denom
        if not bool(torch.isfinite(w).all()):
            raise KernelDiverged(self._divergence_message(q, k))
        return w

    def _divergence_message(self, q, k) -> str:
        where = f"{self.location} layer {self.layer}"
        if not (bool(torch.isfinite(q).all()) and bool(torch.isfinite(k).all())):
            cause = "its queries/keys were already non-finite (the run diverged)"
        else:
            cause = "the normalizer sum_j k(q_i, k_j) reached 0"
        paper = (" (the linear kernel can be negative; Tsai et al. 2019, Table 2: it did not converge)"
                 if self.kernel == "linear" else "")
        return (f"attention kernel '{self.kernel}' ({where}) produced non-finite attention weights: {cause}{paper}; "
                "choose attention.kernel=exp, rbf or polynomial (even degree), or lower optim.lr")

    def forward(self, q, k, v, q_mask=None, k_mask=None, need_weights=False) -> AttentionOutput:
        if not need_weights and self.fused:
            return AttentionOutput(self._fused(q, k, v, q_mask, k_mask))
        allowed = allowed_mask(q_mask, k_mask, self.causal, q.size(-2), k.size(-2), q.device)
        if not self.nonnegative:
            return self._signed_forward(q, k, v, allowed, need_weights)
        w = self.kernel_weights(q, k, allowed)
        out = torch.matmul(F.dropout(w, self.dropout, self.training), v)  # (B, H, Sq, D)
        return AttentionOutput(out, w if need_weights else None)

    def _signed_forward(self, q, k, v, allowed, need_weights) -> AttentionOutput:
        """A signed kernel (linear, odd polynomial) in float64. Its normalizer sum_j k_ij adds
        terms of both signs and can be far smaller than the terms (so can the weighted sum of
        v), and rounding of the terms is amplified by sum_j |k_ij| / |sum_j k_ij|; float64 removes
        the rounding this core adds. (The same factor amplifies differences in its float32
        inputs: such a model is ill-conditioned, e.g. padding changes outputs by ~1e-3.)"""
        with torch.autocast(device_type=q.device.type, enabled=False):
            w = self.kernel_weights(q.double(), k.double(), allowed)
            out = torch.matmul(F.dropout(w, self.dropout, self.training), v.double())  # (B, H, Sq, D)
        return AttentionOutput(out.to(v.dtype), w.to(v.dtype) if need_weights else None)

    def step(self, q, k, v, k_mask, state):
        """Incremental decoding: the newest query (B, H, 1, D) against the cached keys so far;
        equals that row of ``forward`` (every factor here depends on one (query, key) pair)."""
        allowed = None if k_mask is None else k_mask[:, None, None, :]
        if not self.nonnegative:
            return self._signed_forward(q, k, v, allowed, False).out, None
        return torch.matmul(self.kernel_weights(q, k, allowed), v), None

    def _fused(self, q, k, v, q_mask, k_mask) -> torch.Tensor:
        """scaled_dot_product_attention for exp (= UNAS) and rbf without positional factor.

        rbf: -||q - k||^2 / sqrt(d) = 2 q.k / sqrt(d) - |k|^2 / sqrt(d) - |q|^2 / sqrt(d); the last
        term is constant over keys and cancels in the softmax, so rbf is SDPA with scale
        2 / sqrt(d) and an additive per-key bias -|k_j|^2 / sqrt(d)."""
        sq, sk = q.size(-2), k.size(-2)
        mask = k_mask[:, None, None, :] if k_mask is not None else None  # (B, 1, 1, Sk)
        if self.causal and mask is not None:
            mask = mask & torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril()
        drop = self.dropout if self.training else 0.0
        if self.kernel == "exp":
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop,
                                                 is_causal=self.causal and mask is None)
        else:
            bias = -k.square().sum(-1)[:, :, None, :] / math.sqrt(q.size(-1))  # (B, H, 1, Sk)
            if self.causal and mask is None:
                mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril()
            if mask is not None:
                bias = bias.masked_fill(~mask, NEG_INF)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.expand(-1, -1, sq, -1), dropout_p=drop,
                                                 scale=2 / math.sqrt(q.size(-1)))
        if q_mask is not None:  # padded queries give zeros, as in the weights path
            out = out * q_mask[:, None, :, None].to(out.dtype)
        return out

    def extra_repr(self) -> str:
        return (super().extra_repr() + f", kernel={self.kernel}, symmetric={self.tie_qk}, positions={self.positions}"
                + (f", degree={self.degree}" if self.kernel == "polynomial" else "")
                + (f", max_distance={self.max_distance}" if self.positions == "lookup" else "")
                + f", value_pe={self.value_pe}")
