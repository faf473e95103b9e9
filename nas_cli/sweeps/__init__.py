"""Sweeps over many runs:

* ``supervision``: a sweep's own process: stop signals, joblib's worker processes, the one line
  that says how to continue;
* ``continuation``: a sweep launched again into its directory is the same sweep (its jobs keep
  their numbers; finished jobs are skipped, their saved configs kept);
* ``sequential`` (``seed=auto``): seeds in rounds until every comparison is decided;
  ``design``: its grid, baseline pairing and job numbering.
"""
