"""The winner's curse of same-seed selection, estimated and taken off a tuned verdict.

When a cell chooses its value of the tuned options on the verdict seeds' validation numbers
(:mod:`nas_cli.report.tuning`, the default protocol), the chosen candidate's test numbers are lifted
with it: validation and test share each run's quality, and the best of several equally good
candidates is the one whose runs came out well. A scheme flat in the learning rate gets that lift
and one sharply peaked does not, so same-seed selection alone calls two schemes that are equal at
their best rates different more often than the test's 5% (docs/comparing.md, case 4).

The lift of one cell on one metric is estimated by Harrell's optimism bootstrap over its selection
seeds: resample the seeds with replacement, choose again on the resample's mean validation values,
and average (the chosen candidate's mean test number on the resample) - (its mean over every seed).
Every resample is taken, each distinct one weighted by its probability, up to 8 seeds; beyond, a fixed
draw of :data:`RESAMPLES`: a report is the same each time it is made.

A verdict's difference (system - baseline) is moved toward zero by the difference of the two
cells' optimism when that difference of optimism points the same way, never past zero and never
away from it: the correction only ever makes a verdict more cautious. Its interval moves with it
and p is recomputed from the same standard error and degrees of freedom. The calibration
(benchmarks/tuning_calibration.py) shows it holds 5% in the flat-versus-sharp case and stays at or
below 5% where the plain choice already did.
"""
from __future__ import annotations

import functools
import math

import numpy as np

#: every distinct resample (a count per seed, weighted by how many ordered resamples give it) when there are
#: at most this many (up to 8 seeds); otherwise RESAMPLES ordered resamples drawn with a fixed seed
EXACT_MAX = 20000
RESAMPLES = 4000


@functools.lru_cache(maxsize=32)
def resample_weights(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(counts, weights): each resample of ``n`` seeds as how often it takes each seed, (M, n), and its
    probability under drawing ``n`` seeds with replacement, (M,); read-only (made once per ``n``)."""
    counts, weights = _resample_weights(n)
    counts.setflags(write=False)
    weights.setflags(write=False)
    return counts, weights


def _resample_weights(n: int) -> tuple[np.ndarray, np.ndarray]:
    if math.comb(2 * n - 1, n) <= EXACT_MAX:
        counts = np.array(list(_compositions(n, n)), dtype=np.float64)
        ways = np.array([math.factorial(n) / math.prod(math.factorial(int(x)) for x in row) for row in counts])
        return counts, ways / n ** n
    idx = np.random.default_rng(0).integers(0, n, (RESAMPLES, n))
    counts = np.stack([np.bincount(row, minlength=n) for row in idx]).astype(np.float64)
    return counts, np.full(RESAMPLES, 1 / RESAMPLES)


def _compositions(total: int, parts: int):
    if parts == 1:
        yield (total,)
        return
    for first in range(total, -1, -1):
        for rest in _compositions(total - first, parts - 1):
            yield (first, *rest)


def optimism(val: np.ndarray, test: np.ndarray, higher: bool) -> np.ndarray | float:
    """Harrell's bootstrap optimism of a choice: ``val`` and ``test`` are (seeds, candidates) arrays (or
    (sweeps, seeds, candidates), one optimism per sweep), the candidate chosen by the best mean of ``val``
    (highest if ``higher``); the expected lift, in ``test``'s units, of the chosen candidate's mean test
    number over its mean on every seed."""
    n, k = val.shape[-2:]
    if n < 2 or k < 2:
        return np.zeros(val.shape[:-2]) if val.ndim == 3 else 0.0
    counts, weights = resample_weights(n)
    vb = np.einsum("mn,...nk->...mk", counts, val) / n
    tb = np.einsum("mn,...nk->...mk", counts, test) / n
    picks = vb.argmax(axis=-1) if higher else vb.argmin(axis=-1)
    lifted = np.take_along_axis(tb, picks[..., None], -1)[..., 0]
    full = np.take_along_axis(test.mean(axis=-2)[..., None, :], picks[..., None], -1)[..., 0]
    out = ((lifted - full) * weights).sum(axis=-1)
    return out if val.ndim == 3 else float(out)


def cell_optimism(cell, metric: str) -> float:
    """The optimism of a tuned cell's choice (:class:`nas_cli.report.tuning.Cell`) for ``metric``,
    over the selection seeds at which every candidate has both numbers; 0 with fewer than 2."""
    seeds = list(cell.seeds)
    tests = []
    for c in cell.candidates:
        by_seed = {}
        for r in c.group.runs:
            try:
                v = r.value(metric)
            except KeyError:
                v = None
            if r.seed is not None and v is not None and math.isfinite(float(v)):
                by_seed[int(r.seed)] = float(v)
        tests.append(by_seed)
    seeds = [s for s in seeds if all(s in t for t in tests)]
    if len(seeds) < 2:
        return 0.0
    val = np.array([[c.val[s] for c in cell.candidates] for s in seeds])
    test = np.array([[t[s] for t in tests] for s in seeds])
    return optimism(val, test, cell.higher)


def correct(comparison, base_cell, sys_cell) -> None:
    """Move ``comparison`` (a :class:`nas_cli.report.stats.Comparison`, system - baseline) toward zero
    by the two cells' difference of optimism where it points the same way as the difference (either
    cell may be None: not chosen on the verdict seeds). Records the amount in ``selection_shift``."""
    from scipy import stats as sps

    c = comparison
    if not (math.isfinite(c.diff) and math.isfinite(c.se) and c.se > 0 and math.isfinite(c.df)):
        return
    lift = (cell_optimism(sys_cell, c.metric) if sys_cell is not None else 0.0) - \
        (cell_optimism(base_cell, c.metric) if base_cell is not None else 0.0)
    if abs(lift) <= 1e-9 * max(1.0, abs(c.diff)) or (lift > 0) != (c.diff > 0):  # none, or round-off
        c.selection_shift = 0.0
        return
    shift = math.copysign(min(abs(lift), abs(c.diff)), c.diff)
    c.diff, c.low, c.high = c.diff - shift, c.low - shift, c.high - shift
    c.p = float(2 * sps.t.sf(abs(c.diff) / c.se, c.df))
    c.selection_shift = shift
    c.test += f", less the estimated lift of the tuning choice ({shift:+.3g})"

