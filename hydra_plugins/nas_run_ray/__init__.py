"""nas-run's Ray launcher (``hydra/launcher=ray``), shipped in Hydra's plugin package as Hydra requires."""
