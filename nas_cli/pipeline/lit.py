"""LightningModule: loss, optimizer and schedule, metrics, logging hooks.

The one place that builds the model from config (:func:`build_model`).
"""
from __future__ import annotations

import sys
import time
from functools import partial

import pytorch_lightning as pl
import torch
from omegaconf import DictConfig, OmegaConf

from nas_cli.attention.learned import learned_scalars, learned_values
from nas_cli.model.decoding import beam_search
from nas_cli.errors import NonFiniteLoss, UserError, record
from nas_cli.model.losses import label_smoothed_nll
from nas_cli.model.transformer import DecoderOnlyLM, Seq2SeqTransformer
from nas_cli.model.plan import Cores
from nas_cli.model.scoring import (Scores, adaptive_greedy, class_balanced_accuracy, class_counts, group_accuracies,
                                   group_sums, per_byte_and_position, position_sums, score_log_probs,
                                   score_positions, scored)
from nas_cli.infra.distributed import gather_eval
from nas_cli.pipeline.optim import configure
from nas_cli.pipeline.sections import OptimOptions
from tasks.base import EMPTY_WARNING

#: where a checkpoint keeps the run's training time and tokens so far (resume continues them)
TIMING_KEY = "nas_run_timing"


def check_readout(task_name: str, readout: str | None, model_cfg) -> None:
    """A task that reads its outputs another way (MAD's compression) needs nas-run's own language model."""
    if readout and (model_cfg.get("family") or model_cfg.get("adaptive_softmax")):
        raise ValueError(f"task '{task_name}' decodes every position from the last position's state, which only "
                         "nas-run's own language model does: use model=tiny (or small, base) without "
                         "model.adaptive_softmax")


def build_model(model_cfg: DictConfig, cores: Cores, task) -> torch.nn.Module:
    """The model for ``task`` (seq2seq or LM) with the ``cores`` of the job's attention plan
    (``AttentionPlan.model_cores``)."""
    readout = getattr(task, "readout", None)  # (a task object outside tasks.base.Task declares none)
    check_readout(task.name if hasattr(task, "name") else "?", readout, model_cfg)
    if model_cfg.get("family"):  # a Hugging Face family (model=hf_llama, ...)
        from nas_cli.hf.models import build_hf_model

        if getattr(task, "document_end", None) is not None:
            raise ValueError("task.document_mask=true runs each packed document as its own sequence in nas-run's own "
                             "model: use model=tiny, small or base, or task.pack=false (no window crosses a document)")
        return build_hf_model(model_cfg, cores, task)
    scaling, mla = model_cfg.get("rope_scaling"), model_cfg.get("mla")
    common = dict(d_model=model_cfg.d_model, heads=model_cfg.heads, ffn=model_cfg.ffn, dropout=model_cfg.dropout,
                  norm_first=model_cfg.norm_first, positions=model_cfg.positions, max_len=model_cfg.max_len,
                  pad_id=task.pad_id, embed_dropout=model_cfg.get("embed_dropout"), kv_heads=model_cfg.get("kv_heads"),
                  qk_norm=bool(model_cfg.get("qk_norm", False)),
                  rope_scaling=OmegaConf.to_container(scaling, resolve=True) if isinstance(scaling, DictConfig) else scaling,
                  mla=OmegaConf.to_container(mla, resolve=True) if isinstance(mla, DictConfig) else mla)
    if task.kind == "lm":
        adaptive = model_cfg.get("adaptive_softmax")
        adaptive = OmegaConf.to_container(adaptive, resolve=True) if isinstance(adaptive, DictConfig) else adaptive
        return DecoderOnlyLM(task.src_vocab_size, cores, decoder_layers=model_cfg.decoder_layers,
                             adaptive_softmax=adaptive, readout=readout,
                             document_end=getattr(task, "document_end", None), **common)
    if model_cfg.get("adaptive_softmax"):
        raise ValueError("model.adaptive_softmax is for language-model tasks (word-level vocabularies); "
                         "set model.adaptive_softmax=null for translation")
    return Seq2SeqTransformer(task.src_vocab_size, task.tgt_vocab_size, cores,
                              encoder_layers=model_cfg.encoder_layers, decoder_layers=model_cfg.decoder_layers,
                              share_embeddings=model_cfg.share_embeddings, **common)


