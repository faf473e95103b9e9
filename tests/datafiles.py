"""Real corpora from ../shared/data when present, tiny generated files otherwise."""
from __future__ import annotations

import random
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "data"
MULTI30K = SHARED / "multi30k" / "raw"
WIKITEXT2 = SHARED / "wikitext-2"

WORDS_DE = "ein eine der die das mann frau hund katze läuft spielt auf dem im park ball rot blau klein groß".split()
WORDS_EN = "a an the the the man woman dog cat runs plays on the in park ball red blue small big".split()


def write_parallel(root: Path, splits=("train", "valid", "test"), n=(300, 40, 40), src="de", tgt="en", seed=0):
    """A toy de->en corpus with a word-by-word mapping, so a model can learn it."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    for split, count in zip(splits, n):
        a, b = [], []
        for _ in range(count):
            idx = [rng.randrange(len(WORDS_DE)) for _ in range(rng.randint(3, 8))]
            a.append(" ".join(WORDS_DE[i] for i in idx).capitalize() + ".")
            b.append(" ".join(WORDS_EN[i] for i in idx).capitalize() + ".")
        (root / f"{split}.{src}").write_text("\n".join(a) + "\n", encoding="utf-8")
        (root / f"{split}.{tgt}").write_text("\n".join(b) + "\n", encoding="utf-8")
    return root


def write_lm(root: Path, n=(400, 60, 60), seed=0):
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    for split, count in zip(("train", "valid", "test"), n):
        lines = [" = Title = "] + [" ".join(rng.choice(WORDS_EN) for _ in range(rng.randint(4, 15))) for _ in range(count)]
        (root / f"{split}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root
