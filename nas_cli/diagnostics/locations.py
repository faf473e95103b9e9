"""One location's numbers from its layers' diagnostics, and what each number is: the per-location
scalars of diagnostics/summary.json and latest.json, with the diagnostics that do not apply to the
location's weights (``not_applicable``, with the reason) and those computed on a derived quantity
(``derived``); and the declarations nas-report reads to show and compare them."""
from __future__ import annotations

from typing import Any, Sequence

from nas_cli.diagnostics.collector import AttentionDiagnostics
from nas_cli.diagnostics.metrics import LayerMetric, Reported
from nas_cli.diagnostics.notes import ABS_SHARES, ROW_NORMALIZED, ROW_SHARES, SIGNED_NOTE, UNNORMALIZED_NOTE


def location_scalars(layers: list[dict[str, Any]], metrics: list[LayerMetric] | None = None) -> dict[str, Any]:
    """Per-location summary of ``AttentionDiagnostics.compute()[loc]``: every metric's
    ``location_scalars`` (default metrics when none are given). Where a layer's weights were
    not probability distributions, the distribution metrics' keys read None, with a note."""
    metrics = metrics if metrics is not None else AttentionDiagnostics().metrics
    out: dict[str, Any] = {"layers": len(layers)}
    signed = any(e.get("signed_weights") for e in layers)
    unnormalized = any(e.get("rows_sum_to_one") is False for e in layers)
    unbounded = any(e.get("unbounded_weights") for e in layers)
    if signed:
        out["note"] = SIGNED_NOTE
    not_applicable, derived = {}, {}
    for m in metrics:
        if m.distributions_only and (signed or (unnormalized and not m.row_normalized_ok)):
            out.update({r.field: None for r in m.reported})
            not_applicable.update({r.name: SIGNED_NOTE if signed else UNNORMALIZED_NOTE for r in m.reported})
        else:
            out.update(m.location_scalars(layers))
            if m.distributions_only and unnormalized:
                derived.update({r.name: ROW_NORMALIZED for r in m.reported})
            elif m.unit_scale and (signed or unbounded):
                derived.update({r.name: ABS_SHARES if signed else ROW_SHARES for r in m.reported})
    if not_applicable:
        out["not_applicable"] = not_applicable
    if derived:
        out["derived"] = derived
    return out


def reported_numbers(metrics: Sequence[LayerMetric], learned: Sequence[str]) -> list[Reported]:
    """What nas-report may show and compare for a run: each metric's declaration (nas-report names
    it by its ``name``), and the mean of each value the schemes learn per head (``<name>_mean``)."""
    return [*(r for m in metrics for r in m.reported), *(Reported(f"{name}_mean", f"{name} (mean)") for name in learned)]
