"""The families of tests nas-report's Holm adjustment runs over: per metric, the groups compared with the
baseline; the loss per position bucket of one length, every bucket and group at once; the zero-shot scores,
every task, metric and group at once."""
from __future__ import annotations

from nas_cli.report import stats


def holm(found: list) -> list:
    """Holm-adjust one metric's p-values over the groups compared with the baseline."""
    for row, p in zip(found, stats.holm([r.comparison.p for r in found])):
        row.comparison.p_adj = p
    return found


#: the loss per position bucket (``test/pos_loss_<lo>_<hi>``, tasks/subword_lm.py): one family of tests
POSITION_BUCKETS = "test/pos_loss_"


def holm_over_buckets(rows: list) -> list:
    """The position buckets of one evaluated length are one family: their p-values are Holm-adjusted over
    every bucket and every group compared (a scheme "better at some position" is one question)."""
    families: dict[str, list] = {}
    for r in rows:
        base, _, length = r.comparison.metric.partition("@")
        if base.startswith(POSITION_BUCKETS) and not r.comparison.undefined:
            families.setdefault(length, []).append(r)
    for found in families.values():
        if len({r.comparison.metric for r in found}) > 1:
            holm(found)
    return rows


#: lm-evaluation-harness's zero-shot scores (``test/zeroshot/<task>/<metric>``, nas_cli/zeroshot/)
ZERO_SHOT = "test/zeroshot/"


#: passkey retrieval of nas-eval --passkey (``test/passkey/<length>[/depth<d>]``, nas_cli/pipeline/passkey.py)
PASSKEY = "test/passkey/"


def holm_over_evaluations(rows: list) -> list:
    """The zero-shot numbers compared are one family: their p-values are Holm-adjusted over every task, metric
    and group at once (a scheme "better on some benchmark" is one question). So are the passkey grid's numbers,
    over every length, depth and group ("retrieves better somewhere" is one question)."""
    for prefix in (ZERO_SHOT, PASSKEY):
        found = [r for r in rows if r.comparison.metric.startswith(prefix) and not r.comparison.undefined]
        if len({r.comparison.metric for r in found}) > 1:
            holm(found)
    return rows
