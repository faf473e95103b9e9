"""docs/study.md's third round (generated): today's baselines on MQAR and on WikiText-2 trained at 256
tokens and tested at 256 to 2,048 (the sweeps of benchmarks/study_queue_lengths.sh). Each verdict is
nas-report's (``compare_groups``: a paired t-test over the seeds, Holm over the schemes of one claim);
a claim with a run missing says so. Called by ``study_report.py``."""
from __future__ import annotations

import json
from pathlib import Path

from nas_cli.report.collect import find_runs
from nas_cli.report.compare import compare_groups
from nas_cli.report.stats import t_interval
from nas_cli.report.table import Group, group_runs

from study_common import ci_text, diff_text, study_roots, under_way

HEADING = "## Today's baselines: MQAR and length generalization (generated)"
#: MQAR's cells (task.seq_len, its sweeps) and the length sweeps, under benchmarks/study/
MQAR = {64: ("mqar64_rope", "mqar64_unas", "mqar64_none", "mqar64_mixers"),
        128: ("mqar128_rope", "mqar128_unas", "mqar128_none", "mqar128_mixers")}
LENGTHS = ("wikitext2_lengths_rope", "wikitext2_lengths_unas", "wikitext2_lengths_none")
TESTED = (256, 512, 1024, 2048)
#: WikiText-2's training length (experiment=wikitext2_lengths), the window its diagnostics see
TRAIN_LENGTH = TESTED[0]
#: the rows of the tables, in order: (scheme, model.positions)
CONFIGS = (("unas", "rope"), ("unas", "sinusoidal"), ("unas", "alibi"), ("unas", "none"), ("dnas", "rope"),
           ("hnas", "rope"), ("sigmoid", "rope"), ("softpick", "rope"), ("gated", "rope"), ("differential", "rope"),
           ("selective", "rope"), ("forgetting", "none"), ("stickbreaking", "none"))
