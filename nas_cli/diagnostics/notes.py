"""What a location's diagnostics say where a scheme's weights are not probability distributions over keys:
why a number is undefined (``not_applicable``), and what a number was computed on instead (``derived``). The
diagnostics write these words into each run's files; nas-report reads them back (nas_cli/report/compare.py)."""
from __future__ import annotations

#: why a location's JSD / explained-away read null (diagnostics files; nas-report reads it: nas_cli/report/compare.py)
SIGNED_NOTE = ("attention weights with negative entries (e.g. attention.kernel=linear): JSD and explained-away "
               "assume probability distributions over keys and are undefined (null)")

#: why a distribution metric without ``row_normalized_ok`` reads null for rows that do not sum to 1
UNNORMALIZED_NOTE = ("attention weights whose rows do not sum to 1 (e.g. attention=sigmoid): this diagnostic "
                     "assumes probability distributions over keys and is undefined (null)")
#: what a distribution metric with ``row_normalized_ok`` was computed on for such rows
ROW_NORMALIZED = "row-normalized weights w_ij / sum_j' w_ij' (the scheme's rows do not sum to 1)"
#: what a metric with ``unit_scale`` was computed on for weights without a bound of 1
ROW_SHARES = "each row's shares of its mass w_ij / sum_j' w_ij' (the scheme's weights have no bound of 1)"
#: ... and for weights with negative entries, on which a threshold on the weight itself has no common scale
ABS_SHARES = ("each row's shares of its absolute mass |w_ij| / sum_j' |w_ij'| (the scheme's weights have negative "
              "entries)")
