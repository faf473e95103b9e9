"""Question (b) of nas-report, on this test set, per trained model (supporting detail, never a
verdict over seeds); question (a), over seeds, is :mod:`nas_cli.report.stats`.

Is this model better than that one on these sentences?
:func:`compare_items` compares two runs of one seed on their per-item test outputs:

- BLEU, chrF, perplexity, ROUGE: paired approximate randomization with ties counted,
  p = (1 + #{|d*| >= |d|}) / (R + 1); exact (every swap pattern enumerated) when at most
  :data:`EXACT_MAX` items differ, else R random swap patterns, stopping early (Besag and
  Clifford 1991) once :data:`SEQUENTIAL_H` patterns were at least as extreme;
- exact match: McNemar's exact test (binomial test on the discordant items);
- an interval: the paired bootstrap over test items (percentile, 95%).

Every resample is a sum of per-item sufficient statistics (sacreBLEU's for BLEU and chrF, the
NLL sum and token count for perplexity), extracted once per run and resampled as a matrix
product; the corpus score of a sum is computed the way sacreBLEU computes it.
"""
from __future__ import annotations

from types import MappingProxyType
import functools
import math
from dataclasses import dataclass
from typing import Callable
from collections.abc import Mapping

import numpy as np

#: default numbers of resamples
BOOTSTRAP_SAMPLES = 1000
AR_TRIALS = 10000
SEED = 12345
#: approximate randomization enumerates every swap pattern when at most this many items differ
EXACT_MAX = 16
#: ... and otherwise stops once this many random patterns were at least as extreme
SEQUENTIAL_H = 50


# ---- per-item statistics and corpus scores -------------------------------------------------------------
@dataclass
class Metric:
    """How one test metric is computed from per-item statistics of one run."""

    name: str  # summary key, e.g. test/bleu
    higher_is_better: bool
    stats: Callable[[dict], np.ndarray]  # items -> (n_items, k) statistics
    score: Callable[[np.ndarray], float]  # summed statistics (k,) -> corpus score (the reference)
    vscore: Callable[[np.ndarray], np.ndarray]  # (..., k) summed statistics -> (...) scores, vectorized
    test: str  # "ar" | "mcnemar"
    integer: bool = True  # statistics are counts (exact in float32 sums)


def _sacre(kind: str):
    from sacrebleu.metrics import BLEU, CHRF

    return BLEU(force=True) if kind == "bleu" else CHRF()  # force: the text is scored as the run scored it


def _sacre_stats(kind: str) -> Callable[[dict], np.ndarray]:
    def stats(items: dict) -> np.ndarray:
        metric = _with_references(kind, tuple(items["refs"]))
        return np.asarray(metric._extract_corpus_statistics(items["hyps"], None), dtype=np.float64)
    return stats


@functools.lru_cache(maxsize=2)
def _with_references(kind: str, refs: tuple[str, ...]):
    """A sacreBLEU metric with the references' n-grams cached: every run of a sweep is scored against
    the same references, which are processed once (nas-report refuses a mix of test sets)."""
    metric = _sacre(kind)
    metric._ref_cache = metric._cache_references([list(refs)])
    return metric


def _sacre_score(kind: str) -> Callable[[np.ndarray], float]:
    metric = _sacre(kind)
    return lambda total: float(metric._compute_score_from_stats(list(total)).score)


def bleu_from_stats(s: np.ndarray) -> np.ndarray:
    """sacreBLEU's corpus BLEU (default: exp smoothing, 4-grams) of summed statistics
    ``[sys_len, ref_len, correct_1..4, total_1..4]`` along the last axis, vectorized."""
    s = np.asarray(s, dtype=np.float64)
    sys_len, ref_len = s[..., 0], s[..., 1]
    correct, total = s[..., 2:6], s[..., 6:10]
    with np.errstate(divide="ignore", invalid="ignore"):
        bp = np.where(sys_len < ref_len, np.where(sys_len > 0, np.exp(1 - ref_len / sys_len), 0.0), 1.0)
        zero = correct == 0
        smooth = 2.0 ** np.cumsum(zero, axis=-1)  # exp smoothing: 2, 4, 8 ... over the orders without matches
        prec = np.where(zero, 100.0 / (smooth * total), 100.0 * correct / total)
        logs = np.log(prec)
        mean_log = (((logs[..., 0] + logs[..., 1]) + logs[..., 2]) + logs[..., 3]) / 4
        score = bp * np.exp(mean_log)
    dead = (total == 0).any(-1) | ~(correct > 0).any(-1)  # sacreBLEU: no matches or an order without n-grams
    return np.where(dead, 0.0, score)