#: the MQAR rows' linear-attention and state-space mixers (benchmarks/study_queue_mixers.sh: a short convolution
#: of 4, no positions)
MIXER_CONFIGS = tuple((m, "none") for m in ("linear_attention", "gla", "deltanet", "gated_deltanet", "mamba2"))
#: the lengths figure draws a second panel without the schemes whose mean perplexity passes this
#: many times the lowest
BLOWN_UP = 3.0
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
    ``margin``, its equivalence verdict too), or None. Every system must have 2 seeds or more
    (:func:`_testable` leaves out those that do not yet)."""
    present = [g for g in systems if g is not None]
    if base is None or not present or base.n < 2 or any(g.n < 2 for g in present):
        return None
    key = metric if metric.startswith("test/") or ":" in metric or "sink" in metric else f"test/{metric}"
    return compare_groups([base, *present], base, [key], samples=200, trials=1000, item_tests=False,
                          equivalence={key: margin} if margin else None)


def _mqar_cell(g: Group | None) -> str:
    """Mean ± 95% CI of the query accuracy (%), and in how many seeds it is solved (>= SOLVED): the
    outcome is close to all or nothing per seed, which a mean and its interval hide."""
    text = ci_text(g, "test/query_acc", "{:.1f}", 100)
    accs = g.values("test/query_acc") if g is not None else []
    return f"{text}; solved {sum(a >= SOLVED for a in accs)} of {len(accs)}" if accs else text


def mqar_table(study: Path) -> list[str]:
    cells = [(s, d) for s in MQAR for d in (64, 128)]
    groups = {s: _groups(study, names) for s, names in MQAR.items()}
    head = "| scheme (positions) | " + " | ".join(f"seq {s}, d_model {d}" for s, d in cells) + " |"
    lines = [head, "|---|" + "---|" * len(cells)]
    for scheme, positions in CONFIGS + MIXER_CONFIGS:
        row = [_mqar_cell(groups[s].get((scheme, positions, d, s))) for s, d in cells]
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


def first_key_weight(g: Group | None) -> tuple[float, float, int] | None:
    """Each run's mean weight on the first key over every head and layer of its last diagnostics
    (``first_key_weight`` in diagnostics/latest.json, the number the sink rate thresholds), and
    (mean, half-width of the 95% t interval, n) over the runs; None where no run has it."""
    per_run = []
    for r in g.runs if g is not None else ():
        path = Path(r.path) / "diagnostics" / "latest.json"
        if not path.is_file():
            continue
        layers = [layer for loc in json.loads(path.read_text()).get("locations", {}).values()
                  for layer in loc.get("layers", [])]
        heads = [w for layer in layers for w in layer.get("first_key_weight", [])]
        if heads:
            per_run.append(sum(heads) / len(heads))
    got = t_interval(per_run)
    if got is None:
        return None
    mean, low, _, n = got
    return mean, (mean - low if n > 1 else 0.0), n


def uniform_first_key_weight(seq_len: int) -> float:
    """The first key's mean weight under uniform causal attention over a window of ``seq_len``:
    query i (0-based) gives it 1/(i+1), so the mean is the harmonic number H_n over n."""
    return sum(1.0 / (i + 1) for i in range(seq_len)) / seq_len


def _first_key_text(groups: dict[str, Group | None]) -> str:
    parts = []
    for name, g in groups.items():
        st = first_key_weight(g)
        if st is not None:
            parts.append(f"{name} {st[0]:.3f} ± {st[1]:.3f} (n={st[2]})" if st[2] > 1 else f"{name} {st[0]:.3f} (n=1)")
    if not parts:
        return ""
    return (f"; mean weight on the first key (every head): {', '.join(parts)}; uniform causal attention over "
            f"{TRAIN_LENGTH} tokens: {uniform_first_key_weight(TRAIN_LENGTH):.3f}")


#: what each paper reports, beside the measurement (the papers' own scales)
PAPER = {
    "sigmoid": "equal loss and downstream scores from 85M to 1B parameters (Ramapuram et al. 2025)",
    "sinks": "softpick: 0% sink rate at 340M and 1.8B (Zuhri et al. 2025); sigmoid attention: no sink up to 1B "
             "(Gu et al. 2024); gated: the sink mitigated at 1.7B dense and 15B MoE (Qiu et al. 2025)",
    "extrapolation": "perplexity kept past the training length where softmax with rotary positions rises (Lin et al. "
                     "2025: FoX; Tan et al. 2025: stick-breaking)",
    "differential": "a 6.8B model's validation loss equals an 11B Transformer's (62% of its parameters; Ye et al. 2025)",
    "mqar": "attention near 100% query accuracy at every width and sequence length of Figure 2 (Arora et al. 2024)",
}


def _testable(systems: dict[str, Group | None]) -> tuple[dict[str, Group], str]:
    """The systems with 2 seeds or more (a paired test needs them), and words for those run on one seed so far."""
    tested = {n: g for n, g in systems.items() if g is not None and g.n >= 2}
    short = [n for n, g in systems.items() if g is not None and g.n < 2]
    return tested, "".join(f"; {n}: 1 seed so far, no test" for n in short)


def _decided(verdict: str, needed: dict[str, Group | None]) -> str:
    """A claim's verdict once every group it needs has every seed: 'undecided' while one has no run,
    'not decided yet' (with the verdict on the runs so far) while one has fewer seeds than planned."""
    missing = [name for name, g in needed.items() if g is None]
    if missing:
        return f"undecided: not run yet ({', '.join(missing)})"
    return under_way(verdict, needed)


def claims(study: Path) -> list[str]:
    lm = _groups(study, LENGTHS)
    base = _lm(lm, "unas", "rope")
    out = ["| claim (paper) | paper's number | measured here | verdict |", "|---|---|---|---|"]

    def row(claim, paper, measured, verdict):
        out.append(f"| {claim} | {PAPER[paper]} | {measured} | {verdict} |")

    # sigmoid matches softmax: an equivalence verdict at a margin fixed before any run finished
    sig = _lm(lm, "sigmoid", "rope")
    r = _compare(base, [sig], "test/ppl", MATCH_MARGIN)
    if r is None:
        verdict = "undecided"
    else:  # the claim is the equivalence; a significant difference inside the margin does not refute it
        c = r[0].comparison
        side = ("worse" if c.diff > 0 else "better") if c.direction() != 0 else None
        if c.equivalence.equivalent:
            verdict = "holds: " + c.equivalence.verdict() + (f" (sigmoid significantly {side}, inside the margin)"
                                                             if side else "")
        else:
            verdict = f"differs: sigmoid {side}" if side else "undecided: " + c.equivalence.verdict()
    row(f"sigmoid attention (b = -log n) matches softmax; here: equivalent within ±{MATCH_MARGIN:g} test ppl (TOST)",
        "sigmoid", f"WikiText-2 ppl at 256, sigmoid - UNAS (rope): {diff_text(r[0], holm=False)}" if r else "not run",
        _decided(verdict, {"UNAS (rope)": base, "sigmoid": sig}))
    # sinks
    names = ("gated", "softpick", "sigmoid")
    systems = {n: _lm(lm, n, "rope") for n in names}
    tested, short = _testable(systems)
    r = _compare(base, list(tested.values()), "sink_rate")
    softmax_sinks = base.stat("sink_rate") if base is not None else None
    if r:
        words = "; ".join(f"{n}: {diff_text(x)}" for n, x in zip(tested, r)) + short
        lower = all(x.comparison.diff < 0 and x.comparison.direction() != 0 for x in r)
        if not softmax_sinks or softmax_sinks[0] == 0:  # nothing to remove: the claim cannot be tested here
            verdict = "undecided: softmax has no sinks at this budget, so there is none to remove"
        else:
            verdict = "holds: every one has fewer sinks" if lower else "not shown: not every difference is significant"
    else:
        words, verdict = "not run", "undecided"
    row("gated, softpick and sigmoid attention have no attention sinks where softmax has them (sink rate: the share "
        "of heads whose mean first-key weight is > 0.3, Gu et al. 2024)", "sinks",
        f"sink rate, WikiText-2, UNAS (rope) {ci_text(base, 'sink_rate', '{:.2f}')}; difference from it: {words}"
        + _first_key_text({"UNAS (rope)": base, **systems}),
        _decided(verdict, {"UNAS (rope)": base, **systems}))
    # extrapolation
    for n in (1024, 2048):
        names = ("forgetting", "stickbreaking")
        systems = {s: _lm(lm, s, "none") for s in names}
        tested, short = _testable(systems)
        r = _compare(base, list(tested.values()), f"ppl@{n}")
        if r:
            words = "; ".join(f"{s}: {diff_text(x)}" for s, x in zip(tested, r)) + short
            better = all(x.comparison.diff < 0 and x.comparison.direction() != 0 for x in r)
            verdict = "holds at this length" if better else "not shown at this length"
            if short:
                verdict += f" for {', '.join(tested)} (the others not tested yet)"
        else:
            words, verdict = "not run", "undecided"
        row(f"forgetting and stick-breaking attention (no positions) extrapolate better than softmax with rotary "
            f"positions: test ppl at {n} after training at 256", "extrapolation", words,
            _decided(verdict, {"UNAS (rope)": base, **systems}))
    # differential
    diff = _lm(lm, "differential", "rope")
    r = _compare(base, [diff], "ppl")
    row("differential attention has a lower loss at equal size", "differential",
        f"WikiText-2 ppl at 256, differential - UNAS (rope): {diff_text(r[0], holm=False)}" if r else "not run",
        _decided("undecided" if r is None else ("holds" if r[0].comparison.diff < 0 and r[0].comparison.direction() != 0
                                               else "not shown"), {"UNAS (rope)": base, "differential": diff}))
    out.append(_mqar_claim(study))
    return out


def _mqar_claim(study: Path) -> str:
    """Attention solves MQAR at every width: UNAS (rope) at every cell, every seed >= SOLVED."""
    solved, missing, short = [], [], {}
    for s, names in MQAR.items():
        groups = _groups(study, names)
        for d in (64, 128):
            g = groups.get(("unas", "rope", d, s))
            if g is None:
                missing.append(f"seq {s}, d {d}")
                continue
            accs = g.values("test/query_acc")
            solved.append((f"seq {s}, d {d}", min(accs) >= SOLVED, min(accs), g.n))
            short[f"seq {s}, d {d}"] = g
    words = "; ".join(f"{c}: lowest seed {a:.1%} (n={n})" for c, _, a, n in solved) or "not run"
    verdict = ("undecided" if not solved else "holds at every cell run" if all(ok for _, ok, _, _ in solved)
               else "not at this budget: " + ", ".join(c for c, ok, _, _ in solved if not ok))
    if missing and solved:
        verdict += f" (not run yet: {', '.join(missing)})"
    elif solved:
        verdict = under_way(verdict, short)
    return (f"| attention solves MQAR at every width (solved: every seed >= {SOLVED:.0%} query accuracy), at "
            f"experiment=mqar_cpu's settings, not Figure 2's (random fill tokens, vocabulary 512, 2 heads with an MLP, "
            f"Adam at one rate, 96,000 sequences seen; Figure 2's settings: the section 'MQAR at Zoology's Figure 2 "
            f"settings') | {PAPER['mqar']} | UNAS (rope): {words} | {verdict} |")


def _label(scheme: str, positions: str) -> str:
    return f"{scheme} ({positions})"


def without_blown_up(panel: str, lines: dict[str, list]) -> dict[str, dict[str, list]]:
    """A second panel, ``"<panel> without <names>"``, of the lines whose means all stay within
    ``BLOWN_UP`` times the lowest mean; none when no line or every line blows up."""
    lowest = min(m for pts in lines.values() for _, m, _ in pts)
    off = [s for s, pts in lines.items() if max(m for _, m, _ in pts) > BLOWN_UP * lowest]
    if not off or len(off) == len(lines):
        return {}
    return {f"{panel} without {', '.join(off)}": {s: pts for s, pts in lines.items() if s not in off}}


def lengths_figure(study: Path) -> bytes | None:
    """WikiText-2 test perplexity against the tested length, one line per scheme (mean ± 95% CI).
    A scheme whose perplexity blows up (past ``BLOWN_UP`` times the lowest mean) squeezes the others
    into one band even on a log axis, so a second panel shows them without it, and names it."""
    from nas_cli.diagnostics import figures as figs

    groups, panel = _groups(study, LENGTHS), "test ppl"
    data: dict = {}
    for scheme, positions in CONFIGS:
        g = _lm(groups, scheme, positions)
        for n, name in zip(TESTED, ["test/ppl"] + [f"test/ppl@{n}" for n in TESTED[1:]]):
            st = g.stat(name) if g is not None else None
            if st:
                data.setdefault(panel, {}).setdefault(_label(scheme, positions), []).append((n, st[0], st[1]))
    if not data:
        return None
    data.update(without_blown_up(panel, data[panel]))
    return figs.metric_vs_heads([_label(*c) for c in CONFIGS], [(name, False) for name in data], data,
                                "WikiText-2 trained at 256 tokens: mean ± 95% CI over seeds (Student t)",
                                xlabel="tested length (tokens)")


def _mqar_points(study: Path, x_of) -> dict:
    """{panel: {line: [(x, mean %, CI half-width %)]}} of the MQAR cells' test query accuracy, one panel per
    sequence length, a line per scheme, x = ``x_of(group, d_model)`` (None leaves the point out)."""
    data: dict = {}
    for s, names in MQAR.items():
        groups = _groups(study, names)
        for scheme, positions in CONFIGS + MIXER_CONFIGS:
            for d in (64, 128):
                g = groups.get((scheme, positions, d, s))
                st = g.stat("test/query_acc") if g is not None else None
                x = x_of(g, d) if g is not None else None
                if st and x:
                    data.setdefault(f"seq {s}: query accuracy (%)", {}).setdefault(_label(scheme, positions), []).append(
                        (x, 100 * st[0], 100 * st[1]))
    return data


def mqar_figure(study: Path) -> bytes | None:
    """MQAR test query accuracy against d_model, one panel per sequence length, one line per scheme."""
    from nas_cli.diagnostics import figures as figs

    data = _mqar_points(study, lambda g, d: d)
    if not data:
        return None
    return figs.metric_vs_heads([_label(*c) for c in CONFIGS + MIXER_CONFIGS], [(t, True) for t in data], data,
                                "MQAR: mean ± 95% CI over seeds (Student t), cut at 0 and 100%", xlabel="d_model",
                                bounds=(0.0, 100.0))


def mqar_state_figure(study: Path) -> bytes | None:
    """Zoology's figure of recall against state size: MQAR test query accuracy against the bytes decoding holds at
    the sequence's end (nas-report's ``state_bytes``: a mixer's state, attention's keys and values of every
    position), one panel per sequence length, a point per width, a line per scheme."""
    from nas_cli.diagnostics import figures as figs
    from nas_cli.report.html import state_bytes

    data = _mqar_points(study, lambda g, d: state_bytes(g.runs[0]))
    if not data:
        return None
    return figs.metric_vs_heads([_label(*c) for c in CONFIGS + MIXER_CONFIGS], [(t, True) for t in data], data,
                                "MQAR against state size: mean ± 95% CI over seeds (Student t), cut at 0 and 100%",
                                xlabel="state at the sequence's end (bytes)", bounds=(0.0, 100.0), exact_ticks=False)


def _figures(study: Path, figures: Path | None) -> list[str]:
    """The section's figure links (where a figure has data), and the PNGs written into ``figures``."""
    links = []
    for name, draw, alt in (("mqar.png", mqar_figure, "MQAR query accuracy against d_model"),
                            ("mqar_state.png", mqar_state_figure, "MQAR query accuracy against state size"),
                            ("lengths.png", lengths_figure, "WikiText-2 test perplexity against the tested length")):
        png = draw(study)
        if png is None:
            continue
        links.append(f"![{alt}](study/{name})")
        if figures is not None:
            (figures / name).write_bytes(png)
    return links


