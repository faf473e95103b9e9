"""The test metrics, one list for every table: nas-run's result table, nas-report's table, its
verdicts and its JSON. A task reports whatever ``test/<name>`` numbers its ``score()`` returns;
the ones named here get their title, format and better direction. A task declares its own
(``Task.metrics``: ``{"digit_acc": ("digit acc.", True)}``); the run records the declaration in
``summary.json`` (``metrics``), and every table reads it from there through :func:`declare`.
Any other ``test/*`` number still gets a column and a verdict, titled by its name, with no
better direction (the verdict then says higher/lower). ``nas_cli.report.items.METRICS`` adds,
for some of them, how to resample per-item outputs; it is keyed by the same names.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence


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
#: the loss per position bucket (``test/pos_loss_<lo>_<hi>``): in summary.json, W&B and nas-report's --metrics,
#: not a column of every table
HIDDEN_PREFIXES = ("test/pos_loss_", "test/retrieval_acc_depth")
_BY_KEY = {m.key: m for m in KNOWN}
#: the metrics tasks declared, as read from the runs' summary.json (:func:`declare`)
_DECLARED: dict[str, TestMetric] = {}


def declaration(task_metrics: Mapping[str, Sequence] | None) -> dict[str, list]:
    """A task's ``metrics`` ({key: (title, higher_is_better[, fmt])}) as summary.json records it:
    {"test/<key>": [title, higher_is_better, fmt]}."""
    out = {}
    for key, spec_ in (task_metrics or {}).items():
        title, higher, *fmt = spec_
        if higher not in (True, False, None) or (fmt and fmt[0] not in ("p2", "p3", "pct")):
            raise ValueError(f"task metric '{key}': declare it as (title, higher_is_better: True/False/None"
                             f"[, 'p2'|'p3'|'pct']), not {tuple(spec_)!r}")
        out[f"test/{key}"] = [str(title), higher, fmt[0] if fmt else "p3"]
    return out


def declare(recorded: Mapping[str, Sequence] | None) -> None:
    """Make a run's recorded declaration (summary.json ``metrics``) known to every table and
    verdict in this process. Built-in metrics keep their own entry; the first declaration of a
    name wins."""
    for key, (title, higher, fmt) in (recorded or {}).items():
        if key not in _BY_KEY:
            _DECLARED.setdefault(key, TestMetric(key, str(title), higher, str(fmt)))


def spec(key: str) -> TestMetric:
    """A metric by its summary name: built in, declared by a task, or else titled by its name."""
    return _BY_KEY.get(key) or _DECLARED.get(key) or TestMetric(key, key.removeprefix("test/"), None, "p3")


def present(keys: Iterable[str]) -> list[TestMetric]:
    """The metrics among ``keys`` (summary.json names) that tables show: the known ones in their
    order, then any other ``test/*`` name a task reported, sorted."""
    keys = {k for k in keys if k.startswith("test/") and k.split("@")[0] not in HIDDEN
            and not k.startswith(HIDDEN_PREFIXES)}
    return [m for m in KNOWN if m.key in keys] + [spec(k) for k in sorted(keys - set(_BY_KEY), key=_order)]


def _order(key: str) -> tuple:
    """A metric's place among the other ones: by name, then a metric at other lengths
    (``test/ppl@1024``, ``eval_lengths``) after it, by length."""
    base, _, length = key.partition("@")
    return (base, int(length) if length.isdigit() else -1, key)


#: a metric at another length than the trained one (``eval_lengths``): test/<metric>@<length>
_AT_LENGTH = re.compile(r"^(test/.+)@(\d+)$")


def split_key(key: str) -> tuple[str, int] | None:
    """``test/ppl@1024`` -> ("test/ppl", 1024); None for a key of no other length."""
    m = _AT_LENGTH.match(key)
    return (m.group(1), int(m.group(2))) if m else None
