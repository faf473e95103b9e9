"""Self-contained HTML report: tables plus figures embedded as base64 PNG (matplotlib).

Nothing is loaded from outside the file (no CDN, no fonts, no external scripts), so the
report opens offline and can be mailed or archived. Figures:

* metric vs number of heads, one line per scheme, error bars = 95% CI (Student t) over seeds
  (Zheng et al. 2021, CODA Fig. 3 style), per task;
* each diagnostic's own section, drawn by its class (``LayerMetric.report_figures``): head-JSD
  heat maps of every row side by side, per location (CODA Figs. 2/4); histograms of
  log sum_i pi_ij per location and number of heads, the schemes overlaid (UNAS vs DNAS as in
  Ding et al. 2020 Fig. 1), with the -log Sk line of Theorem 2;
* what the schemes learn per head over training, per layer and head (HNAS's u: Ding et al.
  Figs. 3-5).

A small inline script records on ``<body data-images-ok="k/n">`` how many of the n
embedded images decoded (used by the browser test; harmless otherwise).
"""
from __future__ import annotations

import base64
import datetime as _dt
import html
from typing import Sequence

import numpy as np

from nas_cli.model.locations import LOCATIONS
from nas_cli.diagnostics import figures
from nas_cli.diagnostics.metrics import FigureRow, LayerMetric
from nas_cli.attention.additive import ROUND_OFF
from nas_cli.report.collect import TEST_METRICS, Run
from nas_cli.report.table import Group, reported, table_rows, unfinished_rows

__all__ = ["render_html"]

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.8em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right;white-space:nowrap}
.tw{max-width:100%;overflow-x:auto}td.long{white-space:normal;min-width:12em;max-width:28em;text-align:left}
th{background:#f3f3f3}td:nth-child(-n+3){text-align:left}
.figs{display:flex;flex-wrap:wrap;gap:12px}figure{margin:0}
figure img{max-width:100%;border:1px solid #eee}figcaption{font-size:12px;color:#555}
.note{font-size:12px;color:#666}
"""

SCRIPT = """
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (im) { return im.complete && im.naturalWidth > 0; }).length;
  document.body.setAttribute("data-images-ok", ok + "/" + imgs.length);
  var root = document.documentElement;
  document.body.setAttribute("data-overflow", root.scrollWidth > root.clientWidth + 1 ? "yes" : "no");
  var s = document.getElementById("status");
  if (s) { s.textContent = "figures decoded: " + ok + " of " + imgs.length; }
});
"""


# ---- figures -----------------------------------------------------------------------------

def _img(png: bytes, alt: str, caption: str | None = None) -> str:
    data = base64.b64encode(png).decode("ascii")
    cap = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">{cap}</figure>'


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(_td(c) for c in row) + "</tr>" for row in rows)
    # never wider than the page: long text cells wrap, a table still too wide scrolls in its own box
    return f'<div class="tw"><table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table></div>'


def _td(cell) -> str:
    text = html.escape(str(cell))
    return f'<td class="long">{text}</td>' if len(str(cell)) > 40 else f"<td>{text}</td>"


def metric_vs_heads(groups: Sequence[Group], task: str) -> bytes | None:
    """One panel per test metric (or the best validation value if no test ran), x = heads,
    one line per scheme, mean ± 95% CI (Student t) over seeds."""
    gs = [g for g in groups if g.common(lambda r: r.task) == task and g.runs[0].heads]
    if len({g.runs[0].heads for g in gs}) < 2:
        return None  # one number of heads: nothing to draw over heads
    metrics = [(k, t, hi) for k, t, hi in TEST_METRICS if any(g.stat(k) for g in gs)]
    if not metrics:
        names = {r.best_val_metric or "val" for g in gs for r in g.runs}
        name = next(iter(names)) if len(names) == 1 else "val"
        metrics = [("best_val", f"best {name}", not any(w in name for w in ("loss", "ppl", "perplexity")))]
    data: dict[str, dict[str, list]] = {}
    for key, title, _ in metrics:
        for g in gs:
            st = g.stat(key)
            if st:
                data.setdefault(title, {}).setdefault(g.series, []).append((g.runs[0].heads, st[0], st[1]))
    if not data:
        return None
    series = sorted({g.series for g in gs})
    return figures.metric_vs_heads(series, [(t, hi) for _, t, hi in metrics], data,
                                   f"{task}: metric vs number of heads (error bars: 95% CI over seeds, Student t)")


def metric_vs_length(groups: Sequence[Group], task: str) -> bytes | None:
    """Length generalization (``eval_lengths``): one panel per test metric evaluated at other lengths,
    x = the length (the trained one and each evaluated one), one line per scheme, mean ± 95% CI."""
    from tasks.scores import spec, split_key

    gs = [g for g in groups if g.common(lambda r: r.task) == task]
    data: dict[str, dict[str, list]] = {}
    panels: dict[str, tuple[str, bool | None]] = {}
    for g in gs:
        trained = {((r.summary or {}).get("lengths") or {}).get("trained") for r in g.runs} - {None}
        at = next(iter(trained)) if len(trained) == 1 else None  # the trained length, the runs agreeing
        keys = {k for r in g.runs for k in ((r.summary or {}).get("test") or {})}
        for key in sorted(keys):
            parts = split_key(key)
            if not parts or parts[0].split("/")[-1] in ("loss", "token_acc"):
                continue
            base = spec(parts[0])
            panels[base.key] = (base.title, base.higher_is_better)
            points = [(parts[1], key)] + ([(at, parts[0])] if at is not None else [])
            for length, name in points:
                st = g.stat(name)
                if st:
                    data.setdefault(base.title, {}).setdefault(g.series, []).append((length, st[0], st[1]))
    if not data:
        return None
    for title in data:
        for series in data[title]:
            data[title][series] = sorted(set(data[title][series]))
    return figures.metric_vs_heads(sorted({g.series for g in gs}), list(panels.values()), data,
                                   f"{task}: metric vs evaluated length (error bars: 95% CI over seeds, Student t)",
                                   xlabel="length (tokens)")


def state_bytes(run: Run) -> float | None:
    """What decoding holds at the end of the task's sequence, in bytes: the recurrent mixers' states plus the
    attention layers' cache at the trained length (sliding windows counted full), the x of Zoology's figure of
    recall against state size. A summary without ``kv_cache_bytes_per_token`` (written before nas-run recorded
    it, when every layer was attention with a key and value per head) counts 2 x d_model x layers float32
    numbers per token. None where the length or the model's size is missing."""
    s, config = run.summary or {}, run.flat_config
    length = (s.get("lengths") or {}).get("trained") or config.get("task.seq_len") or config.get("task.tokens_per_sample")
    kv = s.get("kv_cache_bytes_per_token")
    if kv is None and "recurrent_state_bytes" not in s and isinstance(config.get("model.d_model"), int) \
            and isinstance(config.get("model.decoder_layers"), int):
        kv = 2 * config["model.d_model"] * config["model.decoder_layers"] * 4
    if kv is None or not isinstance(length, (int, float)) or length <= 0:
        return None
    windowed = s.get("kv_cache_windowed")
    cache = windowed["windows"] + windowed["per_token_beyond_windows"] * length if windowed else kv * length
    return float((s.get("recurrent_state_bytes") or 0) + cache)


