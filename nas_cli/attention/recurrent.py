"""The computations shared by nas-run's recurrent token mixers (linear attention, DeltaNet, Gated DeltaNet): a
state S (B, H, d_k, d_v) read by each query as o_t = S_t^T q_t, written by each key and value.

* :func:`recurrence`: the definition itself, one position at a time (the reference: tests check the chunked
  form against it in float64), also the one-token decoding step;
* :func:`chunked`: the same outputs in chunks of ``chunk`` positions: within a chunk by matrix products over
  its positions, across chunks through the state (Yang et al. 2024, "Parallelizing Linear Transformers with the
  Delta Rule over Sequence Length": the delta rule's chunk written with the WY/UT representation
  T = (I + tril(diag(beta) (K K^T * Gamma), -1))^-1).

The update of all three, with log-decay g_t (0: no decay) and write strength beta_t (None: the additive rule of
linear attention, S_t = a_t S_{t-1} + k_t v_t^T):

    S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,    a_t = exp(g_t)
"""
from __future__ import annotations

import torch


def recurrence(q, k, v, g=None, beta=None, state=None):
    """Outputs (B, H, T, d_v) and the last state, one position at a time. q, k (B, H, T, d_k), v (B, H, T, d_v);
    g, beta (B, H, T) or None; state (B, H, d_k, d_v) or None (zeros)."""
    b, h, t, dk = k.shape
    s = k.new_zeros(b, h, dk, v.size(-1)) if state is None else state
    out = []
    for i in range(t):
        ki, vi = k[:, :, i], v[:, :, i]
        if g is not None:  # a decay per head (B, H, T), or per key feature (B, H, T, d_k): GLA's
            s = s * (g[:, :, i].exp()[..., None, None] if g.dim() == 3 else g[:, :, i].exp()[..., :, None])
        if beta is None:
            s = s + ki[..., :, None] * vi[..., None, :]
        else:
            bi = beta[:, :, i][..., None]
            old = torch.einsum("bhk,bhkv->bhv", ki, s)  # what the state holds at k_t now
            s = s + ki[..., :, None] * (bi * (vi - old))[..., None, :]
        out.append(torch.einsum("bhk,bhkv->bhv", q[:, :, i], s))
    return torch.stack(out, dim=2), s


def _decays(g, c: int):
    """Within-chunk cumulative log-decay G (B, H, n, c) and Gamma_ij = exp(G_i - G_j) for j <= i, else 0."""
    cum = g.cumsum(-1)
    diff = cum[..., :, None] - cum[..., None, :]
    lower = torch.ones(c, c, dtype=torch.bool, device=g.device).tril()
    return cum, torch.where(lower, diff, torch.full_like(diff, float("-inf"))).exp()


