"""Run infrastructure: what makes a run safe to stop, resume, scale out and log, and nothing
about attention. The research core (``model``, ``lit``, ``plan``, ``attention``, ``diagnostics``)
sits one floor up and never needs to be read to understand these:

* ``rundir``: who owns a run directory and what it says about itself (lock, failed marker);
  ``atomic``: the one way a file is written (temporary file, then rename);
* ``resume``: which checkpoint a run continues from, stop signals, fault tolerance;
  ``checkpoints``: checkpoint files written atomically, read safely;
* ``config_identity``: the config's identity without its seed (``config_id``);
* ``redaction``: secrets never reach a file;
* ``loggers``: W&B / CSV / no logger; ``wandb_offline``: read an offline W&B run;
* ``distributed``: data order, sharding, gathered metrics and step RNG for DDP/FSDP/XLA;
  ``launchers``: the SLURM (submitit) and joblib launchers;
* ``validate_at_end``: the validation that always ends a run.
"""
