"""docs/study.md's third-round claims (benchmarks/study_baselines.py) on simulated sweep directories: each
claim decided from nas-report's verdicts when every scheme has every seed, and left undecided (with the
verdict on the runs so far) while a scheme is missing or short of seeds."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from helpers import load_benchmark

SEEDS = (1, 2, 3)
#: a seed's shift, shared by every scheme (the paired differences stay tight)
SHIFT = {1: 0.0, 2: 3.0, 3: -2.0}


@pytest.fixture(scope="module")
def mod():
    return load_benchmark("study_baselines")


def _run(sweep: Path, scheme: str, positions: str, seed: int, test: dict, sink: float | None = None,
         d_model: int = 128, seq_len: int | None = None) -> None:
    d = sweep / f"{scheme}-{positions}-{d_model}-{seq_len}-{seed}"
    (d / ".hydra").mkdir(parents=True)
    task = {"name": "mqar" if seq_len else "wikitext2", **({"seq_len": seq_len} if seq_len else {})}
    config = {"task": task, "attention": scheme, "seed": seed, "model": {"positions": positions, "d_model": d_model}}
    (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    (d / "summary.json").write_text(json.dumps({"task": task["name"], "scheme": scheme, "heads": 4, "seed": seed,
                                                "test": test}))
    if sink is not None:
        (d / "diagnostics").mkdir()
        (d / "diagnostics" / "summary.json").write_text(json.dumps({
            "reported": [{"name": "sink_rate", "title": "sink rate", "format": "pct"}],
            "locations": {"decoder": {"sink_rate": sink}}}))


#: WikiText-2 at 256 and each longer length, and the sink rate, per (scheme, positions) at seed 1
LM = {("unas", "rope"): (200.0, 230.0, 260.0, 300.0, 0.50),
      ("sigmoid", "rope"): (201.0, 231.0, 262.0, 303.0, 0.0),
      ("gated", "rope"): (199.0, 228.0, 258.0, 299.0, 0.0),
      ("softpick", "rope"): (204.0, 236.0, 266.0, 307.0, 0.0),
      ("differential", "rope"): (190.0, 220.0, 250.0, 290.0, 0.25),
      ("forgetting", "none"): (205.0, 210.0, 215.0, 320.0, 0.25),
      ("stickbreaking", "none"): (207.0, 212.0, 218.0, 318.0, 0.25)}


def _lengths(study: Path, skip=(), lm: dict = LM) -> None:
    for (scheme, positions), (p256, p512, p1024, p2048, sink) in lm.items():
        sweep = study / ("wikitext2_lengths_none" if positions == "none" else "wikitext2_lengths_rope")
        for i, seed in enumerate(SEEDS):
            if (scheme, seed) in skip:
                continue
            wobble = 0.3 * ((i + len(scheme)) % 3 - 1)  # a little spread in every paired difference
            ppl = [x + SHIFT[seed] + (wobble if scheme != "unas" else 0.0) for x in (p256, p512, p1024, p2048)]
            test = {"test/ppl": ppl[0], "test/ppl@512": ppl[1], "test/ppl@1024": ppl[2], "test/ppl@2048": ppl[3]}
            _run(sweep, scheme, positions, seed, test, sink=max(0.0, sink + (0.03 * (i - 1) if sink else 0.0)))


def _mqar(study: Path, accs: dict) -> None:
    for (seq, d), acc in accs.items():
        for i, seed in enumerate(SEEDS):
            _run(study / f"mqar{seq}_rope", "unas", "rope", seed, {"test/query_acc": acc[i]}, d_model=d, seq_len=seq)


SOLVED = {(64, 64): (0.999, 0.995, 1.0), (64, 128): (1.0, 1.0, 0.998), (128, 64): (0.993, 0.999, 1.0),
          (128, 128): (1.0, 0.997, 0.999)}


def _verdicts(mod, study: Path) -> dict[str, str]:
    rows = [line.strip("|").split(" | ") for line in mod.claims(study)[2:]]
    assert all(len(r) == 4 for r in rows)
    return {r[0].strip(): r[3].strip() for r in rows}


def _find(verdicts: dict, start: str) -> str:
    return next(v for k, v in verdicts.items() if k.startswith(start))


def test_every_claim_is_decided_when_every_scheme_has_every_seed(mod, tmp_path):
    _lengths(tmp_path)
    _mqar(tmp_path, SOLVED)
    v = _verdicts(mod, tmp_path)
    assert _find(v, "sigmoid attention").startswith("holds: equivalent within")  # +1 to +4 ppl inside ±5
    assert _find(v, "gated, softpick and sigmoid") == "holds: every one has fewer sinks"
    extrapolation = [val for k, val in v.items() if k.startswith("forgetting")]
    assert extrapolation == ["holds at this length", "not shown at this length"]  # better at 1024, worse at 2048
    assert _find(v, "differential") == "holds"
    assert _find(v, "attention solves MQAR") == "holds at every cell run"
    measured = {r.strip("|").split(" | ")[0].strip(): r.strip("|").split(" | ")[2] for r in mod.claims(tmp_path)[2:]}
    one_scheme = [m for k, m in measured.items() if k.startswith(("sigmoid attention", "differential"))]
    assert len(one_scheme) == 2 and all("], p" in m and "Holm" not in m for m in one_scheme)  # a single paired test
    assert "p(Holm)" in _find(measured, "gated, softpick and sigmoid")  # three schemes: Holm over them


def test_the_sinks_claim_is_undecided_where_softmax_has_no_sinks(mod, tmp_path):
    _lengths(tmp_path, lm={**LM, ("unas", "rope"): (*LM[("unas", "rope")][:4], 0.0)})
    assert (_find(_verdicts(mod, tmp_path), "gated, softpick and sigmoid")
            == "undecided: softmax has no sinks at this budget, so there is none to remove")


def test_a_cell_below_the_bar_refutes_mqar(mod, tmp_path):
    _mqar(tmp_path, {**SOLVED, (64, 64): (0.999, 0.41, 1.0)})
    assert _find(_verdicts(mod, tmp_path), "attention solves MQAR") == "not at this budget: seq 64, d 64"


def test_each_mqar_cell_counts_the_seeds_that_solve_it(mod, tmp_path):
    _mqar(tmp_path, {**SOLVED, (64, 64): (0.999, 0.41, 0.989)})  # 0.989 is just below the bar
    row = next(line for line in mod.mqar_table(tmp_path) if line.startswith("| unas (rope) |"))
    cells = [c.strip() for c in row.strip("|").split("|")][1:]
    assert cells[0].endswith("(n=3); solved 1 of 3") and cells[0].startswith("79.9 ± ")  # mean of 99.9, 41, 98.9
    assert [c.rsplit("; ", 1)[1] for c in cells[1:]] == ["solved 3 of 3"] * 3
    assert next(line for line in mod.mqar_table(tmp_path) if line.startswith("| gated (rope) |")).count("not run") == 4


def test_the_sinks_claim_reports_the_first_key_weight_beside_uniform_attention(mod, tmp_path):
    from scipy.special import digamma

    _lengths(tmp_path)
    first = {1: ([0.02, 0.01], [0.03, 0.02]), 2: ([0.04, 0.02], [0.02, 0.02]), 3: ([0.01, 0.01], [0.01, 0.01])}
    for seed, (layer0, layer1) in first.items():  # UNAS (rope)'s runs: per-run means 0.02, 0.025, 0.01
        run = tmp_path / "wikitext2_lengths_rope" / f"unas-rope-128-None-{seed}"
        latest = {"locations": {"decoder": {"layers": [{"first_key_weight": layer0}, {"first_key_weight": layer1}]}}}
        (run / "diagnostics" / "latest.json").write_text(json.dumps(latest))
    st = mod.first_key_weight(mod._lm(mod._groups(tmp_path, mod.LENGTHS), "unas", "rope"))
    assert st[0] == pytest.approx(0.055 / 3) and st[2] == 3
    assert st[1] == pytest.approx(4.302653 * 0.0076376 / 3 ** 0.5, rel=1e-4)  # t(0.975, 2) x sd / sqrt(3)
    n = 256  # uniform causal attention: the harmonic number over n, H_n = digamma(n + 1) + Euler's gamma
    assert mod.uniform_first_key_weight(n) == pytest.approx((digamma(n + 1) + 0.5772156649015329) / n)
    row = next(line for line in mod.claims(tmp_path) if line.startswith("| gated, softpick and sigmoid"))
    assert "mean weight on the first key (every head): UNAS (rope) 0.018 ± 0.019 (n=3);" in row
    assert "uniform causal attention over 256 tokens: 0.024" in row


def test_a_claim_with_a_scheme_short_of_seeds_or_missing_is_not_decided(mod, tmp_path):
    _lengths(tmp_path, skip={("softpick", 3), ("differential", 1), ("differential", 2), ("differential", 3)})
    v = _verdicts(mod, tmp_path)
    sinks = _find(v, "gated, softpick and sigmoid")
    assert sinks.startswith("not decided yet: the sweep is under way (softpick 2 of 3 seeds; on the runs so far:")
    assert _find(v, "differential") == "undecided: not run yet (differential)"
    assert _find(v, "sigmoid attention").startswith("holds")  # its own schemes have every seed


def test_a_scheme_on_one_seed_so_far_is_named_and_the_others_are_still_tested(mod, tmp_path):
    """Mid-sweep: stick-breaking attention has one seed, forgetting attention all three. The extrapolation
    rows test forgetting attention (Holm over it alone) and name stick-breaking as untested, not "not run";
    the claim stays not decided."""
    _lengths(tmp_path, skip={("stickbreaking", 2), ("stickbreaking", 3)})
    rows = [line for line in mod.claims(tmp_path) if line.startswith("| forgetting and stick-breaking")]
    assert len(rows) == 2
    for row in rows:
        measured, verdict = (c.strip() for c in row.strip("|").split(" | ")[2:4])
        assert measured.startswith("forgetting: ") and "p(Holm)" in measured, measured
        assert measured.endswith("; stickbreaking: 1 seed so far, no test"), measured
        assert verdict.startswith("not decided yet: the sweep is under way (stickbreaking 1 of 3 seeds"), verdict
        assert verdict.endswith(" for forgetting (the others not tested yet))"), verdict
    full = tmp_path / "full"
    _lengths(full, skip={("stickbreaking", s) for s in SEEDS})  # forgetting alone: the same test and numbers
    alone = [line for line in mod.claims(full) if line.startswith("| forgetting and stick-breaking")]
    assert [r.strip("|").split(" | ")[2] for r in alone] == [
        r.strip("|").split(" | ")[2].removesuffix("; stickbreaking: 1 seed so far, no test") for r in rows]


def test_the_section_draws_both_figures_and_links_them_only_where_there_is_data(mod, tmp_path):
    study, figures = tmp_path / "study", tmp_path / "figures"
    figures.mkdir()
    assert "![" not in mod.baselines_section(study, figures) and not list(figures.iterdir())
    _lengths(study)
    _mqar(study, SOLVED)
    text = mod.baselines_section(study, figures)
    assert "![MQAR query accuracy against d_model](study/mqar.png)" in text
    assert "![WikiText-2 test perplexity against the tested length](study/lengths.png)" in text
    for name in ("mqar.png", "lengths.png"):
        assert (figures / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_thirteen_lines_of_one_figure_all_look_different():
    from nas_cli.diagnostics.figures import COLOURS, _line_style

    looks = {(COLOURS[k % len(COLOURS)], _line_style(k)["linestyle"], _line_style(k)["marker"]) for k in range(13)}
    assert len(looks) == 13


def test_a_blown_up_perplexity_gets_a_second_panel_without_it_and_is_named_there(mod):
    lines = {"unas (rope)": [(256, 200.0, 3.0), (2048, 303.0, 1.0)],
             "sigmoid (rope)": [(256, 210.0, 4.0), (2048, 3799.0, 5109.0)],
             "alibi": [(256, 203.0, 2.0), (2048, 201.0, 2.0)]}
    assert mod.without_blown_up("test ppl", lines) == {
        "test ppl without sigmoid (rope)": {"unas (rope)": lines["unas (rope)"], "alibi": lines["alibi"]}}
    calm = {k: v for k, v in lines.items() if k != "sigmoid (rope)"}
    assert mod.without_blown_up("test ppl", calm) == {}  # 303 < 3 x 200: one panel is enough
    assert mod.without_blown_up("test ppl", {"sigmoid (rope)": lines["sigmoid (rope)"]}) == {}  # nothing left


def test_a_panel_spanning_a_factor_of_ten_gets_a_log_axis_that_shows_every_mean():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from nas_cli.diagnostics.figures import _honest_ylim, _log_ylim, _wants_log_axis

    blown = [(256, 201.4, 2.7), (2048, 3799.4, 5109.3), (2048, 196.6, 7.5)]  # the study's sigmoid: a bar below 0
    assert _wants_log_axis(blown) and not _wants_log_axis(blown[::2])
    assert not _wants_log_axis([(64, 0.0, 1.0), (128, 99.9, 0.1)])  # a 0 cannot sit on a log axis
    fig, ax = plt.subplots()
    _log_ylim(ax, blown)
    lo, hi = ax.get_ylim()
    assert ax.get_yscale() == "log" and 0 < lo < 196.6 - 7.5 and hi > 3799.4 + 5109.3
    fig, ax = plt.subplots()
    _honest_ylim(ax, [(64, 80.1, 83.0), (128, 24.1, 1.0)], bounds=(0.0, 100.0))  # MQAR: a bar past 0 and 100%
    lo, hi = ax.get_ylim()
    assert -5 < lo < 0 and 100 < hi < 105
    plt.close("all")