def chunked(q, k, v, g=None, beta=None, state=None, chunk: int = 64):
    """:func:`recurrence`'s outputs and last state, ``chunk`` positions at a time (the sequence padded with
    positions that change nothing: k = v = 0, g = 0, beta = 0). A decay per key feature (g of (B, H, T, d_k))
    goes to :func:`chunked_per_feature`."""
    if g is not None and g.dim() == 4:
        return chunked_per_feature(q, k, v, g, state, chunk)
    b, h, t, dk = k.shape
    dv = v.size(-1)
    c = max(1, min(chunk, t))
    pad = (-t) % c
    if pad:
        q, k, v = (torch.nn.functional.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g = None if g is None else torch.nn.functional.pad(g, (0, pad))
        beta = None if beta is None else torch.nn.functional.pad(beta, (0, pad))
    n = (t + pad) // c
    q, k, v = (x.reshape(b, h, n, c, x.size(-1)) for x in (q, k, v))
    gg = torch.zeros(b, h, n, c, dtype=q.dtype, device=q.device) if g is None else g.reshape(b, h, n, c)
    cum, gamma = _decays(gg, c)  # (B, H, n, c), (B, H, n, c, c)
    strict = torch.ones(c, c, dtype=torch.bool, device=q.device).tril(-1)
    if beta is None:  # additive: the pseudo-values are the values themselves
        u, w = v, None
    else:
        bt = beta.reshape(b, h, n, c)
        a = (k @ k.transpose(-1, -2)) * gamma * bt[..., :, None]
        a = torch.where(strict, a, torch.zeros_like(a))
        eye = torch.eye(c, dtype=q.dtype, device=q.device)
        tmat = torch.linalg.solve_triangular(eye + a, torch.diag_embed(bt), upper=False)  # (I + A)^-1 diag(beta)
        u = tmat @ v
        w = tmat @ (k * cum.exp()[..., None])
    s = k.new_zeros(b, h, dk, dv) if state is None else state
    scores = (q @ k.transpose(-1, -2)) * gamma  # (B, H, n, c, c), zero above the diagonal
    out = []
    for i in range(n):
        ui = u[:, :, i] if w is None else u[:, :, i] - w[:, :, i] @ s
        decay = cum[:, :, i].exp()[..., None]  # (B, H, c, 1)
        out.append((q[:, :, i] * decay) @ s + scores[:, :, i] @ ui)
        last = cum[:, :, i, -1:]  # (B, H, 1)
        s = s * last.exp()[..., None] + (k[:, :, i] * (last - cum[:, :, i]).exp()[..., None]).transpose(-1, -2) @ ui
    o = torch.stack(out, dim=2).reshape(b, h, n * c, dv)[:, :, :t]
    return o, s


def chunked_per_feature(q, k, v, g, state=None, chunk: int = 64):
    """The additive rule with a decay per key feature, S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T (GLA), in chunks:
    within a chunk the scores sum_d q_id k_jd exp(G_id - G_jd) over the lower triangle (a (c, c, d_k) tensor),
    across chunks the state."""
    b, h, t, dk = k.shape
    c = max(1, min(chunk, t))
    pad = (-t) % c
    if pad:
        q, k, v, g = (torch.nn.functional.pad(x, (0, 0, 0, pad)) for x in (q, k, v, g))
    n = (t + pad) // c
    q, k, v, g = (x.reshape(b, h, n, c, x.size(-1)) for x in (q, k, v, g))
    cum = g.cumsum(-2)  # (B, H, n, c, d_k)
    lower = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    diff = cum[..., :, None, :] - cum[..., None, :, :]  # (B, H, n, c, c, d_k)
    decay = torch.where(lower[..., None], diff, torch.full_like(diff, float("-inf"))).exp()
    scores = torch.einsum("bhnid,bhnjd,bhnijd->bhnij", q, k, decay)
    s = k.new_zeros(b, h, dk, v.size(-1)) if state is None else state
    out = []
    for i in range(n):
        out.append((q[:, :, i] * cum[:, :, i].exp()) @ s + scores[:, :, i] @ v[:, :, i])
        last = cum[:, :, i, -1]  # (B, H, d_k)
        s = s * last.exp()[..., None] + (k[:, :, i] * (last[..., None, :] - cum[:, :, i]).exp()).transpose(-1, -2) \
            @ v[:, :, i]
    return torch.stack(out, dim=2).reshape(b, h, n * c, -1)[:, :, :t], s


def implicit_weights(q, k, g=None, beta=None):
    """The (B, H, T, T) matrix A with outputs A v (the whole sequence as one chunk from a zero state): the mixer's
    implicit attention, lower triangular; for diagnostics."""
    t = k.size(-2)
    if g is not None and g.dim() == 4:  # a decay per key feature (GLA)
        cum = g.cumsum(-2)
        lower = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
        diff = cum[..., :, None, :] - cum[..., None, :, :]
        decay = torch.where(lower[..., None], diff, torch.full_like(diff, float("-inf"))).exp()
        return torch.einsum("bhid,bhjd,bhijd->bhij", q, k, decay)
    cum, gamma = _decays(torch.zeros(q.shape[:-1], dtype=q.dtype, device=q.device) if g is None else g, t)
    scores = (q @ k.transpose(-1, -2)) * gamma
    if beta is None:
        return scores
    strict = torch.ones(t, t, dtype=torch.bool, device=q.device).tril(-1)
    a = torch.where(strict, (k @ k.transpose(-1, -2)) * gamma * beta[..., :, None], torch.zeros_like(scores))
    eye = torch.eye(t, dtype=q.dtype, device=q.device)
    return scores @ torch.linalg.solve_triangular(eye + a, torch.diag_embed(beta), upper=False)


class RecurrentMixer:
    """Mixin of the recurrent token mixers' cores (with :class:`~nas_cli.attention.base.AttentionCore`): the
    sequence forward in chunks, the one-token step on the state alone (``recurrent``: the decoding cache keeps
    the state, not the keys and values), the implicit attention matrix for diagnostics (neither a distribution
    over keys nor non-negative in general). A subclass gives :meth:`features`: the feature-mapped q, k, v and
    its log-decay g and write strength beta (None where the rule has none), padded keys writing nothing."""

    causal_self_only = True
    supports_step = True
    carries_state = True
    recurrent = True
    rows_sum_to_one = False
    nonnegative = False
    #: positions per chunk of the sequence forward (attention.chunk)
    chunk: int = 64

    #: the output gate's order: norm(o) * silu(g) (False: DeltaNet's and GLA's layers), or norm(o * silu(g)) (Mamba-2)
    norm_after_gate = False

    def __init__(self, heads: int, conv: int | None = None, gate: bool = False, **kw):
        super().__init__(heads, **kw)
        if conv is not None and (not isinstance(conv, int) or isinstance(conv, bool) or conv < 2):
            raise ValueError(f"attention.conv must be null (none) or a kernel of at least 2 positions (got {conv!r})")
        if not isinstance(gate, bool):
            raise ValueError(f"attention.gate must be true or false (got {gate!r})")
        #: the short convolution's kernel (attention.conv, nas_cli/attention/short_conv.py), or None
        self.conv = conv
        self.short_conv = None
        #: the output gate and norm of the papers' layers (attention.gate): silu of a projection of the input
        self.gate = gate
        self.gate_norm = None

    def set_width(self, d_model: int) -> None:
        d = d_model // self.heads
        if self.conv:
            from nas_cli.attention.short_conv import ShortConv

            self.short_conv = ShortConv(self.heads, d, self.conv, widths=[self.qk_width(d)] * 2 + [d])
        if self.gate:
            self.gate_norm = torch.nn.RMSNorm(d, eps=1e-5)
        super().set_width(d_model)

    def mixer_features(self, d_head: int) -> int:
        """Features per head of the input projection the mixer's rule reads (a write strength, a decay)."""
        return 0

    def input_features(self, d_head: int) -> int:
        return self.mixer_features(d_head) + (d_head if self.gate else 0)

    def _split(self, x):
        """(the rule's part of the input projection, the gate's) of ``x``."""
        if not self.gate or x is None:
            return x, None
        n = x.size(-1) - self.gate_norm.normalized_shape[0]
        return (x[..., :n] if n else None), x[..., n:]

    def _gated(self, out, gate):
        if gate is None:
            return out
        g = torch.nn.functional.silu(gate.to(out.dtype))
        weight, eps = self.gate_norm.weight.to(out.dtype), self.gate_norm.eps

        def norm(t):
            return torch.nn.functional.rms_norm(t, weight.shape, weight, eps)

        return norm(out * g) if self.norm_after_gate else norm(out) * g

    def features(self, q, k, v, q_mask, x):
        raise NotImplementedError

    def state_numbers(self, d_head: int) -> int:
        """Numbers in one layer's state per sequence: heads x d_k x d_v (and the convolution's last inputs)."""
        return self.heads * self.qk_width(d_head) * d_head + self._conv_numbers()

    def _conv_numbers(self) -> int:
        return 0 if self.short_conv is None else self.short_conv.numbers()

    def finish(self, out, q, k, v, g, beta):
        """The outputs from the state's reads (linear attention divides by its normalizer here; Mamba-2 adds
        its skip of the values)."""
        return out

    def _mixed(self, q, k, v, q_mask, x):
        wide = torch.promote_types(q.dtype, torch.float32)
        q, k, v, g, beta = self.features(q.to(wide), k.to(wide), v.to(wide), q_mask, x)
        return q, k, v, g, beta

    def forward(self, q, k, v, q_mask=None, k_mask=None, need_weights=False, x=None):
        from nas_cli.attention.base import AttentionOutput

        dtype = v.dtype
        x, gate = self._split(x)
        if self.short_conv is not None:
            q, k, v = self.short_conv.sequence([q, k, v], q_mask)
        qf, kf, vf, g, beta = self._mixed(q, k, v, q_mask, x)
        out, _ = chunked(qf, kf, vf, g, beta, chunk=self.chunk)
        out = self._gated(self.finish(out, qf, kf, vf, g, beta), gate)
        weights = self.implicit(qf, kf, g, beta) if need_weights else None
        if q_mask is not None:
            out = out * q_mask[:, None, :, None].to(out.dtype)
        return AttentionOutput(out.to(dtype), weights, self.aux())

    def implicit(self, q, k, g, beta):
        return implicit_weights(q, k, g, beta)

    def step(self, q, k, v, k_mask, state, x=None):
        """The newest position's output from the state; ``k``, ``v`` may hold every key so far (the last is new).
        With a short convolution the state is (the mixer's, the convolution's last inputs)."""
        q1, k1, v1 = q, k[..., -1:, :], v[..., -1:, :]
        x, gate = self._split(x)
        if self.short_conv is not None:
            state, kept = state if state is not None else (None, None)
            (q1, k1, v1), kept = self.short_conv.step([q1, k1, v1], kept)
        qf, kf, vf, g, beta = self._mixed(q1, k1, v1, None, x)
        out, state = recurrence(qf, kf, vf, g, beta, state)
        out = self._gated(self.finish(out, qf, kf, vf, g, beta), gate).to(v.dtype)
        return out, (state if self.short_conv is None else (state, kept))
