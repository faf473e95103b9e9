"""A nas-run language model as an lm-evaluation-harness model (``lm_eval.api.model.TemplateLM``).

:class:`NasLM` scores with any decoder-only model nas-run trains (its own Transformer, ``model=hf_*``),
with the tokenizer of its ``task=subword_lm`` run:

* ``loglikelihood``: lm-eval's own encoding of each (context, continuation) pair (``TemplateLM``: the
  context's trailing spaces move to the continuation; an empty context is conditioned on the
  end-of-document token, which precedes every document the model was trained on), then batches of requests,
  longest first (lm-eval's ``Collator``), each row the last ``max_length`` tokens of context + continuation,
  right-padded; the continuation's log-probabilities come from the model's output layer applied to the
  positions that predict it, and ``is_greedy`` says whether each of its tokens is the argmax there. This is
  what lm-eval's ``HFLM`` computes for a Hugging Face model (tests/zeroshot/test_lm_eval.py compares them).
* ``loglikelihood_rolling``: lm-eval's disjoint rolling windows of ``max_length`` tokens (one token of
  context at the first), summed per document.
* ``generate_until``: greedy decoding, the model re-run on the last ``max_length`` tokens at each step,
  stopped at the end-of-document token, after ``max_gen_toks`` tokens, or at the first ``until`` string
  (cut there, as lm-eval does).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.models.utils import Collator
from lm_eval import utils as lm_utils
from tqdm import tqdm

from tasks.base import EOS, PAD


class NasLM(TemplateLM):
    """``model``: a decoder-only nas-run model (``forward(ids, hidden=True)`` -> final states,
    ``output_logits``); ``task``: its ``SubwordLMTask`` (the tokenizer, the id offset)."""

    backend = "causal"

    def __init__(self, model: torch.nn.Module, task, batch_size: int = 16, max_length: int | None = None,
                 max_gen_toks: int = 64):
        super().__init__()
        self.model = model.eval()
        self.task = task
        self.batch_size = int(batch_size)
        self.max_length = int(max_length or task.block)
        self.max_gen_toks = int(max_gen_toks)
        self._device = next(model.parameters()).device

    @property
    def device(self):
        return self._device

    # ---- what lm-eval asks of a TemplateLM ----
    @property
    def eot_token_id(self) -> int:
        return EOS

    @property
    def tokenizer_name(self) -> str:
        return f"nas-run:{self.task.name}"

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        """The tokenizer's ids shifted past nas-run's specials; special tokens as the training documents were
        encoded unless lm-eval says otherwise."""
        enc = self.task.tokenizer.encode(string, add_special_tokens=True if add_special_tokens is None
                                         else bool(add_special_tokens))
        return [i + self.task.offset for i in enc.ids]

    def tok_decode(self, ids) -> str:
        return self.task.ids_to_text(ids)

    # ---- scoring ----
    @torch.no_grad()
    def _continuation_log_probs(self, rows: list[list[int]], spans: list[tuple[int, int]]) -> list[torch.Tensor]:
        """Per row, the log-probabilities (continuation length, V) at the positions that predict its
        continuation (``spans``: (input length, continuation length))."""
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), PAD, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        ids = ids.to(self._device)
        if getattr(self.model, "adaptive", False):  # an adaptive softmax: its forward gives log-probabilities
            full, _ = self.model(ids)
            return [full[i, n - c:n].float() for i, (n, c) in enumerate(spans)]
        h, _ = self.model(ids, hidden=True)
        picked = torch.cat([h[i, n - c:n] for i, (n, c) in enumerate(spans)])
        logp = F.log_softmax(self.model.output_logits(picked).float(), dim=-1)
        return list(logp.split([c for _, c in spans]))

    def _pieces(self, requests) -> tuple[list, list[int]]:
        """Each request as pieces the model scores in one row each: the whole continuation when context and
        continuation fit in ``max_length + 1`` tokens or the continuation does, else consecutive pieces of at most
        ``max_length`` continuation tokens, each after the tokens before it (a continuation longer than the
        window is scored as a sliding window reads it; lm-eval's HFLM refuses such a request)."""
        pieces, owner = [], []
        for i, (request, context, continuation) in enumerate(requests):
            if len(continuation) <= self.max_length:
                pieces.append((request, context, continuation))
                owner.append(i)
                continue
            for start in range(0, len(continuation), self.max_length):
                pieces.append((None, context + continuation[:start], continuation[start:start + self.max_length]))
                owner.append(i)
        return pieces, owner

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        def longest_first(req):
            toks = req[1] + req[2]
            return -len(toks), tuple(toks)

        pieces, owner = self._pieces(requests)
        order = Collator(pieces, sort_fn=longest_first)
        out = []
        bar = tqdm(total=len(pieces), disable=disable_tqdm, desc="nas-run: scoring")
        for chunk in order.get_batched(n=self.batch_size):
            rows, spans = [], []
            for _, context, continuation in chunk:
                row = (context + continuation)[-(self.max_length + 1):][:-1]
                rows.append(row)
                spans.append((len(row), len(continuation)))
            for (_, _, continuation), logp in zip(chunk, self._continuation_log_probs(rows, spans)):
                target = torch.tensor(continuation, dtype=torch.long, device=logp.device)
                out.append((float(logp.gather(1, target[:, None]).sum()), bool((logp.argmax(-1) == target).all())))
                bar.update(1)
        bar.close()
        answers = [(0.0, True) for _ in requests]
        for i, (ll, greedy) in zip(owner, order.get_original(out)):
            answers[i] = (answers[i][0] + ll, answers[i][1] and greedy)
        for (request, _, _), answer in zip(requests, answers):
            if request is not None:
                self.cache_hook.add_partial("loglikelihood", request, answer)
        return answers

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        windows, owner = [], []
        for i, (text,) in enumerate(req.args for req in requests):
            rolling = lm_utils.get_rolling_token_windows(token_list=self.tok_encode(text),
                                                         prefix_token=self.prefix_token_id,
                                                         max_seq_len=self.max_length, context_len=1)
            for context, continuation in map(lm_utils.make_disjoint_window, rolling):
                windows.append((None, context, continuation))
                owner.append(i)
        scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm) if windows else []
        totals = [0.0] * len(requests)
        for i, (ll, _) in zip(owner, scores):
            totals[i] += ll
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", (req.args[0],), total)
        return totals

    def _last_logits(self, ids: torch.Tensor) -> torch.Tensor:
        if getattr(self.model, "adaptive", False):
            return self.model(ids)[0][:, -1]
        h, _ = self.model(ids, hidden=True)
        return self.model.output_logits(h[:, -1])

    @torch.no_grad()
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out = []
        for context, options in tqdm([req.args for req in requests], disable=disable_tqdm, desc="nas-run: generating"):
            options = dict(options or {})
            until = options.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            steps = int(options.get("max_gen_toks", self.max_gen_toks))
            ids = self.tok_encode(context)[-max(1, self.max_length - steps):] or [EOS]
            made: list[int] = []
            for _ in range(steps):
                window = torch.tensor([(ids + made)[-self.max_length:]], dtype=torch.long, device=self._device)
                logits = self._last_logits(window)
                logits[:, PAD] = float("-inf")
                token = int(logits.argmax(-1))
                if token == EOS:
                    break
                made.append(token)
                if until and any(u in self.tok_decode(made) for u in until):
                    break
            text = self.tok_decode(made)
            for stop in until:
                text = text.split(stop)[0] if stop else text
            self.cache_hook.add_partial("generate_until", (context, options), text)
            out.append(text)
        return out