def baselines_section(study: Path, figures: Path | None = None) -> str:
    lines = [HEADING, "",
             "Written by `python benchmarks/study_report.py` from the runs of `benchmarks/study_queue_lengths.sh` "
             "(and, for the MQAR rows of the linear-attention and state-space mixers, `benchmarks/study_queue_mixers.sh`: "
             "a short convolution of 4, no positions) finished so far (mean ± 95% CI over seeds, each run's own numbers in [study/runs.csv](study/runs.csv); "
             "verdicts: nas-report's paired t-test over seeds, Holm over the schemes of a claim, marked p(Holm); a claim about one scheme: its own paired test, marked p). The budget: MQAR `experiment=mqar_cpu` (1,500 steps, vocabulary 512, 2 layers, 2 "
             "heads) at two cells of Zoology's Figure 2 grid and two widths; WikiText-2 `experiment=wikitext2_lengths` "
             "(800 steps of 16 x 256 tokens, d_model 128, 2 layers, 4 heads; tested on the first 24 batches of the test "
             "split at each length), 3 seeds each. At this budget a model is far from converged: the numbers say how "
             "the schemes compare after the same short training, not what they reach.", "",
             "### The claims", "", *claims(study), "",
             "### MQAR: test query accuracy (%)", "",
             f"Mean ± 95% CI over seeds, and the seeds in which MQAR is solved (test query accuracy >= {SOLVED:.0%}).",
             "", *mqar_table(study), "",
             "### WikiText-2: test perplexity at each length after training at 256 tokens", "", *lengths_table(study), "",
             *[line for link in _figures(study, figures) for line in (link, "")]]
    return "\n".join(lines)
