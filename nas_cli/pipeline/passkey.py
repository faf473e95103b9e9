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
    """{"lengths", "depths", "accuracy": [[share retrieved per depth] per length], "samples"}."""
    if not hasattr(task, "tokenizer") or not hasattr(task, "streams") or "test" not in getattr(task, "streams", {}):
        raise UserError(f"--passkey asks a subword language model (task=subword_lm) of its held-out text; "
                        f"task '{getattr(task, 'name', '?')}' is not one (task=retrieval trains and tests the grid "
                        "itself)")
    model.eval()
    rng = np.random.default_rng(seed)
    grid = []
    for length in lengths:
        row = []
        for depth in depths:
            ids, k = probes(task, int(length), float(depth), samples, rng)
            logits, _ = model(ids[:, :-1])
            predicted = logits[:, -k:].argmax(-1)
            row.append(float((predicted == ids[:, -k:]).all(dim=1).double().mean()))
        grid.append(row)
    return {"lengths": [int(n) for n in lengths], "depths": [float(d) for d in depths], "samples": int(samples),
            "seed": int(seed), "accuracy": grid}
