"""Tile sizes of the Triton kernels: autotuned on a GPU, fixed elsewhere.

**Encoder form.**
On CUDA every kernel is wrapped in Triton's autotuner (``triton.autotune``): the first call for a
GPU, input dtype (part of the autotuner's key), compile-time case (head dims, masks, HNAS) and length
bucket times each candidate
tile (BQ x BK, warps, pipeline stages) of the kernel's table and keeps the fastest; a candidate
that does not fit the GPU (registers, shared memory) is skipped by the autotuner. The kernels
write every output element once and never accumulate into their inputs, so running a candidate
twice is harmless. The length bucket (:func:`length_bucket`: below 2k, below 8k, from 8k) keeps a
training run whose batches have different lengths from tuning again at every batch.

Fixed tiles (:data:`FIXED_Q` x :data:`FIXED_K`, Triton's default warps and stages) are used under
Triton's CPU interpreter (``TRITON_INTERPRET=1``, where the tests run: it has no GPU timer), with
``NAS_TRITON_TILES=fixed`` in the environment (to compare, or if a GPU's autotuning fails), when
the caller gives the block sizes, and under ``torch.use_deterministic_algorithms``
(``trainer.deterministic=true``): tiles chosen by timing could differ between two runs and change
the order of the sums, so two runs would not repeat bit for bit.

**Prefix form** (:func:`prefix_tiles`). Its carry of column log-sum-exps is laid out per query block, so
all four passes must share one BQ, which Triton's per-kernel autotuner cannot promise. It is tuned
jointly instead: at the first call of a case (GPU, dtype, head dims, masks, HNAS, length bucket), each
candidate of :data:`PREFIX` runs the whole forward and backward once on the call's own inputs (into
scratch buffers), timed, and the fastest is kept for that case. A candidate that fails to compile or
launch (registers, shared memory) is skipped. Where tiles are not tuned (the interpreter, ``fixed``,
deterministic runs), bf16/fp16 on CUDA take :data:`PREFIX_FIXED_LOWP`, everything else 32 x 32.
``NAS_TRITON_PREFIX_TILES=BQxBK[xWARPSxSTAGES]`` sets them (to compare candidates on a GPU).
"""
from __future__ import annotations

import os

FIXED_Q = 32
FIXED_K = 32
#: (BQ, BK, num_warps, num_stages) tried for the passes of one query block over all keys and for
#: the column passes (one key block over all queries); BQ and BK are each a kernel's own tile. Four
#: candidates per kernel, since each is compiled at the first call of a case (DNAS has 4 kernels,
#: HNAS 4 more, Sinkhorn-k 9)
FORWARD = ((128, 64, 4, 3), (128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 8, 2))
#: the backward passes hold dK, dV (or dQ) accumulators besides the tile: smaller candidates. Compiled for
#: sm_90 (benchmarks/triton_compile.py, docs/speed.md), the dK/dV program spilled registers at 64 x 64 with 4
#: warps (0.1 KB per thread at d_head 64, 0.8 KB at 128) and at 64 x 128 with 8 (0.6 / 1.2 KB); these four
#: spill nothing at d_head 64 in DNAS (at 128 each spills 40-210 bytes)
BACKWARD = ((64, 64, 8, 2), (32, 64, 4, 3), (32, 128, 8, 2), (128, 64, 8, 2))
#: the timer the autotuner uses; None: Triton's do_bench with a short warm-up (5 ms) and window (25 ms).
#: A test sets a CPU timer to run the autotuner under the interpreter.
BENCH = None
#: (BQ, BK, num_warps, num_stages) tried for the prefix form's four passes together (:func:`prefix_tiles`):
#: three, since each is four compilations at the first call of a case. Chosen from the kernels compiled for
#: sm_90 with Triton 3.6 (benchmarks/triton_compile.py, docs/triton_compile.md): 64 x 32 with 8 warps runs
#: every pass on Hopper's warpgroup MMA (wgmma) and spills no register in DNAS at d_head 64 (0.1-0.4 KB per
#: thread in the dK/dV pass otherwise); 32 x 64 with 8 warps spills nothing at d_head 64 or 128 but its
#: 32-row tiles take mma.sync in three of the four passes; 64 x 64 with 8 warps is the large wgmma tile
#: and spills up to 1.8 KB. 64 x 64 with 4 warps, the untuned default before, spilled 1.6 KB in the dK/dV pass
PREFIX = ((64, 32, 8, 2), (32, 64, 8, 2), (64, 64, 8, 2))
#: the prefix form's tiles for bf16/fp16 on CUDA where they are not tuned (None: Triton's default warps/stages)
PREFIX_FIXED_LOWP = (64, 32, 8, 2)
_TUNED: dict = {}
_KEYS: dict = {}
_PREFIX_KEPT: dict = {}


