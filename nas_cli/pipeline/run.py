"""One training job as a recipe of named steps (:func:`train`): prepare (plan, identity, checkpoint to
continue from), task and data, model, logger, trainer, fit, test, summary.

Called once per job by :mod:`nas_cli.pipeline.job` (whose one wrapper turns a failure into its
outcome), and for ``trainer=ray_ddp`` in each Ray Train worker (:mod:`nas_cli.infra.ray_train`).
"""
from __future__ import annotations

import contextlib
import re
import signal
import sys
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.utilities import rank_zero_only
from pytorch_lightning.utilities.exceptions import SIGTERMException

from nas_cli.infra.checkpoints import (PeriodicCheckpoint, checkpoint_io, tested_checkpoint,
                                      unreadable_checkpoint)
from nas_cli.errors import Refused, SignalStop, Stopped, UserError, record, say
from nas_cli.infra.atomic import remove_stale_temporaries
from nas_cli.infra.config_identity import config_id
from nas_cli.pipeline.lengths import log_length_charts, requested, test_at_lengths, write_depth_heatmap
from nas_cli.pipeline.lit import count_parameters
from nas_cli.pipeline.parts import build_module, build_task
from nas_cli.pipeline.sections import CheckpointOptions
from nas_cli.infra.loggers import finish_logger, make_logger, wandb_run_id
from nas_cli.infra.wandb_offline import carry_history
from nas_cli.model.plan import AttentionPlan, Cores
from nas_cli.infra.launchers import in_sweep_job
from nas_cli.pipeline.launch.sweep_launcher import in_sweep, shares_terminal
from nas_cli.pipeline.progress import progress_callback
from nas_cli.pipeline.summary import as_float, run_summary
from nas_cli.zeroshot.harness import at_end_of_training
from nas_cli.pipeline.trainer import (compile_failure, trainer_kwargs, compile_model, data_dependent_refusal,
                      set_threads)
from nas_cli.infra.fault_tolerance import FaultTolerance, Preempted, stop_signals
from nas_cli.infra.resume import RunCheckpoint, config_fingerprint, keep_summary, kept_summary, pick_checkpoint
from nas_cli.infra.redaction import redacted_argv
from nas_cli.infra.version import code_version, describe
from nas_cli.infra.atomic import atomic_write_json, atomic_write_text
from nas_cli.infra.rundir import ITEMS_FILE, as_refusal, continuing
from nas_cli.infra.distributed import StepSeed, shard_and_resume
from nas_cli.infra.validate_at_end import ValidateAtEnd


def _warn(message: str) -> None:
    print(f"nas-run: warning: {message}", file=sys.stderr)
    record(f"warning: {message}")


def train(cfg: DictConfig, plan: AttentionPlan, run_dir: Path, group: str, job_type: str = "train",
          size: tuple[int, bool] | None = None, task=None) -> dict[str, Any] | None:
    """One job, step by step: decide, build, log, train, test, report. ``plan``: the job's attention
    plan, as the pre-run check built it (``checks.check_config``, or ``AttentionPlan.for_job``); returns
    the summary also written to ``run_dir/summary.json`` (None in the other processes of a
    multi-process run: only global rank 0 reports).

    A run directory that holds checkpoints but no ``summary.json`` (a preempted, killed or requeued
    run, or ``nas-run resume=<dir>``) is continued from its newest readable checkpoint, in the same
    W&B run; ``nas-run resume=<finished run> trainer.max_steps=<more>`` trains a finished run longer
    (its earlier summary is kept as ``summary.step<N>.json``). A stop signal ends the job with one line
    at any moment (:func:`_stops`). ``size``: (parameters, exact) from the pre-run check, said once the
    run is under way; ``task``: the task the pre-run check built (None: built here)."""
    progress = Progress()
    with stop_signals(), _stops(progress, run_dir):
        job = _prepare(cfg, plan, run_dir, group, job_type)
        _say_start(cfg, job, size)
        task = build_task(cfg, task)
        data = shard_and_resume(task, int(cfg.seed), cfg.get("train_batch_items"), cfg.get("eval_batch_items"))
        module = build_module(cfg, task, job.cores)
        if size is None:  # not counted before the data were read (an adaptive softmax over their vocabulary)
            _say_size(f"model: {count_parameters(module.model):,} parameters")
        set_threads(cfg, count_parameters(module.model))  # from the model's size (pipeline/trainer.py)
        compiled = compile_model(module, cfg.get("compile", False))
        logger, wandb_id = _start_logger(cfg, job, {"parameters": count_parameters(module.model),
                                                    "code": code_version()})
        job = replace(job, identity={**job.identity, "wandb_run_id": wandb_id or job.identity["wandb_run_id"]})
        trainer, ckpt = _make_trainer(cfg, job, task, logger)
        _fit(cfg, job, trainer, module, data, compiled, progress)
        fit_seconds = module.fit_seconds_by_launch()  # this launch's training and, resumed, the earlier ones'
        # tokens of all processes (a collective: every process runs it)
        train_tokens = float(trainer.strategy.reduce(torch.tensor(float(module.train_tokens)), reduce_op="sum"))
        best, tested = _choose_tested(cfg, job, trainer, ckpt, task)
        test = _test(cfg, job, trainer, module, data, best, progress)
        test = {**test, **_test_lengths(cfg, job, trainer, module, task, best)}
        if not trainer.is_global_zero:
            return None
        progress.phase = "zero-shot evaluation"
        zero_shot = at_end_of_training(cfg, job.run_dir, module, task, logger)  # lm_eval.tasks (docs/zeroshot.md)
        summary = run_summary(cfg, job, trainer, ckpt, module, task, tested, test, fit_seconds, train_tokens)
        if zero_shot:
            summary["zero_shot"] = zero_shot
        _write_results(job, module, logger, summary)
        return summary


