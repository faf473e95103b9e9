"""Where attention runs in nas-run's models, the one list every module reads: encoder
self-attention, decoder self-attention (causal) and cross-attention (decoder queries, encoder
keys). A decoder-only language model has the decoder location alone."""
from __future__ import annotations

LOCATIONS: tuple[str, str, str] = ("encoder", "decoder", "cross")
