"""Passkey retrieval in real text for a trained subword language model (``nas-eval RUN --passkey``): the
length x depth grid of ``task=retrieval`` asked of a model pretrained with ``task=subword_lm``.

Each probe is a window of ``L`` tokens: held-out text of the run's corpus (its test documents, from the
token cache), with the needle "The pass key is K. Remember it. K is the pass key." inserted at a depth of
it, then "What is the pass key? The pass key is" and the key's tokens (K: five digits drawn at random).
The probe counts as retrieved when every token of the key is the model's greedy choice after the tokens
before it (the same as generating the key greedily: each step's choice is the argmax given the true
prefix, which then equals the generated one). Cells: ``--passkey-samples`` probes at each length and depth.
"""
from __future__ import annotations

import numpy as np
import torch

from nas_cli.errors import UserError

NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = " What is the pass key? The pass key is"
DEPTHS = (0, 25, 50, 75, 100)


def probes(task, length: int, depth: float, samples: int, rng) -> tuple[torch.Tensor, int]:
    """``samples`` probes of ``length`` tokens with the needle at ``depth`` (0-100) and the number of answer
    tokens at their end."""
    def encode(text: str) -> list[int]:
        return [i + task.offset for i in task.tokenizer.encode(text).ids]

    hay, rows, answer_len = np.asarray(task.streams["test"]), [], None
    question = encode(QUESTION)
    for _ in range(samples):
        key = int(rng.integers(10000, 100000))
        needle, answer = encode(NEEDLE.format(key=key)), encode(f" {key}")
        fixed = len(needle) + len(question) + len(answer)
        n = length - fixed
        if n < 0 or n > len(hay):
            raise UserError(f"--passkey: a {length}-token probe does not fit (the needle, the question and the key "
                            f"take {fixed} tokens; the held-out text has {len(hay)}): choose lengths between "
                            f"{fixed} and {fixed + len(hay)} (--passkey-lengths)")
        start = int(rng.integers(0, len(hay) - n + 1))
        text = hay[start:start + n]
        at = int(round(depth / 100 * n))
        rows.append(np.concatenate([text[:at], needle, text[at:], question, answer]).astype(np.int64))
        answer_len = len(answer) if answer_len is None else min(answer_len, len(answer))
    return torch.from_numpy(np.stack(rows)), int(answer_len)


@torch.no_grad()
def passkey_grid(model, task, lengths, depths=DEPTHS, samples: int = 20, seed: int = 1) -> dict:
    """{"lengths", "depths", "accuracy": [[share retrieved per depth] per length], "retrieved": [[[0/1 per probe]
    per depth] per length], "samples", "seed", "probes_sha256"}: the probes depend on the seed, the tokenizer and
    the held-out text alone, so runs of one corpus and tokenizer are asked the same probes (their digest says so)."""
    import hashlib

    if not hasattr(task, "tokenizer") or not hasattr(task, "streams") or "test" not in getattr(task, "streams", {}):
        raise UserError(f"--passkey asks a subword language model (task=subword_lm) of its held-out text; "
                        f"task '{getattr(task, 'name', '?')}' is not one (task=retrieval trains and tests the grid "
                        "itself)")
    model.eval()
    rng = np.random.default_rng(seed)
    grid, retrieved, digest = [], [], hashlib.sha256()
    for length in lengths:
        row, hits = [], []
        for depth in depths:
            ids, k = probes(task, int(length), float(depth), samples, rng)
            digest.update(ids.numpy().tobytes())
            logits, _ = model(ids[:, :-1])
            predicted = logits[:, -k:].argmax(-1)
            got = (predicted == ids[:, -k:]).all(dim=1)
            row.append(float(got.double().mean()))
            hits.append([int(x) for x in got.tolist()])
        grid.append(row)
        retrieved.append(hits)
    return {"lengths": [int(n) for n in lengths], "depths": [float(d) for d in depths], "samples": int(samples),
            "seed": int(seed), "accuracy": grid, "retrieved": retrieved, "probes_sha256": digest.hexdigest()}


#: the metric names of the grid in an evaluation's record: test/passkey/<length> (the share over every depth)
#: and test/passkey/<length>/depth<d>
PASSKEY = "test/passkey/"


def grid_metrics(grid: dict) -> tuple[dict[str, float], dict[str, list], dict[str, list[int]]]:
    """The grid as an evaluation's metrics (each length's share over its depths, and each cell's), their
    declarations for nas-report (title, higher is better, shown as a share) and each metric's per-probe 0/1 (what
    nas-report's paired test-set detail reads)."""
    metrics, declared, items = {}, {}, {}
    for i, n in enumerate(grid["lengths"]):
        every = [hit for cell in grid["retrieved"][i] for hit in cell]
        metrics[f"{PASSKEY}{n}"], items[f"{PASSKEY}{n}"] = float(np.mean(every)), every
        declared[f"{PASSKEY}{n}"] = [f"passkey @{n}", True, "pct"]
        for j, d in enumerate(grid["depths"]):
            key = f"{PASSKEY}{n}/depth{int(d)}"
            metrics[key], items[key] = grid["accuracy"][i][j], grid["retrieved"][i][j]
            declared[key] = [f"passkey @{n} depth {int(d)}%", True, "pct"]
    return metrics, declared, items