def length_bucket(sq: int, sk: int) -> int:
    """The autotuner's length key: 0 below 2048, 1 below 8192, 2 from there on (max of Sq, Sk)."""
    s = max(sq, sk)
    return 0 if s < 2048 else 1 if s < 8192 else 2


def autotuning() -> bool:
    """Whether the kernels' tiles are autotuned here (module docstring)."""
    import torch

    if os.environ.get("NAS_TRITON_TILES", "auto") == "fixed" or torch.are_deterministic_algorithms_enabled():
        return False
    return BENCH is not None or os.environ.get("TRITON_INTERPRET") != "1"


def _quick_bench(fn, quantiles=None):
    import triton

    return triton.testing.do_bench(fn, warmup=5, rep=25, quantiles=quantiles)


def tuned(kernel, table):
    """``kernel`` under Triton's autotuner with ``table``'s candidates, made once per (kernel, table, timer)."""
    key = (kernel, table, BENCH)
    if key not in _TUNED:
        import triton

        configs = [triton.Config({"BQ": bq, "BK": bk}, num_warps=w, num_stages=st) for bq, bk, w, st in table]
        try:
            _TUNED[key] = triton.autotune(configs, key=["TUNE"], do_bench=BENCH or _quick_bench)(kernel)
        except TypeError:  # a Triton without autotune(do_bench=): its own timer and window
            _TUNED[key] = triton.autotune(configs, key=["TUNE"], warmup=5, rep=25)(kernel)
    return _TUNED[key]


def tuning_key(bucket: int, kwargs: dict) -> int:
    """One int (the kernels' ``TUNE`` argument, the autotuner's key besides the tensors' dtypes) for the
    length bucket and the kernel's compile-time flags (head dims' tiles, masks, HNAS, ...): tiles are
    chosen for each such case apart. Unspecialized in the kernels, so a new key compiles nothing."""
    return _KEYS.setdefault((bucket, tuple(sorted((k, str(v)) for k, v in kwargs.items()))), len(_KEYS))


def _tunes(block_q, block_k) -> bool:
    """Whether a :func:`launch` with these block sizes autotunes its tiles (none given, and :func:`autotuning`)."""
    return block_q is None and block_k is None and autotuning()


