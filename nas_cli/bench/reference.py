"""The plain PyTorch reference of ``nas-bench train``: torch.nn.Transformer with nas-run's
sizes, tied embeddings and sinusoids, trained by a hand-written loop (no Lightning)."""
from __future__ import annotations

import math

import torch
from torch import nn



class ReferenceTransformer(torch.nn.Module):
    """The plain-PyTorch reference: ``torch.nn.Transformer`` with nas-run's sizes and
    layout (token embeddings scaled by sqrt(d_model) plus sinusoidal or learned positions,
    pre- or post-norm, final LayerNorms only with pre-norm, shared embeddings and tied
    output projection, dropout on embeddings / sublayer outputs / FFN hidden units and
    ``attention_dropout`` on the attention weights), so the parameter count equals
    nas-run's model."""

    def __init__(self, vocab: int, m, pad_id: int):
        super().__init__()

        from nas_cli.attention.positions import sinusoids

        d, nf = int(m.d_model), bool(m.norm_first)
        self.pad_id, self.scale = pad_id, math.sqrt(d)
        self.src_tokens = nn.Embedding(vocab, d, padding_idx=pad_id)
        self.tgt_tokens = self.src_tokens if m.share_embeddings else nn.Embedding(vocab, d, padding_idx=pad_id)
        if m.positions == "learned":
            self.positions = nn.Parameter(torch.randn(int(m.max_len), d) * d**-0.5)
        else:
            self.register_buffer("positions", sinusoids(torch.arange(int(m.max_len)), d), persistent=False)
        layer_args = dict(d_model=d, nhead=int(m.heads), dim_feedforward=int(m.ffn), dropout=float(m.dropout),
                          batch_first=True, norm_first=nf)
        encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(**layer_args), int(m.encoder_layers),
                                        norm=nn.LayerNorm(d) if nf else None, enable_nested_tensor=False)
        decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(**layer_args), int(m.decoder_layers),
                                        norm=nn.LayerNorm(d) if nf else None)
        self.transformer = nn.Transformer(d_model=d, nhead=int(m.heads), custom_encoder=encoder,
                                          custom_decoder=decoder, batch_first=True)
        for mod in self.modules():  # nas-run: model.attention_dropout on the weights (0 by default)
            if isinstance(mod, nn.MultiheadAttention):
                mod.dropout = float(m.get("attention_dropout", 0.0))
        self.dropout = nn.Dropout(float(m.dropout))

    def forward(self, src, tgt_in):
        src_pad, tgt_pad = src == self.pad_id, tgt_in == self.pad_id
        x = self.dropout(self.src_tokens(src) * self.scale + self.positions[: src.size(1)])
        y = self.dropout(self.tgt_tokens(tgt_in) * self.scale + self.positions[: tgt_in.size(1)])
        t = tgt_in.size(1)  # boolean like the padding masks: True = may not attend
        causal = torch.ones(t, t, dtype=torch.bool, device=src.device).triu(1)
        h = self.transformer(x, y, tgt_mask=causal, tgt_is_causal=True, src_key_padding_mask=src_pad,
                             tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=src_pad)
        return torch.nn.functional.linear(h, self.tgt_tokens.weight)


