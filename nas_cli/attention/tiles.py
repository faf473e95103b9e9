"""Tiles shared by the memory-efficient paths (:mod:`.efficient` for the non-prefix form and the
dispatch, :mod:`.efficient_prefix` for the prefix form): the tile size, the work dtype, and the
mask of one (query block x keys) tile. A module of its own so that neither path imports the other
for these."""
from __future__ import annotations

import torch

#: finite stand-in for -inf inside tiles: exp(NEG - x) is exactly 0 for any real x, and
#: unlike -inf it never gives NaN gradients (-inf - -inf) for fully masked rows/columns
NEG = -1e30
#: default tile size (numbers) of the chunked passes: 2**21 float32 = 8 MiB per tile.
#: Backward holds about 2 tiles (non-prefix) or 4 (prefix DNAS) at a time, so at B=1, H=8,
#: S=8192 the extra memory over SDPA is ~16-32 MiB; a larger tile is faster, not exact-er.
TILE_ELEMENTS = 2**21
IMPLS = ("efficient", "naive", "flex", "triton")  # flex: PyTorch FlexAttention, encoder form (attention/flex.py);
# triton: Triton kernels of the prefix form (attention/triton_prefix.py)


def check_impl(impl: str) -> str:
    if impl not in IMPLS:
        raise ValueError(f"attention.impl must be one of {', '.join(IMPLS)} (got {impl!r})")
    return impl


def auto_block(rows: int, width: int, batch_heads: int, budget: int = TILE_ELEMENTS) -> int:
    """Query-block height so that a (batch_heads, block, width) tile has ~budget numbers."""
    return max(1, min(rows, max(16, budget // max(1, batch_heads * width))))


def work_dtype(t: torch.Tensor) -> torch.dtype:
    """float32, or float64 for float64 inputs: the precision of all tile arithmetic."""
    return torch.promote_types(t.dtype, torch.float32)


def sdpa_dtype(q: torch.Tensor) -> torch.dtype:
    """The dtype SDPA computes in here: the autocast dtype when autocast is on."""
    dev = q.device.type
    try:
        if torch.is_autocast_enabled(dev) and q.is_floating_point():
            return torch.get_autocast_dtype(dev)
    except (TypeError, RuntimeError):  # older torch without the device-type API
        pass
    return q.dtype


def no_autocast(device: torch.device):
    return torch.autocast(device_type=device.type, enabled=False)


def tile_mask(qm_rows, k_mask, row0: int, n: int, causal: bool, bq: int, device) -> torch.Tensor | None:
    """Bool (B|1, 1, bq, n): pairs (query row0.., key 0..n-1) that take part in both
    normalizations (real query, real key, and j <= i if causal). qm_rows (B, bq) is the
    block's slice of q_mask, k_mask (B, n). None if every pair takes part."""
    m = None
    if causal:
        rows = torch.arange(row0, row0 + bq, device=device)[:, None]
        m = (torch.arange(n, device=device)[None, :] <= rows)[None, None]
    if k_mask is not None:
        km = k_mask[:, None, None, :n]
        m = km if m is None else m & km
    if qm_rows is not None:
        qm = qm_rows[:, None, :, None]
        m = qm if m is None else m & qm
    return m
