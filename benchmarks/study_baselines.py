"""docs/study.md's third round (generated): today's baselines on MQAR and on WikiText-2 trained at 256
tokens and tested at 256 to 2,048 (the sweeps of benchmarks/study_queue_lengths.sh). Each verdict is
nas-report's (``compare_groups``: a paired t-test over the seeds, Holm over the schemes of one claim);
a claim with a run missing says so. Called by ``study_report.py``."""
from __future__ import annotations

import math
from pathlib import Path

from nas_cli.report.collect import find_runs
from nas_cli.report.compare import compare_groups
from nas_cli.report.table import Group, group_runs

from study_common import ci_text, p_text, study_roots

HEADING = "## Today's baselines: MQAR and length generalization (generated)"
#: MQAR's cells (task.seq_len, its sweeps) and the length sweeps, under benchmarks/study/
MQAR = {64: ("mqar64_rope", "mqar64_unas", "mqar64_none"), 128: ("mqar128_rope", "mqar128_unas", "mqar128_none")}
LENGTHS = ("wikitext2_lengths_rope", "wikitext2_lengths_unas", "wikitext2_lengths_none")
TESTED = (256, 512, 1024, 2048)
#: the rows of the tables, in order: (scheme, model.positions)
CONFIGS = (("unas", "rope"), ("unas", "sinusoidal"), ("unas", "alibi"), ("unas", "none"), ("dnas", "rope"),
           ("hnas", "rope"), ("sigmoid", "rope"), ("softpick", "rope"), ("gated", "rope"), ("differential", "rope"),
           ("selective", "rope"), ("forgetting", "none"), ("stickbreaking", "none"))
#: MQAR counts as solved at a cell when every seed's test query accuracy is at least this
SOLVED = 0.99
#: "matches": equivalent within this many points of test perplexity (WikiText-2 at 256 tokens), fixed
#: before any of the length runs finished
MATCH_MARGIN = 5.0


def _key(g: Group) -> tuple[str, str, int | None, int | None]:
    r = g.runs[0]
    return r.scheme, str(r._cfg("model.positions")), r._cfg("model.d_model"), r._cfg("task.seq_len")


def _groups(study: Path, names) -> dict[tuple, Group]:
    roots = study_roots([study / n for n in names])
    runs = [r for r in find_runs(roots) if r.finished] if roots else []
    return {_key(g): g for g in group_runs(runs)} if runs else {}


def _compare(base: Group | None, systems: list[Group | None], metric: str, margin: float | None = None):
    """nas-report's rows of ``systems`` against ``base`` on ``metric`` (Holm over the systems; with
    ``margin``, its equivalence verdict too), or None."""
    present = [g for g in systems if g is not None]
    if base is None or not present or base.n < 2 or any(g.n < 2 for g in present):
        return None
    key = metric if metric.startswith("test/") or ":" in metric or "sink" in metric else f"test/{metric}"
    return compare_groups([base, *present], base, [metric], samples=200, trials=1000, item_tests=False,
                          equivalence={key: margin} if margin else None)


def _diff(row, fmt: str = "{:+.2f}") -> str:
    c = row.comparison
    if math.isnan(c.low):
        return f"{fmt.format(c.diff)} (n={len(c.seeds)}, no interval)"
    p = p_text(c.p_adj if c.p_adj is not None else c.p)
    return f"{fmt.format(c.diff)} [{fmt.format(c.low)}, {fmt.format(c.high)}], p(Holm){p if p.startswith('<') else '=' + p}"


def mqar_table(study: Path) -> list[str]:
    cells = [(s, d) for s in MQAR for d in (64, 128)]
    groups = {s: _groups(study, names) for s, names in MQAR.items()}
    head = "| scheme (positions) | " + " | ".join(f"seq {s}, d_model {d}" for s, d in cells) + " |"
    lines = [head, "|---|" + "---|" * len(cells)]
    for scheme, positions in CONFIGS:
        row = [ci_text(groups[s].get((scheme, positions, d, s)), "test/query_acc", "{:.1f}", 100) for s, d in cells]
        lines.append(f"| {scheme} ({positions}) | " + " | ".join(row) + " |")
    return lines


def lengths_table(study: Path) -> list[str]:
    groups = _groups(study, LENGTHS)
    names = ["test/ppl"] + [f"test/ppl@{n}" for n in TESTED[1:]]
    lines = ["| scheme (positions) | " + " | ".join(f"ppl at {n}" for n in TESTED) + " | sink rate |",
             "|---|" + "---|" * (len(TESTED) + 1)]
    for scheme, positions in CONFIGS:
        g = next((v for k, v in groups.items() if k[:2] == (scheme, positions)), None)
        row = [ci_text(g, n, "{:.1f}") for n in names] + [ci_text(g, "sink_rate", "{:.2f}")]
        lines.append(f"| {scheme} ({positions}) | " + " | ".join(row) + " |")
    return lines


def _lm(groups: dict, scheme: str, positions: str) -> Group | None:
    return next((v for k, v in groups.items() if k[:2] == (scheme, positions)), None)