@contextlib.contextmanager
def _stops(progress: "Progress", run_dir: Path):
    """What a job's failures mean for its run directory: a bad value found while a continued run starts
    up changed nothing of it (:class:`Refused`: left as it was); a stop signal, in training, testing or
    outside them, ends the job with one line naming the phase and how to continue (:class:`Stopped`):
    the one place a signal becomes that line."""
    try:
        yield
    except Refused:
        raise
    except SIGTERMException as stop:  # Lightning's, in fit or test: the step, and whether last.ckpt was saved
        raise _stopped(stop, progress.trainer, run_dir, progress.phase) from None
    except UserError as err:
        if progress.phase == "startup":  # nothing of the run changed yet
            raise as_refusal(err, run_dir) from None
        raise
    except SignalStop as stop:
        at = f" at step {progress.trainer.global_step}" if progress.trainer is not None else ""
        raise Stopped(f"{signal.Signals(stop.signum).name} during {progress.phase}{at} (no summary.json); continue "
                      f"with: nas-run resume={run_dir}", 128 + stop.signum) from None


@dataclass
class Progress:
    """Where the run is (startup, training, testing) and its trainer: what the line of a stop signal
    outside training names. The run owns it and hands it to the steps that move it on."""

    phase: str = "startup"
    trainer: pl.Trainer | None = None


@dataclass
class _Job:
    """What one job decides once, before anything is built, and every later step reads."""

    run_dir: Path
    plan: AttentionPlan  # the one plan every part of this job reads
    cores: Cores  # the plan's cores for this job's model (its heads and attention dropout)
    identity: dict  # config fingerprint, group, job type, W&B run id: what a checkpoint must match
    config_id: str  # the configuration without seed and logging-only keys (summary.json, W&B)
    resume: tuple | None  # (checkpoint path, its state) to continue from, or None
    kept: Path | None  # the earlier summary of a finished run trained longer


def _estimated(parameters: int, vocab_size) -> str:
    """The start-up line of a model whose vocabulary the data decide (sizing.model_parameters)."""
    if isinstance(vocab_size, int) and not isinstance(vocab_size, bool) and vocab_size > 0:
        return (f"model: about {parameters:,} parameters (its embeddings counted at task.vocab_size={vocab_size}; "
                "the tokenizer trained on the data decides)")
    return f"model: {parameters:,} parameters + the embeddings of the vocabulary the data give"