def chrf_from_stats(s: np.ndarray, order: int = 6, beta: int = 2) -> np.ndarray:
    """sacreBLEU's chrF (character 6-grams, beta 2, effective-order averaging) of summed statistics
    ``[hyp, ref, match] x order`` along the last axis, vectorized."""
    s = np.asarray(s, dtype=np.float64)
    hyp, ref, match = s[..., 0::3][..., :order], s[..., 1::3][..., :order], s[..., 2::3][..., :order]
    factor = beta ** 2
    with np.errstate(divide="ignore", invalid="ignore"):
        prec = np.where(hyp > 0, match / hyp, 1e-16)
        rec = np.where(ref > 0, match / ref, 1e-16)
        eff = (hyp > 0) & (ref > 0)
        count = eff.sum(-1)
        avg_p = np.where(count > 0, (prec * eff).sum(-1) / np.maximum(count, 1), 0.0)
        avg_r = np.where(count > 0, (rec * eff).sum(-1) / np.maximum(count, 1), 0.0)
        score = 100 * (1 + factor) * avg_p * avg_r / (factor * avg_p + avg_r)
    return np.where(avg_p + avg_r > 0, score, 0.0)


def _rouge_stats(key: str) -> Callable[[dict], np.ndarray]:
    def stats(items: dict) -> np.ndarray:
        from rouge_score import rouge_scorer

        scorer = rouge_scorer.RougeScorer([key], use_stemmer=True)
        f = [scorer.score(r, h)[key].fmeasure * 100 for h, r in zip(items["hyps"], items["refs"])]
        return np.stack([np.asarray(f), np.ones(len(f))], axis=1)
    return stats


def _mean_score(total: np.ndarray) -> float:
    return float(total[0] / max(total[1], 1))


def _vmean(total: np.ndarray) -> np.ndarray:
    return total[..., 0] / np.maximum(total[..., 1], 1)


def _vppl(total: np.ndarray) -> np.ndarray:
    return np.exp(np.minimum(total[..., 0] / np.maximum(total[..., 1], 1), 50))


_FIXED = MappingProxyType({
    "test/bleu": Metric("test/bleu", True, _sacre_stats("bleu"), _sacre_score("bleu"), bleu_from_stats, "ar"),
    "test/chrf": Metric("test/chrf", True, _sacre_stats("chrf"), _sacre_score("chrf"), chrf_from_stats, "ar"),
    "test/exact_match": Metric("test/exact_match", True,
                               lambda it: np.stack([np.asarray(it["exact"], float), np.ones(len(it["exact"]))], 1),
                               _mean_score, _vmean, "mcnemar"),
    "test/ppl": Metric("test/ppl", False,
                       lambda it: np.stack([np.asarray(it["nll"], float), np.asarray(it["tokens"], float)], 1),
                       lambda t: float(math.exp(min(t[0] / max(t[1], 1), 50))), _vppl, "ar", integer=False),
    **{f"test/{k}": Metric(f"test/{k}", True, _rouge_stats(k), _mean_score, _vmean, "ar", integer=False)
       for k in ("rouge1", "rouge2", "rougeL")},
})
#: zero-shot scores from lm-evaluation-harness (nas_cli/zeroshot/): test/zeroshot/<task>/<metric>
ZERO_SHOT = "test/zeroshot/"


