"""nas-run's sequential sweeper (``seed=auto``), shipped in Hydra's plugin package as Hydra requires."""