def _say_start(cfg: DictConfig, job: "_Job", size: tuple[int, bool] | None) -> None:
    """The job's first lines: what it continues (and to what budget), and the model's size."""
    record(f"{'resumed from ' + job.resume[0].name if job.resume else 'started'}: {cfg.task.name}, {job.plan.tag}, "
           f"h{cfg.model.heads}, seed {cfg.seed}, config_id {job.config_id}, nas-run {describe(code_version())}")
    if job.resume and rank_zero_only.rank == 0:  # first: what this launch continues, and to what budget
        say(f"nas-run: continuing {job.run_dir} from step {int(job.resume[1].get('global_step', 0))} "
            f"({job.resume[0].relative_to(job.run_dir) if job.resume[0].is_relative_to(job.run_dir) else job.resume[0]}) "
            f"to trainer.max_steps={int(cfg.trainer.max_steps)}")
    if size is not None:
        _say_size(f"model: {size[0]:,} parameters" if size[1] else _estimated(size[0], cfg.task.get("vocab_size")))


def _say_size(line: str) -> None:
    """The model's size, once per run (not on a sweep's terminal: one line per finished job there)."""
    if rank_zero_only.rank != 0:
        return
    if not in_sweep_job():
        print(line, file=sys.stderr)
    record(line)


def _write_results(job: "_Job", module, logger, summary: dict[str, Any]) -> None:
    """The finished run's files, summary.json last (its presence means the run finished)."""
    if "test" in module.items:
        atomic_write_json(job.run_dir / ITEMS_FILE, module.items["test"], indent=None)
    log_length_charts(logger, summary)  # before the W&B run is closed
    write_depth_heatmap(job.run_dir, summary, module.task, logger)
    finish_logger(logger, summary, job.run_dir)
    keep_summary(job.run_dir, job.kept)  # a finished run trained longer: finished until now, with its earlier summary
    atomic_write_json(job.run_dir / "summary.json", summary)
    (job.run_dir / WANDB_ID_FILE).unlink(missing_ok=True)


def _prepare(cfg: DictConfig, plan: AttentionPlan, run_dir: Path, group: str, job_type: str) -> _Job:
    """Warnings and seeds; the plan's cores and the job's identity; which checkpoint (if any) this run
    continues from, refused when it belongs to another configuration."""
    run_dir.mkdir(parents=True, exist_ok=True)
    # evaluation metrics are gathered over all processes by nas-run itself (scale.gather_eval)
    warnings.filterwarnings("ignore", message=r".*sync_dist=True.*when logging on epoch level")
    # Lightning's own use of a torch pytree API that torch 2.13 deprecates: nothing a user can act on
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    cores = plan.model_cores(cfg.model)
    identity = {"config": config_fingerprint(cfg), "group": group, "job_type": job_type,
                "wandb_run_id": _saved_wandb_id(run_dir),  # a run killed before its first checkpoint
                # the plan in place of the composed attention node (model.plan.canonical_config, as nas-report reads it)
                "config_id": config_id({**OmegaConf.to_container(cfg, resolve=True), "attention": plan.identity()})}
    continued = continuing(run_dir) and (run_dir / "summary.json").is_file()
    resume = pick_checkpoint(run_dir, _warn) if continued or not (run_dir / "summary.json").exists() else None
    if resume is not None:  # the run's group, job type and W&B run id are the checkpoint's
        identity.update(_check_resumable(cfg, run_dir, resume, identity["config"]))
    if rank_zero_only.rank == 0:  # what a killed process was writing when it died (the directory is ours),
        for tmp in (run_dir / "checkpoints").glob("*.tmp"):  # even when no checkpoint was ever finished
            tmp.unlink(missing_ok=True)
        remove_stale_temporaries(run_dir)  # the diagnostics, summaries and logs it was writing
    kept = kept_summary(run_dir) if continued and rank_zero_only.rank == 0 else None
    return _Job(run_dir, plan, cores, identity, identity["config_id"], resume, kept)


def _check_resumable(cfg: DictConfig, run_dir: Path, resume: tuple, fingerprint: str) -> dict[str, Any]:
    """Refuse a checkpoint of another configuration, or more steps done than asked for; else the
    identity the checkpoint records (group, job type, W&B run id)."""
    state = resume[1]
    if state.get("config", fingerprint) != fingerprint:
        raise Refused(f"{run_dir} holds a checkpoint of a different configuration (model, attention, task or "
                        "seed differ); continue it with nas-run resume=<dir>, or use a new hydra.run.dir")
    done, limit = int(state.get("global_step", 0)), int(cfg.trainer.max_steps)
    if 0 < limit < done:
        raise Refused(f"trainer.max_steps={limit} is below the {done} steps this run has already trained "
                        f"(checkpoint {resume[0].name}); pass trainer.max_steps >= {done}")
    warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
    # the run's configuration id is its first launch's: a budget extended by a resume (trainer.max_steps) does
    # not make it another configuration than the seeds it was launched with
    return {k: state[k] for k in ("group", "job_type", "wandb_run_id", "config_id") if state.get(k)}