def item_outputs(task, index: list[int], nll: list[float], tokens: list[int], hyps: list[str] | None,
                 refs: list[str] | None) -> dict:
    """What a paired test needs from one evaluation, per test item in the split's order: the NLL
    sum and token count (perplexity can be resampled), and for generation tasks the hypothesis
    (as scored), its reference and whether the two are equal, and a fingerprint of the references
    (two runs are comparable only on the same references)."""
    import hashlib

    out = {"task": task.name, "kind": task.kind, "n": len(index), "index": index, "nll": nll, "tokens": tokens}
    if hyps is not None and refs is not None:
        exact = [int(h == r) for h, r in zip(hyps, refs)]  # on the decoded text, as the task's exact match
        scored_hyps, scored_refs = task.scored_text(hyps, refs)
        out.update(hyps=scored_hyps, refs=scored_refs, exact=exact, text="as scored",
                   refs_sha256=hashlib.sha256("\n".join(scored_refs).encode()).hexdigest())
    else:
        out["refs_sha256"] = hashlib.sha256(" ".join(map(str, tokens)).encode()).hexdigest()  # LM: the blocks' sizes
    return out


def count_parameters(module: torch.nn.Module) -> int:
    """Parameters of ``module``; tied weights are counted once."""
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())


def grad_norm(parameters) -> torch.Tensor:
    """Global 2-norm of the gradients of ``parameters`` (those without a gradient are skipped)."""
    norms = [torch.linalg.vector_norm(p.grad.detach().float()) for p in parameters if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros(())


class NasLitModule(pl.LightningModule):
    def __init__(self, model_cfg: DictConfig, cores: Cores, optim_cfg: DictConfig, task,
                 log_learned_every: int = 50):
        super().__init__()
        self.task = task
        self.model = build_model(model_cfg, cores, task)
        self.max_positions = int(model_cfg.max_len)
        self._decode_cap_said = False
        self._empty_said: set[str] = set()  # splits whose many empty hypotheses were said
        self.optim = OptimOptions.of(optim_cfg)
        if getattr(self.model, "adaptive", False) and self.optim.label_smoothing:
            raise ValueError("optim.label_smoothing must be 0 with model.adaptive_softmax (the adaptive softmax "
                             "computes only the target's probability); add optim.label_smoothing=0")
        self.log_learned_every = log_learned_every
        #: the name the test hooks score, key and log under: "test", or "valid" for ``nas-eval --split valid``
        #: (its references, per-item outputs and metrics are the valid split's)
        self.test_split = "test"
        #: optimizer step of each validation -> the step its values were logged at (Lightning's own count, N - 1
        #: within a launch, N at a resumed launch's first validations): where W&B's history holds them
        self.val_logged_at: dict[int, int] = {}
        # per split: hypotheses, references, item indices, per-item NLL sums and token counts
        self._eval_text: dict[str, tuple[list, list, list, list, list]] = {}
        self.decoded: dict[str, list[str]] = {}  # hypotheses of the last evaluation per split
        self.items: dict[str, dict] = {}  # per-item outputs of the last evaluation per split (paired tests)
        self._sums: dict[str, torch.Tensor] = {}
        self._tokens = None  # running count (a tensor on the batches' device: no host sync per step)
        self._earlier_tokens = 0  # counted by earlier launches (from the checkpoint resumed from)
        self.train_seconds = 0.0
        self._t0 = None
        # training time over every launch of this run: the seconds of earlier launches (up to the
        # checkpoint resumed from; None where that checkpoint did not record them) and this launch's start
        self.earlier_fit_seconds: list[float] = []
        self._fit_t0 = None

    @property
    def train_tokens(self) -> int:
        """Non-padding source + target-input tokens of all training batches so far."""
        return self._earlier_tokens + (0 if self._tokens is None else int(self._tokens))

    def _log_now(self) -> bool:
        """Whether Lightning hands this training step's metrics to the logger (every
        ``trainer.log_every_n_steps`` steps, and at a stop). Step-level values logged at other
        steps are never read (the next logging step logs fresh ones), so the per-step
        metrics other than the progress bar's loss are only computed and logged then:
        ``self.log`` costs about a millisecond per call on CPU."""
        trainer = self._trainer
        if trainer is None:
            return True
        try:
            return bool(trainer._logger_connector.should_update_logs or trainer.fast_dev_run)
        except AttributeError:  # a Lightning without this attribute: log at every step
            return True

    # ---- forward / loss ------------------------------------------------------------
    def _hidden_and_target(self, batch):
        """The final hidden states (B, T, d) and the targets (B, T) of a batch."""
        if self.task.kind == "lm":
            hidden, _ = self.model(batch["ids"], hidden=True)
            return hidden, batch["target"]
        hidden, _ = self.model(batch["src"], batch["tgt_in"], hidden=True)
        return hidden, batch["tgt_out"]

    def _step(self, batch, smoothing: float, accuracy: bool = True):
        """Training: loss, NLL sum, token count and (if ``accuracy``) correct greedy tokens, with the
        output layer applied to the trained positions only (the real targets: every position of a
        WikiText block, the query positions of MQAR, no padding), as the evaluation does."""
        if getattr(self.model, "adaptive", False):
            return self._adaptive_step(batch, smoothing, accuracy)
        hidden, target = self._hidden_and_target(batch)
        h, tgt, _ = scored(hidden, target, self.task.pad_id)
        logits = self.model.output_logits(h)  # (N, vocab)
        loss, nll_sum, n = label_smoothed_nll(logits, tgt, self.task.pad_id, smoothing)
        correct = None
        if accuracy:  # an argmax over (N, vocab): skipped on training steps that log nothing
            correct = (logits.argmax(-1) == tgt).sum()
        return loss, nll_sum, n, correct

    def _adaptive_step(self, batch, smoothing: float, accuracy: bool):
        """The same quantities with an adaptive softmax: only the targets' log-probabilities
        are computed (no (B, T, vocab) logits), which is where its speed comes from."""
        hidden, _ = self.model.features(batch["ids"])
        h, tgt, _ = scored(hidden, batch["target"], self.task.pad_id)  # the positions trained on
        logp = self.model.target_log_prob(h.float(), tgt)
        n = torch.tensor(tgt.numel(), device=tgt.device).clamp(min=1)
        nll_sum = -logp.sum()
        correct = (adaptive_greedy(self.model.generator, h.float()) == tgt).sum() if accuracy else None
        return nll_sum / n, nll_sum.detach(), n, correct

    def eval_scores(self, batch) -> Scores:
        """Evaluation: the NLL, token count, greedy hits and their per-row sums of the positions the
        evaluation counts, with the output layer applied to those positions only
        (:mod:`nas_cli.model.scoring`: a language model's context positions and every padded target
        get no vocabulary row)."""
        hidden, target = self._hidden_and_target(batch)
        if getattr(self.model, "adaptive", False):
            return score_log_probs(hidden, target, self.task.pad_id, self.model.target_log_prob,
                                   partial(adaptive_greedy, self.model.generator))
        return score_positions(hidden, target, self.task.pad_id, self.model.output_logits)

    @staticmethod
    def _batch_tokens(batch) -> torch.Tensor:
        """Non-padding tokens of the batch's inputs, as a tensor (no host sync)."""
        return sum((t != 0).sum() for k, t in batch.items() if k in ("src", "tgt_in", "ids"))

    # ---- training time across launches (a resumed run reports all of its training) -----
    def on_fit_start(self):
        self._fit_t0 = time.perf_counter()

    def fit_seconds_by_launch(self) -> list[float]:
        """Seconds of training per launch of this run, this launch last (so far)."""
        now = time.perf_counter() - self._fit_t0 if self._fit_t0 is not None else 0.0
        return [*self.earlier_fit_seconds, now]

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint[TIMING_KEY] = {"fit_seconds_by_launch": self.fit_seconds_by_launch(),
                                  "train_seconds": self.train_seconds, "train_tokens": self.train_tokens,
                                  "val_logged_at": dict(self.val_logged_at)}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        trainer = self._trainer
        if trainer is None or trainer.state.fn != "fit":  # testing the best weights is no resume
            return
        saved = checkpoint.get(TIMING_KEY)
        if saved is None:
            raise UserError(f"the checkpoint this run resumes from holds no training times ({TIMING_KEY}): it was "
                            "not written by this nas-run; start the run in a new directory")
        self.earlier_fit_seconds = list(saved["fit_seconds_by_launch"])
        self.train_seconds = float(saved["train_seconds"])
        self._earlier_tokens = int(saved["train_tokens"])
        self.val_logged_at = {int(k): int(v) for k, v in saved.get("val_logged_at", {}).items()}

    # ---- training ------------------------------------------------------------------
    def on_train_batch_start(self, batch, batch_idx):
        self._t0 = time.perf_counter()

    def training_step(self, batch, batch_idx):
        log_now = self._log_now()
        loss, nll_sum, n, correct = self._step(batch, float(self.optim.label_smoothing), accuracy=log_now)
        if not torch.isfinite(loss):
            raise NonFiniteLoss(
                f"training loss became {loss.item()} at step {self.global_step}; lower optim.lr, raise "
                "optim.warmup or set trainer.gradient_clip_val (no checkpoint of this state was written)"
            )
        bs = next(iter(batch.values())).size(0)
        self.log("train/loss", loss, prog_bar=True, batch_size=bs)
        if log_now:
            self.log("train/nll", nll_sum / n, batch_size=bs)
            self.log("train/token_acc", correct.float() / n, batch_size=bs)
            self.log("lr", self.optimizers().param_groups[0]["lr"], batch_size=bs)
        return loss

    def on_before_optimizer_step(self, optimizer) -> None:
        """The gradients' global 2-norm before clipping (Lightning clips after this hook; with
        mixed precision they are unscaled by now), logged with the other per-step values. Under
        FSDP each process holds a shard, so the value is its shard's."""
        if self._log_now():
            self.log("train/grad_norm", grad_norm(self.parameters()), batch_size=1)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self._t0 is not None:
            self.train_seconds += time.perf_counter() - self._t0
            tokens = self._batch_tokens(batch)
            self._tokens = tokens if self._tokens is None else self._tokens + tokens
            if self.train_seconds > 0 and self._log_now():
                self.log("train/tokens_per_s", self.train_tokens / self.train_seconds, batch_size=1)
        if self.global_step % self.log_learned_every == 0:  # on its own schedule, not log_every_n_steps's
            values = learned_scalars(learned_values(self.model))
            for logger in self.loggers if values else ():
                logger.log_metrics({k: float(v) for k, v in values.items()}, step=self.global_step)

    # ---- evaluation ----------------------------------------------------------------
    def _eval_step(self, batch, split: str):
        scores = self.eval_scores(batch)
        row_nll, row_n = scores.row_nll, scores.row_tokens
        counted = [("nll", scores.nll_sum), ("n", scores.tokens), ("correct", scores.correct)]
        if self.task.macro_accuracy_name:  # per-class counts for a class-balanced accuracy (MAD's)
            counted.append(("classes", class_counts(scores, self.task.tgt_vocab_size)))
        if "target_bytes" in batch:  # the UTF-8 bytes of the scored targets: bits per byte
            counted.append(("bytes", (batch["target_bytes"] * (batch["target"] != self.task.pad_id)).sum()))
        if self.task.loss_by_position:
            counted.append(("positions", position_sums(scores, batch["target"], self.task.pad_id)))
        if "group" in batch and self.task.group_names:  # the accuracy per group of rows (a needle's depth)
            counted.append(("groups", group_sums(scores, batch["target"], self.task.pad_id, batch["group"],
                                                 len(self.task.group_names))))
        for key, val in counted:
            self._sums[f"{split}/{key}"] = self._sums.get(f"{split}/{key}", 0) + val.detach().double()
        hyps, refs, index, nll, ntok = self._eval_text.setdefault(split, ([], [], [], [], []))
        rows = row_nll.size(0)
        # dataset positions (nas_cli.infra.distributed adds them); batches are sorted by length or sharded
        positions = [int(i) for i in batch["index"]] if "index" in batch else list(range(len(index), len(index) + rows))
        index.extend(positions)
        nll.extend(row_nll.double().tolist())
        ntok.extend(int(t) for t in row_n.tolist())
        if self.task.kind == "seq2seq":
            hyps.extend(self.task.ids_to_text(row) for row in self.decode(batch["src"], split))
            data_split = "valid" if split == "val" else split
            raw = [self.task.reference(data_split, i) for i in positions] if "index" in batch else []
            if raw and all(r is not None for r in raw):  # raw reference text, not a BPE round trip
                refs.extend(raw)
            else:
                refs.extend(self.task.ids_to_text(row) for row in batch["tgt_out"])

    def decode(self, src: torch.Tensor, split: str = "test") -> torch.Tensor:
        """Greedy or beam decoding as the task's decoding settings say (beam 1 = greedy). The
        output length is capped at the model's positions (``model.max_len`` - 1 after BOS),
        said once per run, instead of failing at the first long source."""
        max_len = self.task.max_decode_len(src.size(1))
        if max_len > self.max_positions - 1:
            if not self._decode_cap_said:
                self._decode_cap_said = True
                print(f"nas-run: note: decoding stops at model.max_len - 1 = {self.max_positions - 1} tokens: a "
                      f"{src.size(1)}-token source would allow {max_len} (task.max_len_a x length + task.max_len_b)",
                      file=sys.stderr)
            max_len = self.max_positions - 1
        dec = self.task.decoding
        beam = (self.task.valid_beam if split == "val" else dec["beam"]) if dec else 1
        if beam <= 1:
            return self.model.greedy_decode(src, self.task.bos_id, self.task.eos_id, max_len)
        out, _ = beam_search(self.model, src, self.task.bos_id, self.task.eos_id, self.task.pad_id, beam, max_len,
                             dec["lenpen"])
        return out

    def _eval_end(self, split: str):
        sums = {key: self._sums.pop(f"{split}/{key}", None)
                for key in ("n", "nll", "correct", "classes", "bytes", "positions", "groups")}
        text = self._eval_text.pop(split, ([], [], [], [], []))
        sums, text = gather_eval(sums, text)  # several processes (DDP): the whole split's statistics
        n = sums["n"]
        if n is None:
            return
        n = n.clamp(min=1)  # a split with nothing scored divides nothing by zero
        nll = sums["nll"] / n
        correct = sums["correct"] / n
        metrics = {f"{split}/loss": float(nll), f"{split}/ppl": float(torch.exp(nll.clamp(max=50))),
                   f"{split}/token_acc": float(correct)}
        if self.task.accuracy_name:  # a task whose metric is the accuracy where it scores (MQAR: the queries)
            metrics[f"{split}/{self.task.accuracy_name}"] = float(correct)
        if self.task.macro_accuracy_name and sums["classes"] is not None:
            metrics[f"{split}/{self.task.macro_accuracy_name}"] = class_balanced_accuracy(sums["classes"])
        metrics.update(per_byte_and_position(split, sums))
        metrics.update(group_accuracies(split, self.task.accuracy_name or "token_acc", self.task.group_names,
                                        sums["groups"]))
        hyps, refs, index, row_nll, row_n = text
        order = sorted(range(len(index)), key=index.__getitem__)  # the split's original order
        self.items[split] = item_outputs(self.task, [index[i] for i in order], [row_nll[i] for i in order],
                                         [row_n[i] for i in order], [hyps[i] for i in order] if hyps else None,
                                         [refs[i] for i in order] if refs else None)
        if hyps:
            self.decoded[split] = [hyps[i] for i in order]
        for key, val in (self.task.score(hyps, refs) if hyps else {}).items():
            metrics[f"{split}/{key}"] = float(val)
        self._say_empty(split, metrics.get(f"{split}/empty"))
        self.log_dict(metrics, batch_size=1)
        if split == "val" and self._trainer is not None and not self.trainer.sanity_checking:
            self.val_logged_at[int(self.global_step)] = int(self.trainer.fit_loop.epoch_loop._batches_that_stepped)

    def _say_empty(self, split: str, share: float | None) -> None:
        """One note when many test hypotheses are empty: the reported scores then say little. (Not for
        validations: early in training a model ending at once is usual, and says nothing yet.)"""
        if split == "val" or share is None or share <= EMPTY_WARNING or split in self._empty_said \
                or self.global_rank != 0:
            return
        self._empty_said.add(split)
        line = (f"nas-run: note: task '{self.task.name}': {share:.0%} of the {split} hypotheses are empty (the model "
                "ends at once); its scores say little: train longer, or check the data and task.max_len")
        from nas_cli.infra.launchers import in_sweep_job

        if in_sweep_job():  # a sweep's terminal has the job's line, with its share of empty hypotheses
            record(line)
        else:
            print(line, file=sys.stderr)

    def validation_step(self, batch, batch_idx):
        self._eval_step(batch, "val")

    def on_validation_epoch_end(self):
        self._eval_end("val")

    def test_step(self, batch, batch_idx):
        self._eval_step(batch, self.test_split)

    def on_test_epoch_end(self):
        self._eval_end(self.test_split)

    # ---- optimization --------------------------------------------------------------
    def configure_optimizers(self):
        return configure(self.parameters(), self.optim, self._trainer)
