"""The model's size before anything is made: its parameters counted on a copy built on the meta
device, and whether its training state fits this machine's memory (part of the pre-run checks,
:mod:`nas_cli.pipeline.checks.config`)."""
from __future__ import annotations

import os

from omegaconf import DictConfig, OmegaConf

from nas_cli.errors import UserError


BYTES_PER_PARAM_TRAINING = 16  # float32 weights + gradients + Adam's two moments


class _VocabularyToCome:
    """A task whose vocabulary is known only once its data are read (a subword or word vocabulary):
    the task itself, with ``task.vocab_size`` (the subword target, else 1) standing in for it."""

    def __init__(self, task, size: int):
        self._task, self.src_vocab_size, self.tgt_vocab_size = task, size, size

    def __getattr__(self, name):
        return getattr(self._task, name)


def model_parameters(cfg: DictConfig, plan, task) -> tuple[int, bool] | None:
    """(parameters, exact) of the model ``cfg`` builds for ``task``, counted on a copy built on the
    meta device (shapes only, nothing allocated: the same code as the run's, so every family and
    every scheme's own parameters count, tied weights once). Not exact when the vocabulary comes
    from the data (``task.vocab_size`` stands in for it, else only the rest is counted); None when
    the model cannot be built here (the run then reports why where it builds it). A value the model's own
    constructors refuse (a ValueError naming the option: model.kv_heads with a scheme whose keys are its queries,
    model.mla with one that projects its own sizes) is refused here, before the run's directory holds anything,
    when the vocabulary is known (a stand-in one could make a value wrong that is right for the real one)."""
    if plan is None or task is None or "model" not in cfg:
        return None
    import torch

    from nas_cli.pipeline.lit import NasLitModule, count_parameters

    exact = True
    try:
        task.src_vocab_size
    except Exception:  # noqa: BLE001 - a tokenizer not trained yet
        vocab = cfg.task.get("vocab_size")
        known = isinstance(vocab, int) and not isinstance(vocab, bool) and vocab > 0
        task, exact = _VocabularyToCome(task, int(vocab) if known else 1), False
    from nas_cli.errors import UserError

    try:
        with torch.device("meta"):
            module = NasLitModule(cfg.model, plan.model_cores(cfg.model), cfg.optim, task)
    except ValueError as err:  # an option the model refuses: one line, before anything is written
        if not exact:  # built with a stand-in vocabulary: the run builds the real one and says what is wrong
            return None
        raise UserError(str(err).splitlines()[0]) from None
    except Exception:  # noqa: BLE001 - reported, with its context, where the run builds the model
        return None
    return count_parameters(module.model), exact


def available_memory() -> int | None:
    """Bytes this process could still allocate on the CPU (MemAvailable), None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _gpu_memory() -> int | None:
    try:
        import torch

        if torch.cuda.is_available():
            return int(torch.cuda.get_device_properties(0).total_memory)
    except Exception:  # noqa: BLE001 - no usable CUDA: judge by CPU memory
        return None
    return None


def check_memory(cfg: DictConfig, params: int) -> None:
    """The weights, gradients and Adam state of ``params`` parameters against this machine's memory."""
    need = params * BYTES_PER_PARAM_TRAINING
    accel = str(OmegaConf.select(cfg, "trainer.accelerator", default="auto"))
    have = _gpu_memory() if accel in ("gpu", "cuda", "auto") else None
    where = "GPU memory" if have else "available memory"
    have = have or available_memory()
    if have and need > have:
        raise UserError(f"the model is too large for this machine: ~{params / 1e9:.2f}B parameters need "
                        f"~{need / 2**30:.1f} GiB for weights, gradients and Adam state, but there is "
                        f"{have / 2**30:.1f} GiB of {where}; lower model.d_model, model.ffn or the layer counts")
