"""Seeds until the answer is known: a group-sequential paired t-test over seeds.

A sequential sweep (``nas-run -m ... seed=auto``) trains its configurations in rounds of seeds and
looks at the comparisons after each round. Testing again after every new seed at a fixed 5% and
stopping once p < 0.05 calls a difference far more often than 5% of the time when there is none
(optional stopping). This module gives the looks boundaries that keep the error rate at
``alpha`` however many rounds a comparison runs.

**The design.** The looks are at n = ``min_seeds``, ``min_seeds + seeds_per_round``, ...,
``max_seeds`` paired seeds, planned before the first run. At look k the paired differences
(system - baseline, one per seed) give the paired t statistic T_k = mean / (sd / sqrt(n_k)).
An alpha-spending function (Lan and DeMets 1983) fixes how much of ``alpha`` may be spent by
look k, as a function of the information fraction n_k / max_seeds:

- ``obf`` (default): O'Brien-Fleming-shaped, ``2 - 2 Phi(z_{1-alpha/2} / sqrt(t))``: almost
  nothing is spent at 2-3 seeds, so the last look keeps nearly the fixed-n test's power;
- ``pocock``: ``alpha ln(1 + (e - 1) t)``: more at the early looks, less at the last.

The boundary c_k is the |T_k| that spends that much: P(|T_j| < c_j for j < k, |T_k| >= c_k) =
spent(k) - spent(k - 1) under no difference. With normal seed-level differences the sequence
(T_1, ..., T_K) has the same joint distribution whatever the seed-to-seed spread (the t
statistic is pivotal), so these boundaries are exact for every spread; they are computed once
per design by simulating that sequence (:data:`PATHS` paths, fixed stream: the same boundaries
on every machine), and where a look spends too little for the simulation to resolve, from the
t distribution's own quantile (which spends at most the planned amount). Normal-theory boundaries
(z instead of t) would be far too small at 2-5 seeds: a t statistic with 1-4 degrees of freedom
has much heavier tails.

**The decisions.** The repeated confidence interval at look k, mean -+ c_k sd / sqrt(n_k),
covers the true difference at every look at once with probability 1 - alpha (Jennison and
Turnbull 1989): the same pivotal argument with the true difference subtracted. Each comparison
ends at the first look where that interval

- lies above 0: *higher* (the system's number is higher than the baseline's),
- lies below 0: *lower*,
- lies inside (-delta, +delta), when the user gave ``delta``: *no difference larger than delta*,

and otherwise goes on to the next round; at ``max_seeds`` it ends *undecided*. A false
*higher*/*lower* needs the interval to miss a true 0, and a false *no difference larger than
delta* needs it to miss a true difference of at least delta: each happens with probability at
most alpha per comparison, at whatever look the sweep stops.

**Many comparisons.** Holm's procedure carried through the looks (the graphical approach of
Maurer and Bretz 2013): each comparison still open is tested at alpha / (m - r), where m is the
number of comparisons of the sweep and r the number already decided *higher*/*lower*; after a
rejection the others are tested again at the same look with their larger share. The family-wise
error rate stays at most alpha (checked by simulation in ``tests/report/test_sequential.py``).

Why not a library: no maintained Python package computes group-sequential boundaries for the
t statistic at 1-9 degrees of freedom (R's gsDesign and rpact work on the normal scale), and the
anytime-valid alternatives (confidence sequences, e-processes) pay for an unlimited number of
looks and detect little at 2-10 seeds; docs/comparing.md has the numbers.
"""
from __future__ import annotations

from types import MappingProxyType
import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Sequence

import numpy as np

#: simulated paths per design: the spent alpha is exact to about +-0.0005
PATHS = 200_000
#: the fixed stream the boundaries are simulated with
STREAM = 20231983
SPENDING = ("obf", "pocock")
#: the decisions
HIGHER, LOWER, EQUIVALENT, CONTINUE, UNDECIDED = "higher", "lower", "equivalent", "continue", "undecided"