def metric_vs_state(groups: Sequence[Group], task: str) -> bytes | None:
    """Zoology's figure (Arora et al. 2024, Fig. 2 right): the accuracy (every test metric where the task has
    no accuracy) against the bytes decoding holds (:func:`state_bytes`, log axis), one point per scheme and
    width, one line per scheme, mean +- 95% CI over seeds."""
    gs = [g for g in groups if g.common(lambda r: r.task) == task]
    xs = {g.label: g.common(state_bytes) for g in gs}
    gs = [g for g in gs if "," not in xs[g.label] and xs[g.label] != "-"]
    if len({xs[g.label] for g in gs}) < 2:
        return None
    from tasks.scores import present

    shown = present({k for g in gs for r in g.runs for k in ((r.summary or {}).get("test") or {}) if "@" not in k})
    metrics = [m for m in shown if any(g.stat(m.key) for g in gs)]
    metrics = [m for m in metrics if m.key.endswith("acc") and m.key != "test/token_acc"] or metrics
    data: dict[str, dict[str, list]] = {}

    def line(g: Group) -> str:  # the scheme and what tells its rows apart, except the width the x follows
        extra = " ".join(f"{k}={v}" for k, v in g.distinct.items() if k not in ("model.d_model", "d_model"))
        return g.common(lambda r: r.scheme) + (f" {extra}" if extra else "")

    for m in metrics:
        for g in gs:
            st = g.stat(m.key)
            if st:
                data.setdefault(m.title, {}).setdefault(line(g), []).append((float(xs[g.label]), st[0], st[1]))
    if not data:
        return None
    shares = all(m.fmt == "pct" for m in metrics)  # accuracies: the axis stays within 0 and 1
    return figures.metric_vs_heads(sorted({line(g) for g in gs}), [(m.title, m.higher_is_better) for m in metrics],
                                   data, f"{task}: metric vs state size (error bars: 95% CI over seeds, Student t)",
                                   xlabel="state at the trained length (bytes)", exact_ticks=False,
                                   bounds=(0.0, 1.0) if shares else None)


