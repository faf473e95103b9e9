"""Document masking for packed windows (``task.document_mask``): a window that joins several documents, each
ended by the end-of-document token, is run as one sequence per document, so no token attends to, or carries state
from, another document, and each document's positions count from 0, as if it had been run alone (Llama 3's
intra-document mask; the "varlen" packing of FlashAttention and flash-linear-attention, which restart positions
and recurrent states at every document).

The documents of a batch become the rows of a new batch (padded at the end with the padding token); the layers run
on those rows, and their outputs go back to the window's positions. Every scheme then sees single documents with
right padding, which each handles already, recurrent mixers included (their state starts afresh per row).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DocumentRows:
    """The documents of a batch of windows (B, T) as rows (N, L): ``rows``, and for every position of the windows
    its row and its position in that row (``row``, ``at``: (B, T) each)."""
    rows: torch.Tensor
    row: torch.Tensor
    at: torch.Tensor

    def back(self, x_rows: torch.Tensor) -> torch.Tensor:
        """Per-row outputs (N, L, ...) -> the windows' positions (B, T, ...)."""
        return x_rows[self.row, self.at]


def split_documents(ids: torch.Tensor, end_id: int, pad_id: int) -> DocumentRows:
    """Cut each window of ``ids`` (B, T) after every ``end_id`` that a real token follows: a document is the tokens
    up to and including its end token (padding after a window's last end token stays in the last document's row,
    as trailing padding)."""
    b, t = ids.shape
    starts = torch.zeros_like(ids, dtype=torch.bool)
    starts[:, 0] = True
    starts[:, 1:] = (ids[:, :-1] == end_id) & (ids[:, 1:] != pad_id)
    document = starts.long().cumsum(1) - 1  # the document of each position within its window
    key = torch.arange(b, device=ids.device)[:, None] * t + document
    _, row = torch.unique(key, return_inverse=True)  # window-major order: a window's documents are adjacent rows
    index = torch.arange(t, device=ids.device).expand(b, t)
    start = torch.where(starts, index, torch.zeros_like(index)).cummax(1).values
    at = index - start
    rows = torch.full((int(row.max()) + 1, int(at.max()) + 1), pad_id, dtype=ids.dtype, device=ids.device)
    rows[row, at] = ids
    return DocumentRows(rows, row, at)
