"""The multi-head attention layer of nas-run's Transformer: the projections (plain, grouped-query or latent:
nas_cli/model/heads.py, nas_cli/model/latent.py), positions, the head split and the output projection around a
scheme's :class:`~nas_cli.attention.AttentionCore`, which computes the weights and the mixed values."""
from __future__ import annotations

import torch
from torch import nn

from nas_cli.attention import AttentionCore
from nas_cli.attention.positions import alibi_slopes, rotate, sinusoids
from nas_cli.model.heads import HeadSettings, expand
from nas_cli.model.latent import LatentProjections


class MultiHeadAttention(nn.Module):
    """Projections + head split around an attention core.

    Reads the core's declared contract (nas_cli/attention/base.py): ``tie_qk`` (no ``k_proj``
    is created, so the saved parameters are real), ``input_positions`` (sinusoids t of the
    query/key positions, 0..T-1 per sequence, added before the q/k or the value projection:
    v = (f + t) W_v, Tsai et al. Eq. 7), ``uses_prev``, and calls ``set_width(d_model)`` once.
    """

    def __init__(self, d_model: int, heads: int, core: AttentionCore, dropout: float = 0.0, positions: str = "",
                 settings: HeadSettings = HeadSettings()):
        super().__init__()
        self.heads, self.d_head = heads, d_model // heads
        #: the positions of self-attention (queries and keys at 0..T-1): rotary q and k (model.positions=rope),
        #: or ALiBi's per-head slopes handed to the core, which adds their bias to its scores (alibi)
        self.rotary = positions == "rope"
        self.rope_scaling = settings.rope_scaling if self.rotary else None
        self.register_buffer("alibi", alibi_slopes(heads) if positions == "alibi" else None, persistent=False)
        self.d_model = d_model
        self.tie_qk = bool(core.tie_qk)
        self.input_positions = frozenset(core.input_positions)
        #: grouped-query attention (model.kv_heads, nas_cli/model/heads.py): fewer key/value heads
        self.kv_heads = settings.kv_count(heads)
        if self.tie_qk and self.kv_heads != heads:
            raise ValueError(f"model.kv_heads={self.kv_heads}: scheme '{core.name}' ties its keys to its queries (one "
                             "projection), so it has as many key heads as query heads; leave model.kv_heads out")
        #: multi-head latent attention (model.mla, nas_cli/model/latent.py): keys and values from a cached latent
        self.latent = None if settings.latent is None else self._latent(core, settings.latent)
        #: the queries' and keys' features per head: the head size, or the scheme's own (Mamba-2's state size)
        self.d_qk = int(core.qk_width(self.d_head))
        if self.latent is not None and self.d_qk != self.d_head:
            raise ValueError(f"model.mla: scheme '{core.name}' asks for queries and keys of {self.d_qk} features per "
                             f"head, latent attention builds them at the head size {self.d_head}; leave one out")
        plain = self.latent is None
        self.q_proj = nn.Linear(d_model, heads * self.d_qk) if plain else None
        self.k_proj = nn.Linear(d_model, self.kv_heads * self.d_qk) if plain and not self.tie_qk else None
        self.v_proj = nn.Linear(d_model, self.kv_heads * self.d_head) if plain else None
        self.out_proj = nn.Linear(d_model, d_model)
        #: QK-norm (model.qk_norm): RMSNorm of each query and key head, a learned scale per feature
        self.q_norm = nn.RMSNorm(self.d_qk) if settings.qk_norm else None
        self.k_norm = (self.q_norm if self.tie_qk else nn.RMSNorm(self.d_qk)) if settings.qk_norm else None
        n = core.input_features(self.d_head)  # gated / forgetting attention: a projection of the input
        self.x_proj = nn.Linear(d_model, heads * n) if n else None
        core.set_width(d_model)
        self.core = core
        self.dropout = nn.Dropout(dropout)

    def _latent(self, core: AttentionCore, spec) -> LatentProjections:
        if self.tie_qk or self.input_positions:
            why = "ties its keys to its queries" if self.tie_qk else "adds positions to the inputs of its key and " \
                "value projections"
            raise ValueError(f"model.mla: scheme '{core.name}' {why}, while latent attention builds keys and values "
                             "from one latent; leave model.mla out for this scheme")
        return LatentProjections(self.d_model, self.heads, self.d_head, spec)

    @property
    def cache_names(self) -> tuple[str, str]:
        """The entries decoding caches per position: keys and values, or MLA's latent and rotary key."""
        return ("k", "v") if self.latent is None else ("c", "kr")

    def cached_per_token(self) -> int:
        """Numbers this layer's decoding cache grows by per token."""
        return self.kv_heads * (self.d_qk + self.d_head) if self.latent is None else self.latent.spec.cached_per_token()

    def _split(self, x: torch.Tensor, heads: int | None = None) -> torch.Tensor:  # (B, T, H * D) -> (B, H, T, D)
        b, t, c = x.shape
        heads = heads or self.heads
        return x.view(b, t, heads, c // heads).transpose(1, 2)

    def queries(self, x: torch.Tensor) -> torch.Tensor:
        if self.latent is not None:
            return self.latent.queries(x)
        q = self._split(self.q_proj(x))
        return q if self.q_norm is None else self.q_norm(q)

    def keys(self, x: torch.Tensor) -> torch.Tensor:  # (B, kv_heads, T, D): before expand()
        k = self._split((self.q_proj if self.tie_qk else self.k_proj)(x), self.kv_heads)
        return k if self.k_norm is None else self.k_norm(k)

    def values(self, x: torch.Tensor) -> torch.Tensor:  # (B, kv_heads, T, D): before expand()
        return self._split(self.v_proj(x), self.kv_heads)

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return rotate(x, positions, scaling=self.rope_scaling)

    def rotate_queries(self, q: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
        if positions is None:
            return q
        turn = lambda x: self.rotate(x, positions)  # noqa: E731
        return turn(q) if self.latent is None else self.latent.rotate_queries(q, turn)

    def kv_entries(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> dict:
        """What decoding caches for the positions of x (B, T, C), keyed by :attr:`cache_names`, rotated at
        ``positions`` (None: no rotary positions): keys and values (B, kv_heads, T, D), or MLA's latents."""
        turn = None if positions is None else (lambda y: self.rotate(y, positions))
        if self.latent is not None:
            return self.latent.entries(x, turn)
        k = self.keys(x)
        return {"k": k if turn is None else turn(k), "v": self.values(x)}

    def keys_values(self, entries: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """The cached entries -> the keys and values of every head (B, H, T, D) for the core."""
        if self.latent is not None:
            return self.latent.keys_values(entries)
        return expand(entries["k"], self.heads), expand(entries["v"], self.heads)

    def input_projection(self, x_q) -> dict:
        """``{"x": (B, H, Tq, n)}``, the projection of the query-side input a core asks for
        (:meth:`~nas_cli.attention.base.AttentionCore.input_features`), or {} when it asks for none."""
        return {} if self.x_proj is None else {"x": self._split(self.x_proj(x_q))}

    def project(self, x_q, x_kv):
        """(B, Tq, C), (B, Tk, C) -> q (B, H, Tq, D), k, v (B, kv_heads, Tk, D) (:func:`expand` makes them H),
        honouring the core's ``tie_qk`` and ``input_positions`` hooks and QK-norm."""
        xq_in, xk_in, xv_in = x_q, x_kv, x_kv
        if self.input_positions:
            t_kv = sinusoids(torch.arange(x_kv.size(1), device=x_kv.device), self.d_model).to(x_kv.dtype)
            if "qk" in self.input_positions:
                t_q = sinusoids(torch.arange(x_q.size(1), device=x_q.device), self.d_model).to(x_q.dtype)
                xq_in, xk_in = x_q + t_q, x_kv + t_kv
            if "v" in self.input_positions:
                xv_in = x_kv + t_kv
        return self.queries(xq_in), self.keys(xk_in), self.values(xv_in)

    def forward(self, x_q, x_kv, q_mask=None, k_mask=None, need_weights=False, prev=None):
        """``prev``: the previous layer's AttentionOutput at the same location, handed to
        cores that declare ``uses_prev = True`` (cascades such as CODA / RealFormer)."""
        if self.latent is not None:  # self-attention only (nas_cli/model/latent.py)
            pos = torch.arange(x_q.size(1), device=x_q.device) if self.rotary else None
            q, (k, v) = self.rotate_queries(self.queries(x_q), pos), self.keys_values(self.kv_entries(x_kv, pos))
        else:
            q, k, v = self.project(x_q, x_kv)
            if self.rotary:  # self-attention: queries and keys are the same positions 0..T-1
                pos = torch.arange(q.size(-2), device=q.device)
                q, k = self.rotate(q, pos), self.rotate(k, pos)
            k, v = expand(k, self.heads), expand(v, self.heads)
        extra = {"prev": prev} if self.core.uses_prev else {}
        extra.update(self.input_projection(x_q))
        if self.alibi is not None:
            extra["alibi"] = self.alibi
        res = self.core(q, k, v, q_mask=q_mask, k_mask=k_mask, need_weights=need_weights, **extra).declared_by(self.core)
        b, _, t, _ = res.out.shape
        out = res.out.transpose(1, 2).reshape(b, t, self.heads * self.d_head)  # (B, T, C)
        return self.dropout(self.out_proj(out)), res