def _layer_entries(run: Run, loc: str) -> list[dict]:
    return (((run.latest or {}).get("locations") or {}).get(loc) or {}).get("layers") or []


def figure_rows(groups: Sequence[Group], loc: str) -> list[FigureRow]:
    """The report's rows as a diagnostic's page figures see them, at one location."""
    return [FigureRow(g.common(lambda r: r.task), g.common(lambda r: r.heads), g.label, g.series,
                      [_layer_entries(r, loc) for r in g.runs]) for g in groups]


def metric_classes(groups: Sequence[Group]) -> list[type[LayerMetric]]:
    """The diagnostics the runs computed (``diagnostics.metrics`` of their configs), in order. One
    that cannot be imported here (a plug-in whose module is not on PYTHONPATH) draws no figure."""
    from hydra.utils import get_class

    out = []
    for target in dict.fromkeys(t for g in groups for r in g.runs for t in r.metric_targets):
        try:
            cls = get_class(target)
        except Exception:  # noqa: BLE001 - its numbers are in the tables all the same
            continue
        if isinstance(cls, type) and issubclass(cls, LayerMetric) and cls.report_section:
            out.append(cls)
    return out


def learned_trajectories(run: Run) -> list[tuple[str, bytes]]:
    """One figure per value the run's schemes learned per head: (title, PNG)."""
    return [(run.learned_title(name), png) for name, hist in run.learned_history().items()
            if (png := _trajectories(run, name, hist)) is not None]


def _trajectories(run: Run, name: str, hist) -> bytes | None:
    if len(hist) < 2:
        return None
    last = hist[-1][1]
    locs = [loc for loc in LOCATIONS if loc in last] + [l for l in last if l not in LOCATIONS]
    shapes = {loc: np.asarray(last[loc], dtype=float).shape for loc in locs}
    keep = [(s, u) for s, u in hist if all(loc in u and np.asarray(u[loc], dtype=float).shape == shapes[loc]
                                            for loc in locs)]
    u = np.stack([np.concatenate([np.asarray(u[loc], dtype=float) for loc in locs]) for _, u in keep])
    names = [f"{loc} L{l}" for loc in locs for l in range(shapes[loc][0])]
    return figures.trajectory_panels([s for s, _ in keep], u, names, f"{run.learned_title(name)}: {run.path.name}")


# ---- the page ----------------------------------------------------------------------------

def _diag_rows(groups: Sequence[Group]) -> tuple[list[str], list[list[str]]]:
    """Per location, every number the runs' diagnostics declared (their own titles and formats):
    mean ± the 95% interval's half-width over seeds, or the least value where the declaration
    combines by its minimum (a bound, such as the margin over -log Sk)."""
    declared = reported([r for g in groups for r in g.runs])
    head = ["task", "row", "location", *(d.title for d in declared.values())]
    show = {"pct": lambda x: f"{100 * x:.2f}%", "g": lambda x: f"{x:.3g}"}
    rows = []

    def cell(g: Group, name: str, d) -> str:
        f = show.get(d.format, lambda x: f"{x:.3f}")
        if d.over_locations == "min":
            values = g.values(name)
            return f(min(values)) if values else "-"
        st = g.stat(name)
        if st is None:
            return "-"
        m, sd, n = st
        return f(m) + (f" ± {f(sd)}" if n > 1 else "")

    for g in groups:
        locs = []
        for r in g.runs:
            locs += [l for l in r.diag_locations() if l not in locs]
        for loc in locs:
            rows.append([g.common(lambda r: r.task), g.label, loc,
                         *(cell(g, f"{name}:{loc}", d) for name, d in declared.items())])
    return head, rows


def render_html(runs: Sequence[Run], groups: Sequence[Group], sources: Sequence[str],
                title: str = "nas-report", by: Sequence[str] | None = None, verdicts=None, items=None,
                notes: Sequence[str] = (), tuning=None) -> str:
    """The page; ``tuning``: a tuned comparison's table as (title, head, rows, caption)."""
    grouping = "runs that differ only by seed" if by is None else f"runs with equal {', '.join(by)}"
    parts = [f"<h1>{html.escape(title)}</h1>",
             f'<p class="note">{len([r for r in runs if r.finished])} finished run(s) in {len(groups)} row(s) '
             f"from {html.escape(', '.join(map(str, sources)))}; generated "
             f"{_dt.datetime.now().strftime('%Y-%m-%d %H:%M')}. <span id=\"status\"></span></p>"]
    if groups:
        parts += _result_sections(groups, grouping, verdicts, items, notes, tuning) + _figure_sections(groups)
    uh, ur = unfinished_rows(runs)
    if ur:
        parts += ["<h2>Runs without results (failed, or unfinished: no summary.json)</h2>", _table(uh, ur)]
    body = "\n".join(parts)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{CSS}</style></head>\n<body>\n{body}\n<script>{SCRIPT}</script>\n</body></html>\n")


