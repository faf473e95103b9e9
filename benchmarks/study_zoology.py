"""docs/study.md's fidelity round (generated): MQAR at Zoology's Figure 2 settings (experiment=zoology_fig2,
the sweeps of benchmarks/study_queue_fidelity.sh) beside the third round's experiment=mqar_cpu cells, so that
the page shows what the settings change and the MQAR claim compares like with like. Each width's learning
rate is chosen by nas-report's tuning (``nas_cli.report.tuning.tune``: the best mean validation query
accuracy over the seeds, never the test set). Called by ``study_report.py``."""
from __future__ import annotations

from pathlib import Path

from nas_cli.report.collect import find_runs
from nas_cli.report.table import Group, group_runs
from nas_cli.report.tuning import tune

from study_baselines import MQAR, SOLVED, _groups, _mqar_cell
from study_common import ci_text, study_roots

HEADING = "## MQAR at Zoology's Figure 2 settings (generated)"
#: sequence length -> the sweep of its Figure 2 cell under benchmarks/study/
ZOOLOGY = {64: "zoology64", 128: "zoology128"}
WIDTHS = (64, 128)
RATES = (1e-4, 4.64e-4, 2.15e-3, 1e-2)
#: Figure 2's budget and the study's CPU size, in sequences seen
FULL, CPU = 64 * 100_000, 1500 * 512
WHAT_DIFFERS = ("random fill tokens (Figure 2: blank), a vocabulary of 512 (8,192), 2 heads with an MLP "
                "(1 head, attention only), rotary positions (learned), no dropout (0.1 on the embeddings and attention "
                "weights), Adam at 3e-3 with an inverse-square-root schedule (AdamW, weight decay 0.1, cosine, the best "
                "of 4 rates), 96,000 sequences seen (6.4 million)")


def _runs(study: Path, name: str) -> list:
    roots = study_roots([study / name])
    return [r for r in find_runs(roots) if r.finished] if roots else []


def cells(study: Path) -> dict[tuple[int, int], dict]:
    """(seq_len, d_model) -> {"rates": {lr: Group}, "chosen": Group | None, "chosen_lr", "margin", "why"}."""
    out: dict[tuple[int, int], dict] = {}
    for seq, name in ZOOLOGY.items():
        runs = _runs(study, name)
        if not runs:
            continue
        groups = group_runs(runs)
        by_width: dict[int, list[Group]] = {}
        for g in groups:
            by_width.setdefault(g.runs[0]._cfg("model.d_model"), []).append(g)
        for d, members in by_width.items():
            rates = {float(g.runs[0]._cfg("optim.lr")): g for g in members}
            tuned = tune(members, ["optim.lr"])
            cell = tuned.cells[0] if tuned.cells else None
            out[(seq, d)] = {"rates": rates, "chosen": tuned.groups[0] if cell and cell.chosen else None,
                             "chosen_lr": cell.chosen.values["optim.lr"] if cell and cell.chosen else None,
                             "margin": cell.margin if cell else None, "why": cell.why_not if cell else "no runs",
                             "complete": len(rates) == len(RATES) and min(g.n for g in rates.values()) >= 3}
    return out


def _rate_cell(g: Group | None) -> str:
    if g is None:
        return "not run"
    val = ci_text(g, "best_val", "{:.1f}", 100)
    return f"val {val}; test {_mqar_cell(g)}"


def table(study: Path) -> list[str]:
    found = cells(study)
    head = ("| cell (seq_len, d_model) | " + " | ".join(f"lr {lr:g}" for lr in RATES)
            + " | chosen lr (by validation) | test at the chosen lr | mqar_cpu UNAS (rope), the third round |")
    lines = [head, "|---|" + "---|" * (len(RATES) + 3)]
    for seq in ZOOLOGY:
        third = _groups(study, MQAR.get(seq, ()))
        for d in WIDTHS:
            c = found.get((seq, d))
            old = _mqar_cell(third.get(("unas", "rope", d, seq))) if third else "not run"
            if c is None:
                lines.append(f"| ({seq}, {d}) | " + " | ".join(["not run"] * len(RATES)) + f" | - | - | {old} |")
                continue
            rates = [_rate_cell(c["rates"].get(lr)) for lr in RATES]
            chosen = f"{c['chosen_lr']:g}" if c["chosen_lr"] is not None else f"- ({c['why']})"
            if c["chosen_lr"] is not None and not c["complete"]:
                chosen += " (so far: the grid or its seeds are not complete)"
            lines.append(f"| ({seq}, {d}) | " + " | ".join(rates) + f" | {chosen} | {_mqar_cell(c['chosen'])} | {old} |")
    return lines


def claim(study: Path) -> str:
    """The MQAR claim at Figure 2's settings: UNAS (learned positions, 1 head, attention only) at each width's
    chosen rate, solved (every seed >= SOLVED) or not."""
    found = cells(study)
    parts, verdicts = [], []
    for (seq, d), c in sorted(found.items()):
        g = c["chosen"]
        if g is None:
            continue
        accs = g.values("test/query_acc")
        ok = min(accs) >= SOLVED
        parts.append(f"seq {seq}, d {d}: lowest seed {min(accs):.1%} (n={len(accs)}, lr {c['chosen_lr']:g})")
        verdicts.append((f"seq {seq}, d {d}", ok, c["complete"]))
    missing = [f"seq {s}, d {d}" for s in ZOOLOGY for d in WIDTHS if (s, d) not in found]
    done = [(c, ok) for c, ok, complete in verdicts if complete]
    running = [c for c, _, complete in verdicts if not complete]
    if not done:
        verdict = "undecided: no cell has all its rates and seeds yet"
    elif all(ok for _, ok in done):
        verdict = "holds at every cell complete"
    else:
        verdict = "not at this budget: " + ", ".join(c for c, ok in done if not ok)
    if running:
        verdict += f" (still running: {', '.join(running)})"
    if missing:
        verdict += f" (not run yet: {', '.join(missing)})"
    return (f"| attention solves MQAR at every width, at Figure 2's settings and an eighth of its budget (solved: "
            f"every seed >= {SOLVED:.0%}) | attention near 100% query accuracy at every width and sequence length "
            f"of Figure 2 (Arora et al. 2024) | UNAS, 1 head, attention only, learned positions, at each width's "
            f"chosen rate: {'; '.join(parts) or 'not run'} | {verdict} |")


def zoology_section(study: Path) -> str:
    lines = [HEADING, "",
             "Written by `python benchmarks/study_report.py` from the runs of `benchmarks/study_queue_fidelity.sh` "
             "finished so far. `experiment=zoology_fig2` (docs/tasks.md) has every setting of Zoology's Figure 2; "
             f"the runs here are at a CPU size, stated as such: 20,000 training sequences and 1,500 steps of Figure "
             f"2's batch of 512, {CPU:,} sequences seen, an eighth of Figure 2's {FULL:,} (64 epochs of 100,000). "
             "Each width runs the four rates of Figure 2 at 3 seeds; its rate is the one with the best mean "
             "validation query accuracy over the seeds (nas-report's tuning, same-seed selection; the test set "
             "takes no part). Cells: mean ± 95% CI over seeds (%), and the seeds in which MQAR is solved. The last "
             "column is the third round's cell at `experiment=mqar_cpu`, whose settings differ from Figure 2's: "
             f"{WHAT_DIFFERS}.", "",
             "| claim | paper | measured here | verdict |", "|---|---|---|---|", claim(study), "",
             "### Test query accuracy at each rate and at the chosen one (%)", "", *table(study), ""]
    return "\n".join(lines)
