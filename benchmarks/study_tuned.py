"""docs/study.md's retuned Multi30k comparison (generated): DNAS, HNAS and CODA against UNAS once at
the shared learning rate (UNAS's, 2e-3: the study's first sweep) and once with every scheme at its own
rate of 1e-3, 2e-3 and 4e-3, chosen by validation BLEU (nas_cli.report.tuning, the same choice as
``nas-report --tune optim.lr``), side by side, each claim's verdict at both, and whether it changes.
Called by ``study_report.py``."""
from __future__ import annotations

from pathlib import Path

from nas_cli.report.compare import compare_groups
from nas_cli.report.table import Group
from nas_cli.report.tuning import tune

from study_common import NAMES, ci_text, diff_text, study_groups, sweep_progress

HEADING = "## Each scheme at its own learning rate (generated)"
KEY = "optim.lr"
#: the rate every scheme of the study's first sweep ran at (UNAS's tuned rate)
SHARED = 2e-3
SCHEMES = ("unas", "dnas", "hnas", "coda")
#: (summary metric, name on the page, higher is better)
METRICS = (("test/bleu", "BLEU", True), ("test/ppl", "test ppl", False))
#: the claims the retuned comparison re-decides (the claims table's rows on these schemes)
CLAIMS = {"dnas": "DNAS better than UNAS (Ding et al.)", "hnas": "HNAS better than UNAS (Ding et al.)",
          "coda": "CODA better than the Transformer (Zheng et al.)"}

INTRO = ("Written by `python benchmarks/study_report.py` from the committed runs of `benchmarks/study/multi30k` "
         "(every scheme at 2e-3) and `benchmarks/study/multi30k_tuned` (1e-3 and 4e-3; "
         "`benchmarks/study_queue_tuned.sh`). Each scheme takes the rate with the best mean validation BLEU "
         "over the verdict seeds (same-seed selection, the protocol docs/comparing.md calibrates; a test number "
         "never takes part in the choice). Both differences are from UNAS, with nas-report's verdict (a paired "
         "t-test over seeds), Holm over the three schemes compared here: so a p below can differ from the "
         "claims table's, whose family is the nine schemes of the Multi30k sweeps.")


def _scheme(g: Group) -> str:
    return g.common(lambda r: r.scheme)


def _word(c, higher: bool) -> str:
    """The verdict's direction in one word: better, worse, or no significant difference."""
    v = c.verdict(higher)
    return "better" if v.startswith("better") else "worse" if v.startswith("worse") else (
        "no verdict" if v.startswith("no verdict") else "no significant difference")


def _rate(value) -> str:
    return f"{float(value):.0e}".replace("e-0", "e-")


def tuned_section(dirs: list[str]) -> str:
    """The section from the shared-rate sweep and the retuned sweep's directories (``dirs``)."""
    lines = [HEADING, "", INTRO, ""]
    short = [(Path(d).name, done, size) for d in dirs for done, size in [sweep_progress(d)] if done < size]
    if short:
        said = "; ".join(f"`{name}` {done} of {size} runs finished" for name, done, size in short)
        return "\n".join(lines + [f"Not compared yet: {said}. Each scheme chooses its rate once every rate has run "
                                  "at every seed; until then the claims stand as the shared-rate verdicts above.",
                                  ""])
    groups = [g for g in study_groups(dirs, heads=4) if _scheme(g) in SCHEMES]
    tuning = tune(groups, [KEY])
    cells = {_scheme(c.candidates[0].group): c for c in tuning.cells}
    lines += _choices(cells)
    shared = {s: next((c.group for c in cell.candidates if float(c.values[KEY]) == SHARED), None)
              for s, cell in cells.items()}
    if "unas" not in cells or cells["unas"].chosen is None or any(g is None for g in shared.values()):
        return "\n".join(lines + ["No comparison: UNAS has no chosen rate, or a scheme has no run at the shared "
                                  "rate.", ""])
    names = [m for m, _, _ in METRICS]
    at_shared = compare_groups([shared[s] for s in SCHEMES if s in shared], shared["unas"], names, item_tests=False)
    chosen = [g for g in tuning.groups if _scheme(g) in cells]
    base = next(g for g in chosen if _scheme(g) == "unas")
    at_own = compare_groups(chosen, base, names, item_tests=False)
    lines += _side_by_side(cells, at_shared, at_own)
    return "\n".join(lines) + "\n"