def launch(kernel, per: str, bh: int, length: int, bucket: int, args, kwargs, table=FORWARD, block_q=None,
           block_k=None) -> None:
    """Run ``kernel`` on a (bh, blocks) grid, ``per`` ("BQ" or "BK") naming the block its second
    axis counts over ``length``: with the given or fixed tiles, or autotuned (per length ``bucket``
    and compile-time flags, :func:`tuning_key`)."""
    tune = tuning_key(bucket, kwargs)
    if _tunes(block_q, block_k):
        tuned(kernel, table)[lambda meta: (bh, -(-length // meta[per]))](*args, tune, **kwargs)
        return
    bq, bk = block_q or FIXED_Q, block_k or FIXED_K
    kernel[(bh, -(-length // (bq if per == "BQ" else bk)))](*args, tune, BQ=bq, BK=bk, **kwargs)


def tiles_divide(sq: int, sk: int, table=FORWARD, block_q=None, block_k=None) -> bool:
    """Whether every tile a :func:`launch` with these arguments may run divides both lengths (each candidate
    of ``table`` where it autotunes, else the given or fixed tiles). The encoder-form kernels then take
    ``EVEN``: no tile reaches past a length, so they skip the bounds test and the selects it feeds (on sm_90,
    11-18% of the instructions in their loops, counted in the compiled code; the padding masks stay)."""
    tiles = [(bq, bk) for bq, bk, *_ in table] if _tunes(block_q, block_k) else [(block_q or FIXED_Q,
                                                                                  block_k or FIXED_K)]
    return all(sq % bq == 0 and sk % bk == 0 for bq, bk in tiles)


def chosen(kernel, table=FORWARD) -> dict | None:
    """The tiles the autotuner kept for ``kernel`` at its last key (None before its first call)."""
    tuner = _TUNED.get((kernel, table, BENCH))
    cfg = getattr(tuner, "best_config", None)
    return None if cfg is None else {**cfg.kwargs, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}


def chosen_all() -> dict:
    """Every autotuned kernel's last tiles, by kernel name, and the prefix form's (for the benchmarks' records)."""
    kept = {getattr(kernel, "__name__", str(kernel)): chosen(kernel, table) for kernel, table, _ in list(_TUNED)}
    return {**kept, **prefix_chosen()}


def env_prefix_tiles() -> tuple | None:
    """The prefix form's tiles from ``NAS_TRITON_PREFIX_TILES`` (None when unset); ValueError, naming the
    variable and the form it takes, for a malformed value (the run's checks turn it into one line)."""
    raw = os.environ.get("NAS_TRITON_PREFIX_TILES", "").strip()
    if not raw:
        return None
    try:
        parts = tuple(int(x) for x in raw.lower().split("x"))
    except ValueError:
        parts = ()
    if len(parts) not in (2, 4) or any(x <= 0 for x in parts) or any(x < 16 or x & (x - 1) for x in parts[:2]):
        raise ValueError(f"NAS_TRITON_PREFIX_TILES={raw!r}: expected BQxBK or BQxBKxWARPSxSTAGES, BQ and BK powers "
                         "of two from 16 (e.g. 64x64 or 64x64x4x2)")
    return parts if len(parts) == 4 else (*parts, None, None)


def prefix_tiles(key: tuple, lowp: bool, cuda: bool, trial) -> tuple:
    """(BQ, BK, num_warps, num_stages) for one call of the prefix form (num_warps/num_stages None: Triton's
    defaults). ``key``: the case (dtype, head dims, masks, HNAS, length bucket, device); ``trial(tiles)``
    runs the forward and backward once with those tiles. Tuned once per key where :func:`autotuning` holds
    (the fastest candidate of :data:`PREFIX` by the GPU's timer); otherwise fixed (module docstring)."""
    forced = env_prefix_tiles()
    if forced is not None:
        return forced
    if not autotuning():
        return PREFIX_FIXED_LOWP if (lowp and cuda) else (FIXED_Q, FIXED_K, None, None)
    if key not in _PREFIX_KEPT:
        timer = BENCH or _quick_bench
        best, best_ms = None, float("inf")
        for tiles in PREFIX:
            try:
                ms = timer(lambda tiles=tiles: trial(tiles))
            except Exception:  # noqa: BLE001 - a candidate this GPU cannot compile or launch is skipped
                continue
            if ms < best_ms:
                best, best_ms = tiles, ms
        _PREFIX_KEPT[key] = best or (FIXED_Q, FIXED_K, None, None)
    return _PREFIX_KEPT[key]


def prefix_chosen() -> dict:
    """The prefix form's tiles kept so far, by case (for the benchmarks' records)."""
    return {"prefix " + " ".join(map(str, key)): dict(zip(("BQ", "BK", "num_warps", "num_stages"), tiles))
            for key, tiles in _PREFIX_KEPT.items()}
