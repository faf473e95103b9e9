"""The attention-core contract every scheme implements.

A core receives already-projected queries, keys and values of shape ``(B, H, T, D)``
plus masks, and returns the mixed values (and, when asked, the attention weights).
Projections, head splitting and the output projection live in
:class:`nas_cli.model.transformer.MultiHeadAttention`; a scheme only decides how scores become
weights.

Registration is by config: ``conf/attention/<name>.yaml`` names the class with
``_target_``. There is no central list; adding a scheme is one file here plus one
YAML file there, and the contract tests in ``tests/attention/test_attention_contract.py`` pick it
up automatically, filtered by the capability flags the class declares.

Mask conventions (used by every scheme):

* ``q_mask`` ``(B, Sq)`` and ``k_mask`` ``(B, Sk)`` are boolean, ``True`` for real
  tokens. ``None`` means no padding.
* ``causal=True`` means query ``i`` may only use keys ``j <= i`` (self-attention in a
  decoder or language model, where queries and keys are the same positions). It
  implies ``prefix_queries``.
* ``prefix_queries=True`` means the queries are generated left to right (decoder
  self- *and* cross-attention): anything a scheme aggregates over queries (DNAS's
  column step) may only use queries ``i' <= i`` for query ``i``. Without it, DNAS in
  cross-attention would leak future target tokens through the column normalizer.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch
from torch import nn

NEG_INF = float("-inf")

#: a location as refusals name it
_PLAIN = MappingProxyType({"encoder": "encoder's self-attention", "decoder": "decoder's self-attention",
                           "cross": "cross-attention"})


class SchemeError(ValueError):
    """A scheme was asked for something it cannot do (raised before training)."""


@dataclass
class AttentionOutput:
    out: torch.Tensor  # (B, H, Sq, D)
    weights: torch.Tensor | None = None  # (B, H, Sq, Sk): what each query gives each key (see the flags below)
    aux: dict[str, Any] = field(default_factory=dict)  # e.g. HNAS ``u`` (H,)
    #: what the core declares of its weights (:attr:`AttentionCore.rows_sum_to_one`, ``nonnegative``);
    #: the model copies the declaration here, and the diagnostics read it (nas_cli/diagnostics/metrics.py)
    rows_sum_to_one: bool = True
    nonnegative: bool = True
    weight_max: float = 1.0

    def declared_by(self, core: "AttentionCore") -> "AttentionOutput":
        self.rows_sum_to_one, self.nonnegative = bool(core.rows_sum_to_one), bool(core.nonnegative)
        self.weight_max = float(core.weight_max)
        return self


def check_option(key: str, value, ok: bool, must: str) -> None:
    """A scheme option's one-line error: ``attention.<key> must <must> (got <value>)``."""
    if not ok:
        raise ValueError(f"attention.{key} must {must} (got {value!r})")


def check_choice(key: str, value, choices) -> None:
    check_option(key, value, value in choices, f"be one of {', '.join(choices)}")


def scaled_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """s_ij = q_i . k_j / sqrt(d_head); (B, H, Sq, D) x (B, H, Sk, D) -> (B, H, Sq, Sk)."""
    return torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.size(-1))


def full_precision(scores: torch.Tensor) -> torch.Tensor:
    """Scores in float32 when they came out of a half-precision matmul (fp16/bf16 autocast):
    the normalizations (column log-sum-exp over queries, prefix sums, Sinkhorn iterations)
    overflow in fp16 and lose the small weights in bf16, as softmax would (autocast runs
    softmax in float32 for the same reason). The gpu-check found NaN gradients in fp16 without it."""
    return scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores


