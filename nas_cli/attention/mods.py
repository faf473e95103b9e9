"""Settings of the scores that today's models put around their attention, for the schemes that turn each
query's scores into its weights row by row (UNAS and gated attention; sigmoid, softpick, stick-breaking and
selective attention; flex, whose mods come on top): each is an option of those schemes' YAMLs, so ``attention.softcap=30`` reaches every
location that runs one, and ``attention.decoder.window=64`` one location.

* ``softcap``: logit soft-capping (Gemma 2, Gemma Team 2024): s_ij -> c tanh(s_ij / c) with c the option, on
  q_i . k_j / sqrt(d) before anything else is added (ALiBi's bias) and before the weights.
* ``window``: sliding-window attention (Beltagy et al. 2020's local attention; Mistral 7B, Gemma 2/3): query i
  sees the keys j with i - w < j <= i in causal self-attention, |i - j| < w in an encoder's; refused in
  cross-attention, whose keys are another sequence's positions. Decoding keeps only the last w keys and
  values (nas_cli/model/incremental.py). Sigmoid attention's default bias -log n counts the keys in the window.
* ``sink`` (the softmax schemes): one more key for every query, outside the sequence, with a value of zero:
  ``zero``, a score of 0 (softmax's denominator plus one, "off-by-one" attention, as a zero key and value do in
  x-transformers); ``learned``, a score per head learned with the model (gpt-oss, OpenAI 2025). A query's
  weights then sum to less than one (the rest went to the sink), so the diagnostics that need a distribution
  use row-normalized weights; a learned sink's scores are followed over training as ``sink``.

Selective attention takes ``softcap`` only: its carried votes cover every earlier key, which a window would cut.
"""
from __future__ import annotations

import torch
from torch import nn

from nas_cli.attention.base import SchemeError, check_option, masked_row_softmax

#: the values of attention.sink
SINKS = ("zero", "learned")


def window_mask(rows: torch.Tensor, cols: torch.Tensor, window: int, causal: bool) -> torch.Tensor:
    """(len(rows), len(cols)) boolean, True where key position ``cols[j]`` lies in the window of query position
    ``rows[i]``: i - w < j (causal: the causal mask is applied besides), |i - j| < w otherwise."""
    gap = rows[:, None] - cols[None, :]
    return gap < window if causal else gap.abs() < window


class ScoreOptions:
    """Mixin of an :class:`~nas_cli.attention.base.AttentionCore`: ``softcap``, ``window`` and (``sinks=True``)
    ``sink`` as above. A core calls :meth:`score_options` from its constructor, :meth:`capped` on its scores,
    :meth:`windowed` on its allowed pairs and, with a sink, :meth:`sunk_softmax` for its weights."""

    #: a sliding window leaves the scheme what it is (False: selective attention, whose votes span every key)
    takes_window: bool = True
    softcap: float | None = None
    window: int | None = None
    sink: str | None = None

    def score_options(self, softcap=None, window=None, sink=None, sinks: bool = False) -> None:
        check_option("softcap", softcap, softcap is None or (isinstance(softcap, (int, float))
                                                              and not isinstance(softcap, bool) and softcap > 0),
                     "be null (no cap) or a positive number, the cap c of c tanh(s / c) (Gemma 2: 50)")
        check_option("window", window, window is None or (isinstance(window, int) and not isinstance(window, bool)
                                                            and window >= 1),
                     "be null (every key) or a positive number of keys each query sees")
        if window is not None and not self.takes_window:
            raise SchemeError(f"attention.window={window}: {self.name} attention cannot take a sliding window (its "
                              "state spans every earlier key); leave attention.window out for it")
        if window is not None and self.location == "cross":
            raise SchemeError(f"attention.cross.window={window}: cross-attention's keys are the source's positions, "
                              "not the query's, so a sliding window has no meaning there; set the window of "
                              "attention.encoder or attention.decoder instead (attention.cross.window=null)")
        if sinks:
            check_option("sink", sink, sink is None or sink in SINKS, "be null (no sink), zero or learned")
        self.softcap = None if softcap is None else float(softcap)
        self.window = None if window is None else int(window)
        self.sink = sink
        self.sink_logit = nn.Parameter(torch.zeros(self.heads)) if sink == "learned" else None
        if sink is not None:
            self.rows_sum_to_one = False

    @property
    def eager_scores(self) -> bool:
        """The scores must be computed here (a fused softmax kernel can neither cap them nor add a sink)."""
        return self.softcap is not None or self.sink is not None

    def capped(self, s: torch.Tensor) -> torch.Tensor:
        return s if self.softcap is None else self.softcap * torch.tanh(s / self.softcap)

    def windowed(self, allowed: torch.Tensor | None, first: int, sq: int, sk: int, device) -> torch.Tensor | None:
        """``allowed`` (broadcastable to (B, H, sq, sk), None: every pair) limited to the window, the queries
        at positions first .. first + sq - 1 and the keys at 0 .. sk - 1."""
        if self.window is None:
            return allowed
        inside = window_mask(torch.arange(first, first + sq, device=device), torch.arange(sk, device=device),
                             self.window, self.causal)[None, None]
        return inside if allowed is None else allowed & inside

    def sunk_softmax(self, logits: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
        """The softmax over the keys and the sink (``logits`` (B, H, Sq, Sk)), the sink's column dropped."""
        if self.sink is None:
            return masked_row_softmax(logits, allowed)
        b, h, sq, _ = logits.shape
        score = logits.new_zeros(h) if self.sink_logit is None else self.sink_logit.to(logits.dtype)
        column = score[None, :, None, None].expand(b, h, sq, 1)
        full = torch.ones(b, h, sq, 1, dtype=torch.bool, device=logits.device)
        if allowed is not None:
            allowed = torch.cat([allowed.expand(b, h, sq, logits.size(-1)), full], dim=-1)
        return masked_row_softmax(torch.cat([logits, column], dim=-1), allowed)[..., :-1]

    def sink_values(self) -> dict[str, torch.Tensor]:
        """The learned sink's score per head, for :meth:`AttentionCore.learned`."""
        return {} if self.sink_logit is None else {"sink": self.sink_logit}

    def score_repr(self) -> str:
        parts = [f"{k}={getattr(self, k)}" for k in ("softcap", "window", "sink") if getattr(self, k) is not None]
        return "".join(f", {p}" for p in parts)