def _choices(cells: dict) -> list[str]:
    """Each scheme's mean validation BLEU at each rate, the chosen rate and its margin."""
    rates = sorted({float(c.values[KEY]) for cell in cells.values() for c in cell.candidates})
    out = ["| scheme | " + " | ".join(f"val BLEU at {_rate(r)}" for r in rates)
           + " | chosen rate | margin to the runner-up | warning |", "|---|" + "---|" * (len(rates) + 3)]
    for s in SCHEMES:
        cell = cells.get(s)
        if cell is None:
            continue
        by = {float(c.values[KEY]): c for c in cell.candidates}
        vals = [f"{by[r].mean:.2f}" if r in by and by[r].mean is not None else "-" for r in rates]
        chosen = _rate(cell.chosen.values[KEY]) if cell.chosen else f"none ({cell.why_not})"
        margin = f"{cell.margin:.2f}" if cell.margin is not None else "-"
        warn = "at an edge of the grid: widen it" if cell.edges else ""
        out.append(f"| {NAMES.get(s, s)} | {' | '.join(vals)} | {chosen} | {margin} | {warn} |")
    seeds = sorted({seed for cell in cells.values() for seed in cell.seeds})
    return out + ["", f"Selection seeds: {', '.join(map(str, seeds))} (mean validation BLEU over them).", ""]


def _side_by_side(cells: dict, at_shared, at_own) -> list[str]:
    """Each scheme's difference from UNAS at the shared rate and at the chosen rates, and each claim's
    verdict at both."""
    find = {(which, _scheme(r.group), r.comparison.metric): r for which, rows in (("shared", at_shared), ("own", at_own))
            for r in rows}
    unas = _rate(cells["unas"].chosen.values[KEY])
    out = ["| scheme (its rate) | metric | UNAS at its own rate | scheme at its own rate | difference at 2e-3 (shared) | "
           "verdict | difference at each one's rate | verdict | changed? |", "|---|---|---|---|---|---|---|---|---|"]
    changes = []
    for s in SCHEMES[1:]:
        if s not in cells or cells[s].chosen is None:
            continue
        own = _rate(cells[s].chosen.values[KEY])
        for metric, name, higher in METRICS:
            a, b = find.get(("shared", s, metric)), find.get(("own", s, metric))
            if a is None or b is None:
                continue
            before, after = _word(a.comparison, higher), _word(b.comparison, higher)
            changed = "no" if before == after else f"yes: {before} -> {after}"
            if before != after:
                changes.append(f"{NAMES[s]} {name}: {before} at the shared rate, {after} at its own")
            out.append(f"| {NAMES[s]} ({own}) | {name} | {ci_text(b.baseline, metric)} | {ci_text(b.group, metric)} | "
                       f"{diff_text(a)} | {before} | {diff_text(b)} | {after} | {changed} |")
    out += ["", f"UNAS's own rate: {unas}."]
    if all(float(cell.chosen.values[KEY]) == SHARED for cell in cells.values() if cell.chosen is not None):
        out[-1] += (f" Every scheme's own rate is the shared {_rate(SHARED)}: the retuned comparison compares the "
                    "same runs as the shared-rate one, so its verdicts are those at the shared rate (with this "
                    "section's Holm family).")
    claims = []
    for s, claim in CLAIMS.items():
        a, b = find.get(("shared", s, "test/bleu")), find.get(("own", s, "test/bleu"))
        if a is not None and b is not None:
            before, after = _word(a.comparison, True), _word(b.comparison, True)
            claims.append(f"- **{claim}**, in BLEU: {before} at the shared rate, {after} with each scheme at its own "
                          f"rate: {_claim_outcome(before == 'better', after == 'better')}.")
    out += ["", *claims, "", ("Changed verdicts: " + "; ".join(changes) + ".") if changes
            else "No verdict changes when each scheme runs at its own rate."]
    return out + [""]


def _claim_outcome(shared: bool, own: bool) -> str:
    """A claim of improvement at the shared rate and at each scheme's own rate, in words."""
    if shared and own:
        return "the claim holds at both"
    if shared:
        return "the claim held at the shared rate only and does not survive retuning"
    if own:
        return "the claim holds only with each scheme at its own rate"
    return "the claim is not shown at either"