def allowed_mask(
    q_mask: torch.Tensor | None,
    k_mask: torch.Tensor | None,
    causal: bool,
    sq: int,
    sk: int,
    device: torch.device,
) -> torch.Tensor | None:
    """Boolean (B|1, 1, Sq, Sk) mask of the (query, key) pairs that take part in
    *both* normalizations: real query, real key and, if causal, j <= i.

    Returns ``None`` when every pair is allowed.
    """
    allowed = None
    if causal:
        allowed = torch.ones(sq, sk, dtype=torch.bool, device=device).tril()[None, None]
    if k_mask is not None:
        km = k_mask[:, None, None, :]
        allowed = km if allowed is None else allowed & km
    if q_mask is not None:
        qm = q_mask[:, None, :, None]
        allowed = qm if allowed is None else allowed & qm
    return allowed


def sdpa_mask(k_mask: torch.Tensor | None, causal: bool, sq: int, sk: int,
              device: torch.device) -> tuple[torch.Tensor | None, bool]:
    """``(attn_mask, is_causal)`` for ``scaled_dot_product_attention``: the padded keys' boolean mask
    (B, 1, 1|Sq, Sk), True = attend, with j <= i folded in when causal; or, causal without padding,
    no mask and ``is_causal=True`` (the kernel then skips the masked half)."""
    if k_mask is None:
        return None, causal
    mask = k_mask[:, None, None, :]
    if causal:
        mask = mask & torch.ones(sq, sk, dtype=torch.bool, device=device).tril()
    return mask, False


def score_bias(slopes: torch.Tensor, sq: int, sk: int, device, first: int | None = None) -> torch.Tensor:
    """ALiBi's bias (1, H, sq, sk) of queries ``first .. first + sq - 1`` (default: the last sq of the sk
    positions, as in self-attention and its one-query steps) against keys 0..sk-1."""
    from nas_cli.attention.positions import alibi_bias

    first = sk - sq if first is None else first
    return alibi_bias(slopes, torch.arange(first, first + sq, device=device), torch.arange(sk, device=device))