def looks(min_seeds: int, max_seeds: int, per_round: int = 1) -> tuple[int, ...]:
    """The numbers of paired seeds at which a sweep looks: min, min + per_round, ..., max."""
    if min_seeds < 2:
        raise ValueError("min_seeds must be at least 2 (one seed says nothing about seed-to-seed spread)")
    if max_seeds < min_seeds:
        raise ValueError(f"max_seeds ({max_seeds}) must be at least min_seeds ({min_seeds})")
    if per_round < 1:
        raise ValueError("seeds_per_round must be at least 1")
    out = list(range(min_seeds, max_seeds + 1, per_round))
    if out[-1] != max_seeds:
        out.append(max_seeds)
    return tuple(out)


def spent(fraction: float, alpha: float, spending: str = "obf") -> float:
    """The alpha that may be spent by information fraction ``fraction`` (0..1]."""
    from scipy.stats import norm

    t = min(max(float(fraction), 0.0), 1.0)
    if t <= 0:
        return 0.0
    if spending == "obf":
        return float(min(alpha, 2 - 2 * norm.cdf(norm.ppf(1 - alpha / 2) / math.sqrt(t))))
    if spending == "pocock":
        return float(alpha * math.log(1 + (math.e - 1) * t))
    raise ValueError(f"unknown spending function {spending!r}; choose {' or '.join(SPENDING)}")