def _start_logger(cfg: DictConfig, job: _Job, extra: dict[str, Any]):
    """The configured logger (``extra``: what the logged config gets beside the composed one) and its
    W&B run id (None without W&B); a W&B run starts here (rank 0), its id kept for a resume."""
    logger = make_logger(cfg, job.plan, job.run_dir, job.identity["group"], job.identity["job_type"],
                         job.identity["wandb_run_id"], job.config_id, extra)
    wandb_id = wandb_run_id(logger)
    if wandb_id:
        if rank_zero_only.rank == 0:
            atomic_write_text(job.run_dir / WANDB_ID_FILE, wandb_id)
        with redacted_argv():
            run = _start_wandb(logger)  # W&B starts here (rank 0 only), recording a redacted command line
        if rank_zero_only.rank == 0 and str(cfg.logger.get("mode")) == "offline":
            # W&B cannot resume an offline run: this launch's folder gets the history logged before
            # the checkpoint it continues from, and the earlier folders move aside (wandb/superseded/)
            carry_history(run, job.run_dir / "wandb", int(job.resume[1]["global_step"]) if job.resume else -1)
    return logger, wandb_id


def _start_wandb(logger):
    """The W&B run; W&B's refusals (no login, a key it rejects, no server) as one line."""
    try:
        return logger.experiment
    except Exception as err:  # noqa: BLE001 - wandb.errors.Error and its subclasses, by name: W&B raises its own
        if type(err).__module__.startswith("wandb"):
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise UserError(f"W&B could not start the run ({first}); check `wandb login` and logger.mode / "
                            "logger.entity / logger.project, or use logger.mode=offline") from None
        raise


def _make_trainer(cfg: DictConfig, job: _Job, task, logger) -> tuple[pl.Trainer, RunCheckpoint]:
    """The Lightning trainer with nas-run's callbacks: the best checkpoint, last.ckpt on signals
    and every N steps, step seeds, the final validation, diagnostics, the progress bar."""
    ckpt_dir = job.run_dir / "checkpoints"
    # best.ckpt is chosen when a validation ends, never at a training epoch's end: an epoch that ends before this
    # launch's first validation has no monitored value to choose by (Lightning would warn of a missing key)
    ckpt = RunCheckpoint(dirpath=ckpt_dir, filename="best", monitor=task.monitor, mode=task.monitor_mode,
                         save_last=False, save_top_k=1, enable_version_counter=False,  # last.ckpt: FaultTolerance
                         save_on_train_epoch_end=False)
    saves = CheckpointOptions.of(cfg.checkpoint)
    fault = FaultTolerance(ckpt_dir / "last.ckpt", saves.last_every_n_steps or 0, job.identity)
    callbacks = [ckpt, fault, StepSeed(int(cfg.seed)), ValidateAtEnd()]  # FaultTolerance: signals in training
    callbacks += [PeriodicCheckpoint(ckpt_dir, saves.every_n_steps, saves.keep_last)] if saves.every_n_steps else []
    if cfg.diagnostics.enabled:
        from nas_cli.diagnostics.callback import DiagnosticsCallback

        opts = {k: v for k, v in OmegaConf.to_container(cfg.diagnostics, resolve=True).items() if k != "enabled"}
        callbacks.append(DiagnosticsCallback(run_dir=job.run_dir, **opts))
    shown = progress_callback(job.run_dir.name, task.monitor, shares_terminal(), bar=bool(cfg.progress_bar),
                              lines=bool(cfg.get("progress_lines", True)), to_log=in_sweep())  # bar, lines, nothing
    callbacks += [shown] if shown is not None else []
    kwargs = trainer_kwargs(cfg, task)
    plugins = kwargs.pop("plugins", None) or []  # trainer.plugins (trainer=ray_ddp: Ray's cluster environment)
    plugins = [*(plugins if isinstance(plugins, (list, tuple)) else [plugins]),
               checkpoint_io(cfg.trainer.get("accelerator", "auto"))]
    trainer = pl.Trainer(**kwargs, callbacks=callbacks, logger=logger, plugins=plugins,
                         default_root_dir=str(job.run_dir), enable_progress_bar=shown is not None,
                         enable_model_summary=False)
    return trainer, ckpt