def _zero_shot(name: str) -> Metric | None:
    """A zero-shot accuracy (per item 0/1: McNemar) or LAMBADA-style perplexity (per item the continuation's
    log-likelihood: exp of the mean negative one, approximate randomization), read from ``items["zeroshot"]``."""
    task, _, metric = name.removeprefix(ZERO_SHOT).partition("/")
    if metric in ("acc", "acc_norm"):
        def acc(items: dict) -> np.ndarray:
            x = np.asarray(items["zeroshot"][task][metric], float)
            return np.stack([x, np.ones(len(x))], 1)
        return Metric(name, True, acc, _mean_score, _vmean, "mcnemar")
    if metric == "perplexity":
        def nll(items: dict) -> np.ndarray:
            x = -np.asarray(items["zeroshot"][task]["perplexity"], float)
            return np.stack([x, np.ones(len(x))], 1)
        return Metric(name, False, nll, lambda t: float(math.exp(min(t[0] / max(t[1], 1), 50))), _vppl, "ar",
                      integer=False)
    return None


#: passkey retrieval in a pretrained model's held-out text (nas-eval --passkey): test/passkey/<length>[/depth<d>]
PASSKEY = "test/passkey/"


def _passkey(name: str) -> Metric:
    """A passkey share (per probe 0/1, retrieved or not: McNemar), read from ``items["passkey"][name]``."""
    def hits(items: dict) -> np.ndarray:
        x = np.asarray(items["passkey"][name], float)
        return np.stack([x, np.ones(len(x))], 1)
    return Metric(name, True, hits, _mean_score, _vmean, "mcnemar")


@dataclass(frozen=True)
class _Metrics(Mapping):
    """The metrics with per-item statistics: the fixed ones above and every zero-shot accuracy or perplexity
    (stateless: every lookup builds the zero-shot ones from their names)."""

    def __getitem__(self, name: str) -> Metric:
        found = _FIXED.get(name) or (_zero_shot(name) if str(name).startswith(ZERO_SHOT) else
                                     _passkey(name) if str(name).startswith(PASSKEY) else None)
        if found is None:
            raise KeyError(name)
        return found

    def __contains__(self, name) -> bool:
        try:
            self[name]
        except KeyError:
            return False
        return True

    def __iter__(self):
        return iter(_FIXED)

    def __len__(self) -> int:
        return len(_FIXED)


METRICS = _Metrics()


def needs_text(metric: str) -> bool:
    return metric in ("test/bleu", "test/chrf") or metric.startswith("test/rouge")


# ---- question (b): one seed's two models on the test set ----------------------------------------------
@dataclass
class ItemComparison:
    """Two runs of one seed compared on their test items (not a verdict over seeds)."""

    metric: str
    seed: object
    base: float
    system: float
    diff: float
    low: float  # paired bootstrap over the items
    high: float
    p: float
    test: str
    differing: int = 0  # items whose statistics differ between the two runs


def _chunks(total: int, size: int):
    done = 0
    while done < total:
        yield min(size, total - done)
        done += size


def ar_test(vscore: Callable[[np.ndarray], np.ndarray], base: np.ndarray, system: np.ndarray, trials: int,
            rng: np.random.Generator, exact_max: int = EXACT_MAX, h: int = SEQUENTIAL_H,
            dtype=np.float64) -> tuple[float, str, int]:
    """Paired approximate randomization, ties counted: (p, how, differing items). Each trial
    swaps each item's two statistics rows with probability 1/2 and recomputes the difference of
    corpus scores; p counts the trials with |d*| >= |d| (within round-off). Items with equal rows
    cannot change anything and are left out. At most ``exact_max`` differing items: every one of
    the 2^k swap patterns (the exact permutation p). Otherwise ``trials`` random patterns,
    p = (1 + count) / (trials + 1), stopping at the ``h``-th pattern at least as extreme
    (Besag-Clifford: p = h / patterns drawn), which is as valid and much faster when p is large."""
    base = np.asarray(base, dtype=np.float64)
    system = np.asarray(system, dtype=np.float64)
    sb, ss = base.sum(0), system.sum(0)
    observed = float(vscore(ss) - vscore(sb))
    delta = base - system  # swapping item i moves delta[i] into the system's sum and out of the baseline's
    keep = np.any(delta != 0, axis=1)
    delta = delta[keep]
    k = int(keep.sum())
    if k == 0:
        return 1.0, "no item differs", 0
    tol = 1e-9 * max(1.0, abs(observed))

    def extreme(masks: np.ndarray) -> np.ndarray:
        moved = masks.astype(dtype) @ delta.astype(dtype)
        d = vscore(ss + moved) - vscore(sb - moved)
        return np.abs(d) >= abs(observed) - tol

    if k <= exact_max:
        patterns = ((np.arange(2 ** k)[:, None] >> np.arange(k)) & 1).astype(np.float64)
        count = int(extreme(patterns).sum())
        return count / 2 ** k, f"exact permutation test ({k} differing items, all {2 ** k} swap patterns)", k
    count = drawn = 0
    for size in _chunks(trials, 1000):
        masks = rng.integers(0, 2, size=(size, k), dtype=np.int8)
        hits = extreme(masks)
        cum = np.cumsum(hits)
        if count + cum[-1] >= h:  # the h-th extreme pattern is in this chunk
            at = int(np.searchsorted(cum, h - count)) + 1
            return h / (drawn + at), (f"approximate randomization, ties counted (stopped after {h} of "
                                      f"{drawn + at} patterns at least as extreme)"), k
        count += int(cum[-1])
        drawn += size
    return (count + 1) / (drawn + 1), f"approximate randomization, ties counted ({drawn} trials)", k


