"""The one home of nas-run's benchmarks. Installed as ``nas_cli.bench`` (pyproject.toml maps this
folder there): the ``nas-bench`` command's measurements, attention cores alone (:mod:`.attention`)
and end-to-end training against a plain PyTorch reference (:mod:`.train`, :mod:`.reference`), and
the markdown sections every benchmark writes (:mod:`.markdown`). Beside them, run from a
checkout (``python benchmarks/<name>.py``): the statistics benchmarks (calibration, sequential
sweeps, A/A checks), speed and overhead benchmarks, the study's report and its run queues; and
the study's committed runs (``benchmarks/study/``, data). Results go to docs/ (JSON and tables)."""