def masked_row_softmax(logits: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """Softmax over keys (last dim); disallowed pairs get weight 0 and a row with no
    allowed key (a padded query) is all zeros instead of NaN."""
    if allowed is None:
        return torch.softmax(logits, dim=-1)
    logits = logits.masked_fill(~allowed, NEG_INF)
    # a fully masked row would be NaN; give it finite logits and zero it afterwards
    any_allowed = allowed.any(dim=-1, keepdim=True)
    logits = torch.where(any_allowed, logits, torch.zeros_like(logits))
    return torch.softmax(logits, dim=-1) * any_allowed


class AttentionCore(nn.Module):
    """Base class of attention schemes: the contract between a scheme and the model.

    Every capability the model, the decoder or the runner reads is declared here with its
    default; a scheme overrides the ones that differ, as a class attribute or, where an
    option decides it (``KernelSmoother``'s ``positions``), in its ``__init__``, never later.
    :meth:`nas_cli.model.plan.AttentionPlan.check` reads them before any data or W&B run exists.
    """

    #: short name of the scheme family, used in messages (the registry's names are the YAML files')
    name: str = "attention"
    #: the scheme can run in decoder self- and cross-attention (causal keys, queries
    #: generated left to right) without letting a position see the future
    supports_causal: bool = True
    #: the core implements :meth:`step` (one new query at a time, for fast decoding)
    supports_step: bool = False
    #: forward() takes ``prev=`` (the previous layer's AttentionOutput at the same
    #: location, or None in the first layer): cross-layer state such as CODA's logits
    uses_prev: bool = False
    #: queries and keys receive gradients (False: a scheme whose weights ignore the scores)
    qk_gradients: bool = True
    #: the weights are >= 0 (False: e.g. the linear or an odd-degree polynomial kernel, differential attention)
    nonnegative: bool = True
    #: each real query's weights sum to 1, a distribution over keys (False: sigmoid and softpick attention,
    #: whose rows hold any mass in [0, 1]; stick-breaking without attend_to_self; differential, 1 - lambda).
    #: Diagnostics that assume a distribution read this (nas_cli/diagnostics/metrics.py), never a probe
    rows_sum_to_one: bool = True
    #: the largest one weight can be: 1 for every packaged scheme (a softmax, a sigmoid, a stick's share);
    #: ``math.inf`` for weights without a bound (ReLU attention without its 1/L scale). The contract checks each
    #: weight and each row's mass (at most Sk x weight_max) against it; diagnostics that read a weight on an
    #: absolute scale (the sink rate's threshold) use each row's shares of its mass where it exceeds 1
    weight_max: float = 1.0
    #: defined for causal self-attention only (a decoder's or a language model's: forgetting, selective,
    #: stick-breaking attention); built anywhere else the core refuses in one line naming attention.decoder
    causal_self_only: bool = False
    #: heads work in pairs (differential attention: two maps per pair of heads); model.heads must be even
    paired_heads: bool = False
    #: forward() and step() take ``alibi=`` (the heads' ALiBi slopes, model.positions=alibi) and add
    #: alibi_bias (nas_cli/attention/positions.py) to their scores in causal self-attention; a scheme
    #: without it is refused with model.positions=alibi
    takes_alibi: bool = False
    #: keys use the query projection (W_q = W_k, Tsai et al.'s symmetric kernels); the model
    #: then creates no key projection
    tie_qk: bool = False
    #: subset of {"qk", "v"}: sinusoids of the positions are added to this layer's input
    #: before the query/key or the value projection (Tsai et al. Eq. 7)
    input_positions: frozenset = frozenset()
    #: the scheme places positions itself, so the model must add none at its input
    #: (``model.positions=none``; refused before training otherwise)
    requires_no_input_positions: bool = False
    #: titles of the values :meth:`learned` returns, for figures ({name: title}); a value with
    #: no title is titled "<name> per layer and head"
    learned_titles: dict[str, str] = {}
    #: a recurrent token mixer (linear attention, DeltaNet): :meth:`step` reads its state and the newest key and
    #: value only, so the decoding cache keeps that state instead of every key and value
    recurrent: bool = False
    #: :meth:`step` carries a state from one query to the next (DNAS's running column
    #: log-sum-exp); False: every step is a function of the query and the keys alone (softmax,
    #: kernels), so a cached prefill leaves nothing to compute or keep
    carries_state: bool = True

    def __init__(self, heads: int, causal: bool = False, dropout: float = 0.0, prefix_queries: bool = False,
                 location: str = "?", layer: int = 0, name: str | None = None):
        super().__init__()
        # one name per scheme: its YAML's (= the file's stem; conf/attention/coda_cs.yaml builds the
        # CODA class as "coda_cs"), the class's own only when built without a config
        self.name = str(name) if name else type(self).name
        self.heads = heads
        self.causal = causal
        self.prefix_queries = bool(causal or prefix_queries)
        self.dropout = dropout
        self.location, self.layer = location, layer  # where the model uses it (for messages)
        if self.causal_self_only and not causal:
            raise SchemeError(
                f"attention scheme '{self.name}' is defined for causal self-attention only, not for the "
                f"{_PLAIN.get(location, location)}: write attention.decoder={self.name} (the decoder's self-attention) "
                f"with another scheme elsewhere, e.g. attention=unas attention.decoder={self.name}")
        if self.paired_heads and heads % 2:
            raise SchemeError(f"attention scheme '{self.name}' works on pairs of heads: model.heads={heads} must be "
                              f"even (e.g. model.heads={heads + 1})")
        if self.prefix_queries and not self.supports_causal:
            raise SchemeError(
                f"attention scheme '{self.scheme_name()}' cannot be made causal; choose another "
                "scheme for attention.decoder and attention.cross (decoder self- and cross-attention)"
            )

    def scheme_name(self) -> str:
        return self.name

    def input_features(self, d_head: int) -> int:
        """Features per head of a projection of the layer's (query-side) input that this scheme needs
        besides q, k and v (gated attention's gate, forgetting attention's forget gate). The model builds
        the projection ``x_proj`` (d_model -> heads * n, as it builds q, k and v) and hands its
        (B, H, Sq, n) output to :meth:`forward` and :meth:`step` as ``x=``. Default 0: none, no ``x``."""
        return 0

    def qk_width(self, d_head: int) -> int:
        """Features per head of the queries and keys the model projects for this scheme (the values keep
        ``d_head``). Default ``d_head``; Mamba-2's B and C with a state size of their own (``attention.state``)."""
        return d_head

    def weights_from_logits(self, logits: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
        """(B, H, Sq, Sk) scores -> (B, H, Sq, Sk) weights; rows of real queries sum to 1."""
        raise NotImplementedError

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_mask: torch.Tensor | None = None,
        k_mask: torch.Tensor | None = None,
        need_weights: bool = False,
        alibi: torch.Tensor | None = None,
    ) -> AttentionOutput:
        allowed = allowed_mask(q_mask, k_mask, self.causal, q.size(-2), k.size(-2), q.device)
        scores = full_precision(scaled_scores(q, k))
        if alibi is not None:  # causal self-attention: queries and keys at 0..T-1
            scores = scores + score_bias(alibi, q.size(-2), k.size(-2), q.device)
        weights = self.weights_from_logits(scores, allowed)
        dropped = nn.functional.dropout(weights, self.dropout, self.training)
        out = torch.matmul(dropped.to(v.dtype), v)  # (B, H, Sq, D)
        return AttentionOutput(out, weights if need_weights else None, self.aux())

    def learned(self) -> dict[str, torch.Tensor]:
        """Named per-head values this scheme learns, each of shape (heads,), that a researcher
        wants to follow over training (a mixing weight, a temperature). Each one goes, with no
        other code to write, to the loggers as ``<name>/<location>/L<layer>/h<head>`` and
        ``.../mean`` every ``log_learned_every`` steps, to ``summary.json`` (``learned``), to the
        diagnostics' history and figure (``<name>_trajectories.png``), and to nas-report as the
        column ``diag:<name>_mean`` (mean over layers and heads, per location). Default: none."""
        return {}

    def aux(self) -> dict[str, Any]:
        """What ``forward`` hands on with its output (:attr:`AttentionOutput.aux`): the
        :meth:`learned` values, detached, and whatever a scheme adds (CODA: its logits)."""
        return {name: value.detach() for name, value in self.learned().items()}

    def set_width(self, d_model: int) -> None:
        """Called once by the model before any optimizer exists, so a core whose own
        parameters depend on the model width (relative-position tables, additive scoring
        layers) can create them. Default: nothing to create."""

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_mask: torch.Tensor | None, state: Any):
        """Incremental decoding: the newest query q (B, H, 1, D) against all keys so far
        k, v (B, H, Sk, D). ``state`` is what the previous call returned (None at first);
        it must be a tensor (or tuple of tensors) with batch first, so beam search can
        reorder it. Returns (out (B, H, 1, D), state). Must equal row i of ``forward``."""
        raise NotImplementedError

    def prefill_state(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_mask: torch.Tensor | None,
                      k_mask: torch.Tensor | None, x: torch.Tensor | None = None) -> Any:
        """The state :meth:`step` carries after a causal prefill: queries q (B, H, T, D), the i-th
        against keys [0, i] of k, v (B, H, T, D); a padded query (``q_mask`` False) adds nothing;
        ``x`` (B, H, T, n): the input projection of a core that asks for one (:meth:`input_features`).
        None when the scheme carries nothing (:attr:`carries_state`). The default runs :meth:`step`
        once per query (right for any scheme); a scheme overrides it with one vectorized pass."""
        if not self.carries_state:
            return None
        state = None
        for i in range(q.shape[-2]):
            km = None if k_mask is None else k_mask[:, :i + 1]
            if q_mask is not None:
                km = q_mask[:, i:i + 1].expand(-1, i + 1) if km is None else km & q_mask[:, i:i + 1]
            own = {} if x is None else {"x": x[..., i:i + 1, :]}
            _, state = self.step(q[..., i:i + 1, :], k[..., :i + 1, :], v[..., :i + 1, :], km, state, **own)
        return state

    def extra_repr(self) -> str:
        return f"heads={self.heads}, causal={self.causal}, prefix_queries={self.prefix_queries}, dropout={self.dropout}"
