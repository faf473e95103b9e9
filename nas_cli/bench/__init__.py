"""The measurements the ``nas-bench`` and ``nas-repro`` commands run: attention cores alone
(:mod:`.attention`), end-to-end training against a plain PyTorch reference (:mod:`.train`,
:mod:`.train_loops`, :mod:`.reference`), the GPU checks (:mod:`.gpucheck`), the seeds' reproductions
(:mod:`.repro`), and what every benchmark shares: timing a command (:mod:`.timing`) and writing its
JSON and markdown section (:mod:`.markdown`). The benchmark scripts (``python benchmarks/<name>.py``,
from a checkout: statistics calibrations, speed and overhead benchmarks, the study's report and run
queues) import this package; nothing here imports them."""
