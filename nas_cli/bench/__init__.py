"""Benchmarks behind ``nas-bench``: attention cores alone (:mod:`.attention`), end-to-end
training against a plain PyTorch reference (:mod:`.train`, :mod:`.reference`), and the
markdown sections they write (:mod:`.markdown`)."""