@lru_cache(maxsize=None)
def _paths(max_n: int) -> np.ndarray:
    """|T_n| for n = 2..max_n on :data:`PATHS` simulated null paths (columns: n - 2)."""
    rng = np.random.default_rng(STREAM)
    x = rng.standard_normal((PATHS, max_n))
    n = np.arange(1, max_n + 1, dtype=np.float64)
    s1 = np.cumsum(x, axis=1)
    s2 = np.cumsum(x * x, axis=1)
    mean = s1 / n
    var = (s2 - n * mean ** 2)[:, 1:] / (n[1:] - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.abs(mean[:, 1:]) / np.sqrt(np.maximum(var, 0) / n[1:])
    return np.nan_to_num(t, nan=0.0, posinf=np.inf)


@lru_cache(maxsize=None)
def boundaries(design_looks: tuple[int, ...], alpha: float, spending: str = "obf") -> tuple[float, ...]:
    """The critical |T| at each look (two-sided), spending ``alpha`` as ``spending`` says."""
    from scipy.stats import t as student

    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be between 0 and 1, not {alpha}")
    t_all = _paths(design_looks[-1])
    alive = np.ones(PATHS, dtype=bool)
    out = []
    crossed = 0.0  # the share of paths already stopped (the alpha actually spent so far)
    for k, n in enumerate(design_looks):
        target = spent(n / design_looks[-1], alpha, spending) if k < len(design_looks) - 1 else alpha
        want = target - crossed
        tk = t_all[:, n - 2]
        if want * PATHS < 200:  # too little to resolve by simulation: the marginal quantile spends at most `want`
            c = float(student.ppf(1 - max(want, 1e-300) / 2, n - 1)) if want > 0 else math.inf
        else:
            vals = np.sort(tk[alive])[::-1]
            count = int(round(want * PATHS))
            c = float(vals[min(count, len(vals) - 1)]) if count < len(vals) else 0.0
            # ties at c are not crossings (|T| >= c crosses): nudge up to the next representable value
            c = float(np.nextafter(c, math.inf))
        hit = alive & (tk >= c)
        crossed += hit.sum() / PATHS
        alive &= ~hit
        out.append(c)
    return tuple(out)


@dataclass
class Look:
    """One comparison at one look."""

    n: int
    mean: float  # mean paired difference (system - baseline)
    sd: float
    t: float
    boundary: float  # the critical |t| at this look for this comparison's share of alpha
    low: float  # the repeated confidence interval
    high: float
    alpha: float  # this comparison's share of alpha at this look (Holm)
    decision: str
    shift: float = 0.0  # tuned cells: the choices' estimated lift taken off ``mean`` (nas_cli.report.selection)


@dataclass
class Comparison:
    """One system configuration against its baseline, look by look."""

    name: str
    baseline: str
    looks: list[Look] = field(default_factory=list)
    decision: str = CONTINUE

    @property
    def last(self) -> Look | None:
        return self.looks[-1] if self.looks else None

    @property
    def open(self) -> bool:
        return self.decision == CONTINUE

    @property
    def n(self) -> int:
        return self.last.n if self.last else 0


def _look(d: np.ndarray, c: float, alpha: float, delta: float | None, final: bool, lift: float = 0.0) -> Look:
    """Decide one comparison at one look from its ``n`` paired differences ``d``; ``lift``: the tuned choices'
    estimated lift (system's less baseline's), taken off the mean toward zero where it points the mean's way."""
    from scipy.stats import t as student

    n = len(d)
    mean = float(d.mean())
    shift = math.copysign(min(abs(lift), abs(mean)), mean) if lift and mean and (lift > 0) == (mean > 0) else 0.0
    mean -= shift
    sd = float(d.std(ddof=1))
    se = sd / math.sqrt(n)
    if sd > 0:
        t = mean / se
        low, high = mean - c * se, mean + c * se
    else:  # equal differences (a metric with few values): no t; the exact sign-flip p 2^(1-n) must clear
        t = 0.0 if mean == 0 else math.copysign(math.inf, mean)  # the look's nominal level
        nominal = 2 * float(student.sf(c, n - 1)) if math.isfinite(c) else 0.0
        decided = mean != 0 and 2.0 ** (1 - n) <= nominal
        # no spread, no interval: equal nonzero differences count only through the sign-flip p, and
        # differences all exactly 0 (e.g. a metric at its ceiling) bound nothing: the comparison goes on
        low, high = (mean, mean) if decided else (-math.inf, math.inf)
    if low > 0:
        decision = HIGHER
    elif high < 0:
        decision = LOWER
    elif delta is not None and -delta < low and high < delta:
        decision = EQUIVALENT
    else:
        decision = UNDECIDED if final else CONTINUE
    return Look(n, mean, sd, t, c, low, high, alpha, decision, shift)


@dataclass(frozen=True)
class Chosen:
    """A tuned cell's numbers for :func:`decide` (``seed=auto`` with ``tune=[...]``): for each candidate value
    of the tuned options, in grid order, its validation and its test numbers in seed order. At a look at
    n seeds the cell is the candidate with the best mean validation number over those n seeds (a tie: the
    first in grid order), re-chosen at every look on the verdict's own seeds, and its test numbers are the
    ones compared, less the choice's estimated lift (:func:`_lift`); the test numbers never take part in the
    choice. The calibration of this protocol is ``python benchmarks/tuning_sequential_calibration.py``
    (docs/tuning_sequential.json)."""

    validation: tuple[tuple[float, ...], ...]
    test: tuple[tuple[float, ...], ...]
    higher_is_better: bool

    def __len__(self) -> int:
        """The seeds every candidate has both numbers of."""
        return min(min(len(v), len(t)) for v, t in zip(self.validation, self.test))

    def pick(self, n: int) -> int:
        """The index of the candidate chosen on the first ``n`` seeds."""
        means = [sum(v[:n]) / n for v in self.validation]
        best = max(means) if self.higher_is_better else min(means)
        return means.index(best)

    def first(self, n: int) -> tuple[float, ...]:
        return tuple(self.test[self.pick(n)][:n])


def _lift(values: "Sequence[float] | Chosen", n: int) -> float:
    """A tuned cell's estimated lift from choosing on the first ``n`` seeds (Harrell's optimism of the choice,
    :func:`nas_cli.report.selection.optimism`); 0 for plain values."""
    if not isinstance(values, Chosen) or n < 2:
        return 0.0
    from nas_cli.report.selection import optimism

    val = np.array([v[:n] for v in values.validation], dtype=np.float64).T
    test = np.array([t[:n] for t in values.test], dtype=np.float64).T
    return optimism(val, test, values.higher_is_better)


def _first(values: "Sequence[float] | Chosen", n: int) -> Sequence[float]:
    """The first ``n`` values of one side of a comparison: of a list, or of a tuned cell's choice on those seeds."""
    return values.first(n) if isinstance(values, Chosen) else values[:n]


def decide(pairs: dict[str, tuple[str, "Sequence[float] | Chosen", "Sequence[float] | Chosen"]],
           design_looks: Sequence[int],
           alpha: float = 0.05, spending: str = "obf", delta: float | None = None) -> dict[str, Comparison]:
    """Replay every look that the data reach and return each comparison's state.

    ``pairs``: name -> (baseline name, baseline values, system values), the values in seed order
    (value i of both is seed i), or a tuned cell's :class:`Chosen` (the candidate chosen at each look). A comparison is looked at, at look n, when both lists have n
    values; the replay stops at the first look some open comparison cannot reach yet (its next
    round has not run). Holm's shares of alpha carry through the looks (see the module text)."""
    design_looks = tuple(int(n) for n in design_looks)
    m = len(pairs)
    out = {name: Comparison(name, base) for name, (base, _, _) in pairs.items()}
    rejected = 0
    for k, n in enumerate(design_looks):
        reached = [name for name, c in out.items() if c.open]
        if not reached or any(min(len(pairs[name][1]), len(pairs[name][2])) < n for name in reached):
            break  # the next round has not run (for every open comparison) yet
        final = k == len(design_looks) - 1
        pending = reached
        lifts = {name: _lift(pairs[name][2], n) - _lift(pairs[name][1], n) for name in reached}
        while pending:  # Holm: a rejection raises the others' share, and they are looked at again
            share = alpha / (m - rejected)
            c = boundaries(design_looks, share, spending)[k]
            newly = []
            for name in pending:
                _, b, s = pairs[name]
                d = np.asarray(_first(s, n), dtype=np.float64) - np.asarray(_first(b, n), dtype=np.float64)
                look = _look(d, c, share, delta, final, lifts[name])
                comp = out[name]
                if comp.looks and comp.looks[-1].n == n:
                    comp.looks[-1] = look
                else:
                    comp.looks.append(look)
                if look.decision in (HIGHER, LOWER):
                    newly.append(name)
            rejected += len(newly)
            pending = [name for name in pending if name not in newly] if newly else []
        for name in reached:
            out[name].decision = out[name].looks[-1].decision
    return out


def fixed_n_boundary(n: int, alpha: float) -> float:
    """The fixed-n two-sided paired t critical value (for comparing plans)."""
    from scipy.stats import t as student

    return float(student.ppf(1 - alpha / 2, n - 1))


#: decision codes of :func:`outcomes`
CODES = MappingProxyType({HIGHER: 1, LOWER: -1, EQUIVALENT: 2, UNDECIDED: 0})


def outcomes(d: np.ndarray, design_looks: Sequence[int], alpha: float = 0.05, spending: str = "obf",
             delta: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One comparison on many simulated sweeps at once (for calibration and planning): ``d`` is
    (sweeps, max_seeds) paired differences in seed order. Returns each sweep's decision code
    (:data:`CODES`) and the number of paired seeds it stopped at; the rule is :func:`decide`'s."""
    from scipy.stats import t as student

    design_looks = tuple(int(n) for n in design_looks)
    c = boundaries(design_looks, alpha, spending)
    d = np.asarray(d, dtype=np.float64)
    code = np.zeros(len(d), dtype=np.int64)
    stop = np.full(len(d), design_looks[-1], dtype=np.int64)
    open_ = np.ones(len(d), dtype=bool)
    for k, n in enumerate(design_looks):
        x = d[:, :n]
        mean = x.mean(axis=1)
        sd = x.std(axis=1, ddof=1)
        se = sd / math.sqrt(n)
        low, high = mean - c[k] * se, mean + c[k] * se
        nominal = 2 * float(student.sf(c[k], n - 1)) if math.isfinite(c[k]) else 0.0
        flat = sd == 0
        sure = flat & (mean != 0) & (2.0 ** (1 - n) <= nominal)
        low = np.where(flat, np.where(sure, mean, -np.inf), low)
        high = np.where(flat, np.where(sure, mean, np.inf), high)
        got = np.zeros(len(d), dtype=np.int64)
        got[low > 0] = 1
        got[high < 0] = -1
        if delta is not None:
            got[(got == 0) & (low > -delta) & (high < delta)] = 2
        now = open_ & (got != 0)
        code[now] = got[now]
        stop[now] = n
        open_ &= ~now
    return code, stop