def _fit(cfg: DictConfig, job: _Job, trainer: pl.Trainer, module, data, compiled, progress: Progress) -> None:
    """Train (from the checkpoint to resume, if any)."""
    progress.phase, progress.trainer = "training", trainer
    try:
        trainer.fit(module, datamodule=data, ckpt_path=str(job.resume[0]) if job.resume else None, weights_only=True)
    except SIGTERMException:
        raise  # a stop: the job's one conversion (_stops)
    except Exception as err:
        refusal = data_dependent_refusal(err, cfg)
        if refusal:
            raise UserError(refusal) from None
        failure = compile_failure(err) if compiled else None  # compilation happens at the first forward
        if failure:
            raise UserError(f"compile={cfg.compile}: torch.compile ({compiled}) failed on this platform "
                            f"({failure}); run with compile=false") from err
        raise
    if trainer.interrupted:
        raise UserError(f"run interrupted; partial run left in {job.run_dir} (no summary.json written)")
    if trainer.global_step == 0:  # a run that trained nothing is not a finished run: no summary.json
        raise UserError("the run trained 0 steps (the training split gave no batch within trainer.max_steps, "
                        "max_epochs and max_time); give it data and a step budget")


def _choose_tested(cfg: DictConfig, job: _Job, trainer: pl.Trainer, ckpt: RunCheckpoint,
                   task) -> tuple[str | None, dict]:
    """Which weights the test uses: the best checkpoint's path (None: the final weights, also when
    the best checkpoint is unreadable), and that choice as summary.json records it."""
    best = ckpt.best_model_path or None
    unreadable = unreadable_checkpoint(best) if best and cfg.run_test else None
    if unreadable:  # truncated, or refused by the safe loader: the final weights are tested instead, said once
        _warn(f"{best} is unreadable ({unreadable}); testing the final weights (step {int(trainer.global_step)}) "
              "instead")
        best = None
    return best, tested_checkpoint(best, job.run_dir, task.monitor, as_float(ckpt.best_model_score),
                                   int(trainer.global_step),
                                   why=f"best checkpoint unreadable ({unreadable})" if unreadable else None)


def _test(cfg: DictConfig, job: _Job, trainer: pl.Trainer, module, data, best: str | None,
          progress: Progress) -> dict:
    progress.phase = "testing"
    return trainer.test(module, datamodule=data, ckpt_path=best, verbose=False,
                        weights_only=True)[0] if cfg.run_test else {}


def _test_lengths(cfg: DictConfig, job: _Job, trainer: pl.Trainer, module, task, best: str | None) -> dict:
    """The test at each of ``eval_lengths`` (nas_cli/pipeline/lengths.py), after the trained length's."""
    lengths = requested(cfg) if cfg.run_test else []
    return test_at_lengths(trainer, module, task, lengths, best)


def _stopped(stop: SIGTERMException, trainer: pl.Trainer, run_dir: Path, phase: str) -> Stopped:
    signum = getattr(stop, "signum", signal.SIGTERM)
    name = signal.Signals(signum).name
    phase = getattr(stop, "phase", phase)
    saved = "checkpoints/last.ckpt saved; " if isinstance(stop, Preempted) else ""
    again = "the resumed run repeats this validation; " if phase == "validation" else ""
    return Stopped(f"{name} during {phase} at step {trainer.global_step} ({saved}{again}no summary.json); "
                   f"continue with: nas-run resume={run_dir}", 128 + int(signum))


#: the W&B run id of a run that has no checkpoint yet (a kill before the first one reuses it)
WANDB_ID_FILE = ".wandb_run_id"


def _saved_wandb_id(run_dir: Path) -> str | None:
    try:
        text = (run_dir / WANDB_ID_FILE).read_text().strip()
    except OSError:
        return None
    return text if re.fullmatch(r"[a-z0-9]{1,64}", text) else None