def bootstrap_interval(vscore: Callable[[np.ndarray], np.ndarray], base: np.ndarray, system: np.ndarray,
                       samples: int, rng: np.random.Generator, level: float = 0.95,
                       dtype=np.float64) -> tuple[float, float]:
    """Percentile interval of score(system) - score(baseline) over ``samples`` resamples of the
    items (the same items for both: paired), as count vectors times the statistics matrices."""
    n = base.shape[0]
    both = np.concatenate([system, base], axis=1).astype(dtype)
    kdim = system.shape[1]
    out = []
    for size in _chunks(samples, 250):
        idx = rng.integers(0, n, size=(size, n))
        flat = (idx + (np.arange(size) * n)[:, None]).ravel()
        counts = np.bincount(flat, minlength=size * n).reshape(size, n).astype(dtype)
        sums = counts @ both
        out.append(vscore(sums[:, :kdim].astype(np.float64)) - vscore(sums[:, kdim:].astype(np.float64)))
    boot = np.concatenate(out)
    a = (1 - level) / 2 * 100
    low, high = np.percentile(boot, [a, 100 - a])
    return float(low), float(high)


def compare_items(metric: str, base_stats: np.ndarray, system_stats: np.ndarray, seed=None,
                  samples: int = BOOTSTRAP_SAMPLES, trials: int = AR_TRIALS, rng_seed: int = SEED,
                  base_items: dict | None = None, system_items: dict | None = None) -> ItemComparison:
    """Two runs of one seed on the same test items, from their per-item statistics
    (``Metric.stats``): the corpus scores as sacreBLEU computes them, the difference, a paired
    bootstrap interval over the items, and the item-level p (AR with ties, or McNemar)."""
    spec = METRICS[metric]
    import zlib

    # a stable stream per seed (str hashes change between processes: the same report must repeat)
    rng = np.random.default_rng([rng_seed, zlib.crc32(str(seed).encode())])
    b, s = spec.score(base_stats.sum(0)), spec.score(system_stats.sum(0))
    dtype = np.float32 if spec.integer and max(base_stats.sum(0).max(), system_stats.sum(0).max()) < 2 ** 23 \
        else np.float64
    low, high = bootstrap_interval(spec.vscore, base_stats, system_stats, samples, rng, dtype=dtype)
    if spec.test == "mcnemar":
        p, differing = _mcnemar(base_stats[:, 0], system_stats[:, 0])
        test = "McNemar exact test (discordant items)"
    else:
        p, test, differing = ar_test(spec.vscore, base_stats, system_stats, trials, rng, dtype=dtype)
    return ItemComparison(metric, seed, b, s, s - b, low, high, float(p), test, differing)


def _mcnemar(base: np.ndarray, system: np.ndarray) -> tuple[float, int]:
    from scipy import stats

    only_s, only_b = int(((system == 1) & (base == 0)).sum()), int(((system == 0) & (base == 1)).sum())
    if only_s + only_b == 0:
        return 1.0, 0
    return float(stats.binomtest(only_s, only_s + only_b, 0.5).pvalue), only_s + only_b