def _result_sections(groups: Sequence[Group], grouping: str, verdicts, items, notes: Sequence[str],
                     tuning=None) -> list[str]:
    """The tables: results over seeds, a tuned comparison's choices, the verdicts, the test-set detail, the
    diagnostics per location."""
    head, rows = table_rows(groups)
    parts = ["<h2>Results</h2>", _table(head, rows),
             f'<p class="note">mean ± 95% CI (Student t) over {html.escape(grouping)} (n runs); JSD: head diversity '
             "(Zheng et al. 2021), mean over locations and layers; expl. away: fraction of keys with "
             "sum_i pi_ij &lt; eps (Ding et al. 2020), mean over locations.</p>"]
    if tuning:
        ttitle, th, tr, tcaption = tuning
        parts += [f"<h2>{html.escape(ttitle[0].upper() + ttitle[1:])}</h2>", _table(th, tr),
                  f'<p class="note">{html.escape(tcaption)}</p>']
    if verdicts:
        (vh, vr), note = verdicts
        parts += ["<h2>Across seeds (the verdict): against the baseline</h2>", _table(vh, vr),
                  f'<p class="note">{html.escape(note)}</p>']
    if items and items[0][1]:
        (ih, ir), inote = items
        parts += ["<h2>On this test set, per trained model (supporting detail, not a verdict)</h2>",
                  _table(ih, ir), f'<p class="note">{html.escape(inote)}</p>']
    parts += [f'<p class="note">note: {html.escape(line)}</p>' for line in notes]
    dh, dr = _diag_rows(groups)
    if dr:
        parts += ["<h2>Attention diagnostics per location</h2>", _table(dh, dr),
                  '<p class="note">min margin &gt;= 0: every key keeps mass &gt;= 1/Sk (Ding et al. Theorem 2, '
                  "guaranteed for DNAS in the non-causal encoder). Step variation (cross-attention): largest "
                  "change of a head's attention over the source across decoder steps; 0 (in float32 below "
                  f"{ROUND_OFF:g}, the softmax's rounding) means the attention ignores the decoder state, as "
                  "one-layer additive attention does.</p>"]
    return parts


def _figure_sections(groups: Sequence[Group]) -> list[str]:
    """The figures: metric vs heads, head-JSD heat maps, Fig. 1 histograms, learned values."""
    parts = []
    figs = [_img(png, f"{task} metric vs heads") for task in sorted({g.common(lambda r: r.task) for g in groups})
            for png in [metric_vs_heads(groups, task)] if png]
    if figs:
        parts += ["<h2>Metric vs number of heads</h2>", f'<div class="figs">{"".join(figs)}</div>']
    figs = [_img(png, f"{task} metric vs length") for task in sorted({g.common(lambda r: r.task) for g in groups})
            for png in [metric_vs_length(groups, task)] if png]
    if figs:
        parts += ["<h2>Metric vs evaluated length</h2>", f'<div class="figs">{"".join(figs)}</div>']
    figs = [_img(png, f"{task} metric vs state size") for task in sorted({g.common(lambda r: r.task) for g in groups})
            for png in [metric_vs_state(groups, task)] if png]
    if figs:
        parts += ["<h2>Metric vs state size</h2>", '<p class="note">x: the bytes decoding holds at the trained '
                  "length: recurrent states, plus the attention layers' keys and values for every position "
                  "(Zoology's figure of recall against state size).</p>", f'<div class="figs">{"".join(figs)}</div>']
    rows = {loc: figure_rows(groups, loc) for loc in LOCATIONS}
    for cls in metric_classes(groups):  # each diagnostic's own section (JSD heat maps, Fig. 1 histograms, ...)
        drawn = [(caption, png) for loc in LOCATIONS for caption, png in cls.report_figures(rows[loc], loc)]
        if drawn:
            heading, note = cls.report_section
            parts += [f"<h2>{html.escape(heading)}</h2>", *([f'<p class="note">{note}</p>'] if note else []),
                      '<div class="figs">' + "".join(_img(png, caption, caption) for caption, png in drawn) + "</div>"]
    us = [(g, title, png) for g in groups for title, png in learned_trajectories(g.runs[0])]
    if us:
        parts += ["<h2>Learned per head, over training</h2>",
                  '<div class="figs">' + "".join(_img(png, title, f"{g.label} (first run: "
                                                      f"{g.runs[0].path.name})") for g, title, png in us) + "</div>"]
    return parts