def claims(study: Path) -> list[str]:
    lm = _groups(study, LENGTHS)
    base = _lm(lm, "unas", "rope")
    out = ["| claim (paper) | measured here | verdict |", "|---|---|---|"]

    def row(claim, measured, verdict):
        out.append(f"| {claim} | {measured} | {verdict} |")

    # sigmoid matches softmax: an equivalence verdict at a margin fixed before any run finished
    r = _compare(base, [_lm(lm, "sigmoid", "rope")], "test/ppl", MATCH_MARGIN)
    if r is None:
        verdict = "undecided"
    elif r[0].comparison.direction() != 0:
        verdict = "differs: sigmoid " + ("worse" if r[0].comparison.diff > 0 else "better")
    else:
        verdict = ("holds: " if r[0].comparison.equivalence.equivalent else "undecided: ") + \
            r[0].comparison.equivalence.verdict()
    row("sigmoid attention (b = -log n) matches softmax (Ramapuram et al. 2025: equal loss and downstream scores "
        f"from 85M to 1B parameters); here: equivalent within ±{MATCH_MARGIN:g} test ppl (TOST)",
        f"WikiText-2 ppl at 256, sigmoid - UNAS (rope): {_diff(r[0])}" if r else "not run", verdict)
    # sinks
    names = ("gated", "softpick", "sigmoid")
    r = _compare(base, [_lm(lm, n, "rope") for n in names], "sink_rate")
    softmax_sinks = base.stat("sink_rate") if base is not None else None
    if r:
        words = "; ".join(f"{n}: {_diff(x)}" for n, x in zip(names, r))
        lower = all(x.comparison.diff < 0 and x.comparison.direction() != 0 for x in r)
        verdict = ("holds: every one has fewer sinks" if lower and softmax_sinks and softmax_sinks[0] > 0 else
                   "not shown: " + ("softmax has no sinks here" if not softmax_sinks or softmax_sinks[0] == 0
                                    else "not every difference is significant"))
    else:
        words, verdict = "not run", "undecided"
    row("gated, softpick and sigmoid attention have no attention sinks where softmax has them (Qiu et al. 2025; Zuhri "
        "et al. 2025; Gu et al. 2024: the share of heads whose mean first-key weight is > 0.3)",
        f"sink rate, WikiText-2, UNAS (rope) {ci_text(base, 'sink_rate', '{:.2f}')}; difference from it: {words}",
        verdict)
    # extrapolation
    for n in (1024, 2048):
        names = ("forgetting", "stickbreaking")
        r = _compare(base, [_lm(lm, s, "none") for s in names], f"ppl@{n}")
        if r:
            words = "; ".join(f"{s}: {_diff(x)}" for s, x in zip(names, r))
            better = all(x.comparison.diff < 0 and x.comparison.direction() != 0 for x in r)
            verdict = "holds at this length" if better else "not shown at this length"
        else:
            words, verdict = "not run", "undecided"
        row(f"forgetting and stick-breaking attention (no positions) extrapolate better than softmax with rotary positions "
            f"(Lin et al. 2025, Tan et al. 2025): test ppl at {n} after training at 256", words, verdict)
    # differential
    r = _compare(base, [_lm(lm, "differential", "rope")], "ppl")
    row("differential attention has a lower loss at equal size (Ye et al. 2025: the loss of a Transformer 1.6-1.9x its "
        "size)", f"WikiText-2 ppl at 256, differential - UNAS (rope): {_diff(r[0])}" if r else "not run",
        "undecided" if r is None else ("holds" if r[0].comparison.diff < 0 and r[0].comparison.direction() != 0
                                       else "not shown"))
    # MQAR
    solved, missing = [], []
    for s, names in MQAR.items():
        groups = _groups(study, names)
        for d in (64, 128):
            g = groups.get(("unas", "rope", d, s))
            if g is None:
                missing.append(f"seq {s}, d {d}")
                continue
            accs = g.values("test/query_acc")
            solved.append((f"seq {s}, d {d}", min(accs) >= SOLVED, min(accs), g.n))
    words = "; ".join(f"{c}: lowest seed {a:.1%} (n={n})" for c, _, a, n in solved) or "not run"
    verdict = ("undecided" if not solved else "holds at every cell run" if all(ok for _, ok, _, _ in solved)
               else "not at this budget: " + ", ".join(c for c, ok, _, _ in solved if not ok))
    if missing and solved:
        verdict += f" (not run yet: {', '.join(missing)})"
    row(f"attention solves MQAR at every width (Arora et al. 2024, Figure 2; solved: every seed >= {SOLVED:.0%} "
        "query accuracy)", f"UNAS (rope): {words}", verdict)
    return out


def baselines_section(study: Path) -> str:
    lines = [HEADING, "",
             "Written by `python benchmarks/study_report.py` from the runs of `benchmarks/study_queue_lengths.sh` "
             "finished so far (mean ± 95% CI over seeds; verdicts: nas-report's paired t-test over seeds, Holm over the "
             "schemes of a claim). The budget: MQAR `experiment=mqar_cpu` (1,500 steps, vocabulary 512, 2 layers, 2 "
             "heads) at two cells of Zoology's Figure 2 grid and two widths; WikiText-2 `experiment=wikitext2_lengths` "
             "(800 steps of 16 x 256 tokens, d_model 128, 2 layers, 4 heads; tested on the first 24 batches of the test "
             "split at each length), 3 seeds each. At this budget a model is far from converged: the numbers say how "
             "the schemes compare after the same short training, not what they reach.", "",
             "### The claims", "", *claims(study), "",
             "### MQAR: test query accuracy (%)", "", *mqar_table(study), "",
             "### WikiText-2: test perplexity at each length after training at 256 tokens", "", *lengths_table(study), ""]
    return "\n".join(lines)
