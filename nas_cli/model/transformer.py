"""Transformer encoder-decoder and decoder-only language model with pluggable attention.

The multi-head attention module owns the projections; the scheme-specific part is an
:class:`~nas_cli.attention.AttentionCore` built per location and layer by a
``core_factory(location, layer, causal) -> AttentionCore`` that the caller injects.
Locations: ``encoder`` (encoder self), ``decoder`` (decoder self, causal), ``cross``.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

from nas_cli.attention import AttentionCore
from nas_cli.model.documents import split_documents
from nas_cli.model.embedding import Embedder
from nas_cli.model.heads import HeadSettings
from nas_cli.model.multihead import MultiHeadAttention
from nas_cli.model.incremental import block_step, can_step_of, reorder_cache  # noqa: F401 (reorder_cache: a public name here)
from nas_cli.model.readout import READOUTS
from nas_cli.infra.options import Count, Fraction, PositiveInt

CoreFactory = Callable[[str, int, bool], AttentionCore]


class FeedForward(nn.Sequential):
    def __init__(self, d_model: int, ffn: int, dropout: float):
        super().__init__(nn.Linear(d_model, ffn), nn.ReLU(), nn.Dropout(dropout), nn.Linear(ffn, d_model), nn.Dropout(dropout))


class Block(nn.Module):
    """One encoder or decoder layer: self-attention, optional cross-attention, FFN (none with
    ``model.ffn=0``: an attention-only layer, as Zoology's Figure 2 models are).

    ``norm_first=True`` is pre-norm (LayerNorm before each sublayer), else post-norm
    as in Vaswani et al."""

    def __init__(self, d_model, heads, ffn, dropout, norm_first, self_core, cross_core=None, positions: str = "",
                 settings: HeadSettings = HeadSettings()):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, heads, self_core, dropout, positions=positions, settings=settings)
        plain = replace(settings, latent=None)  # latent attention is self-attention's
        self.cross_attn = MultiHeadAttention(d_model, heads, cross_core, dropout, settings=plain) \
            if cross_core is not None else None
        self.ffn = FeedForward(d_model, ffn, dropout) if ffn else None
        self.norms = nn.ModuleList(nn.LayerNorm(d_model)
                                   for _ in range(1 + (cross_core is not None) + (self.ffn is not None)))

    def _sub(self, x, i, fn):
        if self.norm_first:
            out, res = fn(self.norms[i](x))
            return x + out, res
        out, res = fn(x)
        return self.norms[i](x + out), res

    def forward(self, x, mask, memory=None, memory_mask=None, need_weights=False, prev=None):
        """``prev``: {'self': AttentionOutput, 'cross': ...} of the layer below (or None);
        the returned dict is the state for the layer above."""
        prev = prev or {}
        found = {}
        x, found["self"] = self._sub(x, 0, lambda h: self.self_attn(h, h, mask, mask, need_weights, prev.get("self")))
        if self.cross_attn is not None:
            x, found["cross"] = self._sub(
                x, 1, lambda h: self.cross_attn(h, memory, mask, memory_mask, need_weights, prev.get("cross")))
        if self.ffn is not None:
            x, _ = self._sub(x, len(self.norms) - 1, lambda h: (self.ffn(h), None))
        return x, found


def _collect(per_layer: list[dict], location_of: dict[str, str]) -> dict:
    """[{'self': AttentionOutput, ...} per layer] -> {location: [AttentionOutput per layer]}"""
    found: dict[str, list] = {}
    for layer in per_layer:
        for key, res in layer.items():
            found.setdefault(location_of[key], []).append(res)
    return found


def check_heads(d_model: int, heads: int) -> None:
    if heads < 1 or d_model % heads:
        raise ValueError(f"model.heads={heads} must divide model.d_model={d_model}; pick heads from "
                         f"{[h for h in range(1, d_model + 1) if d_model % h == 0 and h <= 64]}")


class Seq2SeqTransformer(nn.Module):
    def __init__(self, src_vocab, tgt_vocab, core_factory: CoreFactory, d_model: PositiveInt = 512,
                 heads: PositiveInt = 8, encoder_layers: Count = 6, decoder_layers: PositiveInt = 6,
                 ffn: Count = 2048, dropout: Fraction = 0.1, norm_first: bool = False,
                 positions="sinusoidal", max_len: PositiveInt = 1024, share_embeddings: bool = False, pad_id=0,
                 embed_dropout: Fraction | None = None, kv_heads: int | None = None, qk_norm: bool = False,
                 rope_scaling: dict | None = None, mla=None):
        super().__init__()
        check_heads(d_model, heads)
        settings = HeadSettings.from_options(heads, kv_heads, qk_norm, rope_scaling, positions, mla, d_model // heads)
        embed_dropout = dropout if embed_dropout is None else embed_dropout
        if positions == "alibi":
            raise ValueError("model.positions=alibi is defined for a causal language model's self-attention (Press et "
                             "al. 2022), not for an encoder or cross-attention: use model.positions=rope or sinusoidal")
        self.pad_id = pad_id
        self.src_embed = Embedder(src_vocab, d_model, positions, max_len, embed_dropout, pad_id)
        shared = None
        if share_embeddings:
            if src_vocab != tgt_vocab:
                raise ValueError("model.share_embeddings=true needs a joint source/target vocabulary")
            shared = self.src_embed.tokens
        self.tgt_embed = Embedder(tgt_vocab, d_model, positions, max_len, embed_dropout, pad_id, shared)
        self.encoder = nn.ModuleList(
            Block(d_model, heads, ffn, dropout, norm_first, core_factory("encoder", i, False), positions=positions,
                  settings=settings) for i in range(encoder_layers)
        )
        self.decoder = nn.ModuleList(
            Block(d_model, heads, ffn, dropout, norm_first, core_factory("decoder", i, True), core_factory("cross", i, False),
                  positions=positions, settings=settings) for i in range(decoder_layers)
        )
        self.enc_norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()
        self.dec_norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()
        self.generator = nn.Linear(d_model, tgt_vocab, bias=False)
        self.generator.weight = self.tgt_embed.tokens.weight  # tied output projection (Press & Wolf)

    def encode(self, src, need_weights=False):
        mask = src != self.pad_id  # (B, S)
        x = self.src_embed(src)
        per_layer, found = [], None
        for layer in self.encoder:
            x, found = layer(x, mask, need_weights=need_weights, prev=found)
            per_layer.append(found)
        return self.enc_norm(x), mask, _collect(per_layer, {"self": "encoder"})

    def decode(self, tgt_in, memory, memory_mask, need_weights=False, last_only=False, hidden=False):
        """Logits (B, T, V) and the attention found. ``last_only``: project only the last position to
        the vocabulary (decoding); ``hidden``: the final hidden states (B, T, C) instead of logits
        (evaluation projects only the positions it scores: :meth:`output_logits`)."""
        mask = tgt_in != self.pad_id
        x = self.tgt_embed(tgt_in)
        per_layer, found = [], None
        for layer in self.decoder:
            x, found = layer(x, mask, memory, memory_mask, need_weights=need_weights, prev=found)
            per_layer.append(found)
        if last_only:
            x = x[:, -1:]
        x = self.dec_norm(x)
        return x if hidden else self.generator(x), _collect(per_layer, {"self": "decoder", "cross": "cross"})

    def output_logits(self, h: torch.Tensor) -> torch.Tensor:
        """The output layer: final hidden states (..., C) -> logits (..., V)."""
        return self.generator(h)

    @property
    def can_step(self) -> bool:
        """Every decoder attention core supports incremental decoding."""
        return all(can_step_of(layer.self_attn) and can_step_of(layer.cross_attn) for layer in self.decoder)

    def decode_step(self, token, memory, memory_mask, cache: dict) -> torch.Tensor:
        """Incremental decoding: the newest token (B, 1) -> logits (B, V) for the next one.
        ``cache`` starts as {} and is updated in place; equal to ``decode`` on the prefix."""
        pos = cache.get("len", 0)
        x = self.tgt_embed(token, offset=pos)
        layers = cache.setdefault("layers", [{} for _ in self.decoder])
        for layer, layer_cache in zip(self.decoder, layers):
            x = block_step(layer, x, memory, memory_mask, layer_cache)
        cache["len"] = pos + 1
        return self.generator(self.dec_norm(x))[:, -1]

    def forward(self, src, tgt_in, need_weights=False, hidden=False):
        """(B, S), (B, T) -> logits (B, T, V) (``hidden``: the final hidden states (B, T, C)) and
        {location: [AttentionOutput per layer]}."""
        memory, memory_mask, enc = self.encode(src, need_weights)
        out, dec = self.decode(tgt_in, memory, memory_mask, need_weights, hidden=hidden)
        return out, {**enc, **dec}

    def greedy_decode(self, src, bos_id: int, eos_id: int, max_len: int, incremental: bool = True) -> torch.Tensor:
        """Greedy decoding (:func:`greedy_decode`)."""
        return greedy_decode(self, src, bos_id, eos_id, max_len, incremental)


def adaptive_output(d_model: int, vocab: int, options: dict) -> nn.AdaptiveLogSoftmaxWithLoss:
    """``model.adaptive_softmax`` ({cutoffs, div_value}): Grave et al. 2017's output layer, frequent
    words in a full head, rarer ones in smaller tail clusters (word ids are in frequency order: the
    word-level vocabulary is built that way)."""
    cutoffs = [int(c) for c in options["cutoffs"]]
    if not cutoffs or cutoffs != sorted(set(cutoffs)) or cutoffs[0] <= 0 or cutoffs[-1] >= vocab:
        raise ValueError(f"model.adaptive_softmax.cutoffs must increase strictly between 0 and the vocabulary "
                         f"size {vocab} (got {cutoffs})")
    return nn.AdaptiveLogSoftmaxWithLoss(d_model, vocab, cutoffs, div_value=float(options.get("div_value", 4.0)))


class DecoderOnlyLM(nn.Module):
    """GPT-style causal language model; its self-attention location is ``decoder``."""

    def __init__(self, vocab, core_factory: CoreFactory, d_model: PositiveInt = 512, heads: PositiveInt = 8,
                 decoder_layers: PositiveInt = 6, ffn: Count = 2048, dropout: Fraction = 0.1,
                 norm_first: bool = True, positions="sinusoidal", max_len: PositiveInt = 1024, pad_id=0,
                 adaptive_softmax: dict | None = None, readout: str | None = None,
                 embed_dropout: Fraction | None = None, kv_heads: int | None = None, qk_norm: bool = False,
                 rope_scaling: dict | None = None, mla=None, document_end: int | None = None, **_):
        super().__init__()
        check_heads(d_model, heads)
        settings = HeadSettings.from_options(heads, kv_heads, qk_norm, rope_scaling, positions, mla, d_model // heads)
        self.pad_id = pad_id
        #: document masking (task.document_mask, nas_cli/model/documents.py): the end-of-document token, or None
        self.document_end = document_end
        # the embeddings' dropout: model.dropout unless model.embed_dropout says otherwise (Zoology: 0.1 there only)
        self.embed = Embedder(vocab, d_model, positions, max_len, dropout if embed_dropout is None else embed_dropout,
                              pad_id)
        self.layers = nn.ModuleList(
            Block(d_model, heads, ffn, dropout, norm_first, core_factory("decoder", i, True), positions=positions,
                  settings=settings) for i in range(decoder_layers)
        )
        self.norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()
        #: how the outputs are read from the final states: each position's own (None), or a task's read-out
        self.readout = READOUTS[readout](d_model, max_len) if readout else None
        self.adaptive = bool(adaptive_softmax)
        if self.adaptive:
            self.generator = adaptive_output(d_model, vocab, adaptive_softmax)
        else:
            self.generator = nn.Linear(d_model, vocab, bias=False)
            self.generator.weight = self.embed.tokens.weight

    def attention_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The sequences the attention layers run on: the windows, or with document masking one per document."""
        return ids if self.document_end is None else split_documents(ids, self.document_end, self.pad_id).rows

    def features(self, ids, need_weights=False):
        """Final hidden states (B, T, d_model) and the attention weights found (per row of
        :meth:`attention_rows`)."""
        docs = None if self.document_end is None else split_documents(ids, self.document_end, self.pad_id)
        rows = ids if docs is None else docs.rows
        mask = rows != self.pad_id
        x = self.embed(rows)
        per_layer, found = [], None
        for layer in self.layers:
            x, found = layer(x, mask, need_weights=need_weights, prev=found)
            per_layer.append(found)
        x = self.norm(x if docs is None else docs.back(x))
        return (x if self.readout is None else self.readout(x)), _collect(per_layer, {"self": "decoder"})

    def forward(self, ids, need_weights=False, hidden=False):
        """Logits over the vocabulary (with an adaptive softmax: its full log-probabilities,
        which are logits of the same distribution) and the attention weights found; ``hidden``: the
        final hidden states (B, T, C) instead (evaluation projects only the positions it scores)."""
        h, attn = self.features(ids, need_weights=need_weights)
        if hidden:
            return h, attn
        if self.adaptive:
            return self.generator.log_prob(h.flatten(0, -2)).view(*h.shape[:-1], -1), attn
        return self.generator(h), attn

    def output_logits(self, h: torch.Tensor) -> torch.Tensor:
        """The output layer (not adaptive): final hidden states (..., C) -> logits (..., V)."""
        return self.generator(h)

    def target_log_prob(self, h: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """log p(target) for hidden states ``h`` (N, d) and targets (N,) without forming all the
        vocabulary's logits when the output layer is adaptive."""
        if self.adaptive:
            return self.generator(h, target).output
        return F.log_softmax(self.generator(h).float(), dim=-1).gather(1, target[:, None]).squeeze(1)


@torch.no_grad()
def greedy_decode(model, src, bos_id: int, eos_id: int, max_len: int, incremental: bool = True) -> torch.Tensor:
    """Greedy decoding with any encoder-decoder that has ``encode``, ``decode``, ``can_step``,
    ``decode_step`` and ``pad_id`` (:class:`Seq2SeqTransformer`, a Hugging Face pair). Incremental
    (cached keys/values and running column normalizers) when every decoder core supports
    ``step``, else the decoder re-runs on the whole prefix; both equal teacher forcing. Returns
    (B, <= max_len) token ids without BOS, padded with pad_id after EOS."""
    memory, memory_mask, _ = model.encode(src)
    ys = torch.full((src.size(0), 1), bos_id, dtype=torch.long, device=src.device)
    done = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
    step_cache = {} if incremental and model.can_step else None
    for _ in range(max_len):
        if step_cache is not None:
            last = model.decode_step(ys[:, -1:], memory, memory_mask, step_cache).clone()
        else:
            logits, _ = model.decode(ys, memory, memory_mask, last_only=True)
            last = logits[:, -1].clone()
        last[:, [model.pad_id, bos_id]] = float("-inf")  # never emit padding or a second BOS
        nxt = last.argmax(-1)
        nxt = torch.where(done, torch.full_like(nxt, model.pad_id), nxt)
        ys = torch.cat([ys, nxt[:, None]], dim=1)
        done |= nxt == eos_id
        if done.all():
            break
    return ys[:, 1:]
