"""The test metrics, one list for every table: nas-run's result table, nas-report's table, its
verdicts and its JSON. A task reports whatever ``test/<name>`` numbers its ``score()`` returns;
the ones named here get their title, format and better direction, and any other (a user
task's ``test/digit_acc``) still gets a column and a verdict, titled by its name, with no
better direction (the verdict then says higher/lower). ``nas_cli.report.stats.METRICS`` adds,
for some of them, how to resample per-item outputs; it is keyed by the same names.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class TestMetric:
    key: str  # summary.json's name, e.g. test/bleu
    title: str  # the column title in every table
    higher_is_better: bool | None  # None: no better direction known
    fmt: str = "p2"  # pct (a share shown as %), p2 / p3 (decimals)
    compared: bool = True  # gets a verdict by default (not, e.g., the share of empty outputs)


#: in column order
KNOWN: tuple[TestMetric, ...] = (
    TestMetric("test/exact_match", "exact match", True, "pct"),
    TestMetric("test/bleu", "BLEU", True),
    TestMetric("test/bleu_tok", "tok. BLEU", True),
    TestMetric("test/chrf", "chrF", True),
    TestMetric("test/rouge1", "ROUGE-1", True),
    TestMetric("test/rouge2", "ROUGE-2", True),
    TestMetric("test/rougeL", "ROUGE-L", True),
    TestMetric("test/rougeLsum", "ROUGE-Lsum", True),
    TestMetric("test/ppl", "test ppl", False, "p3"),
    TestMetric("test/empty", "empty", False, "pct", compared=False),
)
#: reported by every run but not shown: test perplexity says the same as the loss, more readably
HIDDEN = frozenset({"test/loss", "test/token_acc"})
_BY_KEY = {m.key: m for m in KNOWN}


def spec(key: str) -> TestMetric:
    """A metric by its summary name; one nas-run does not know is titled by its name."""
    return _BY_KEY.get(key) or TestMetric(key, key.removeprefix("test/"), None, "p3")


def present(keys: Iterable[str]) -> list[TestMetric]:
    """The metrics among ``keys`` (summary.json names) that tables show: the known ones in their
    order, then any other ``test/*`` name a task reported, sorted."""
    keys = {k for k in keys if k.startswith("test/") and k not in HIDDEN}
    return [m for m in KNOWN if m.key in keys] + [spec(k) for k in sorted(keys - set(_BY_KEY))]
