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


#: the zero-shot tasks' local files (nas_cli/zeroshot/tasks.py), as ../shared/data lays them out
ZERO_SHOT_FILES = ("lambada_openai/lambada_test.jsonl", "piqa/valid.jsonl", "piqa/valid-labels.lst",
                   "hellaswag/hellaswag_val_full.txt.bz2", "boolq/validation/data-00000-of-00001.arrow")


def zero_shot_data(tmp_root: Path) -> Path:
    """../shared/data when it holds the zero-shot tasks' files, else tiny files of the same forms under
    ``tmp_root`` (a few items each, from the toy English words)."""
    if all((SHARED / f).exists() for f in ZERO_SHOT_FILES):
        return SHARED
    import bz2
    import json

    import datasets

    rng = random.Random(0)

    def sentence(n: int) -> str:
        return " ".join(rng.choice(WORDS_EN) for _ in range(n))

    root = tmp_root / "zero_shot_data"
    for folder in ("lambada_openai", "piqa", "hellaswag"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    (root / "lambada_openai" / "lambada_test.jsonl").write_text(
        "".join(json.dumps({"text": sentence(12).capitalize() + " " + rng.choice(WORDS_EN)}) + "\n" for _ in range(30)))
    (root / "piqa" / "valid.jsonl").write_text("".join(json.dumps(
        {"goal": sentence(6) + "?", "sol1": sentence(5) + ".", "sol2": sentence(5) + "."}) + "\n" for _ in range(30)))
    (root / "piqa" / "valid-labels.lst").write_text("".join(f"{rng.randint(0, 1)}\n" for _ in range(30)))
    lines = []
    for _ in range(30):
        lines += [f"Walking: {sentence(8)}", str(rng.randint(0, 3))] + [sentence(6) + "." for _ in range(4)]
    (root / "hellaswag" / "hellaswag_val_full.txt.bz2").write_bytes(bz2.compress(("\n".join(lines) + "\n").encode()))
    datasets.Dataset.from_list([{"question": sentence(5), "answer": rng.random() < 0.6, "passage": sentence(20)}
                                for _ in range(30)]).save_to_disk(str(root / "boolq" / "validation"))
    return root
