"""Checkpoint files: written atomically, read safely, and a full disk said in one line.

* :class:`AtomicCheckpointIO`: every checkpoint goes to a temporary file with a per-process name
  in the same directory, is flushed to disk, then renamed over the old one, so a run killed
  mid-save leaves at most a temp file, never a truncated ``.ckpt``; loading always uses the
  restricted unpickler (``weights_only=True``). A disk or quota that fills up while saving stops
  the run with one line naming the file and the free space; the previous checkpoint is intact.
* :class:`PeriodicCheckpoint`: ``step<N>.ckpt`` every N steps, the newest ``keep`` kept (for
  checkpoint averaging in ``nas-eval``).
"""
from __future__ import annotations

import errno
import os
import shutil
import sys
from pathlib import Path

import pytorch_lightning as pl
import torch
from pytorch_lightning.plugins.io import TorchCheckpointIO

from nas_cli.errors import UserError

from nas_cli.infra.atomic import atomic_write


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write checkpoints to a temporary file in the same directory, then rename.

    A run killed mid-save leaves at most a ``*.tmp`` file, never a truncated ``.ckpt``
    that looks complete."""

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        path = Path(path)
        checkpoint = _xla_to_cpu(checkpoint)
        try:
            atomic_write(path, lambda tmp: torch.save(checkpoint, tmp), fsync=True)
        except (OSError, RuntimeError) as err:  # torch.save reports a failed write as a RuntimeError
            code = _space_errno(err, path.parent, checkpoint)
            if code is None:
                raise
            free = shutil.disk_usage(path.parent).free
            raise UserError(f"cannot write checkpoint {path}: {os.strerror(code)} ({free / 2**20:,.0f} MiB free "
                            f"on that disk); the previous checkpoint is intact: free some space, then continue "
                            f"with nas-run resume={path.parent.parent}") from None

    def load_checkpoint(self, path, map_location=None, weights_only=None):
        # always the restricted unpickler: checkpoints hold tensors and plain containers only
        return super().load_checkpoint(path, map_location=map_location or (lambda storage, loc: storage),
                                       weights_only=True)


def checkpoint_io(accelerator) -> TorchCheckpointIO:
    """The checkpoint writer for this trainer: atomic writes everywhere; on TPUs (XLA) a subclass of
    Lightning's ``XLACheckpointIO``, the only kind its XLA strategies accept (they refused nas-run's
    writer with a TypeError before anything ran: found by running trainer=xla through XLA's CPU
    device, benchmarks/xla_cpu.sh)."""
    if str(accelerator).lower() not in ("tpu", "xla"):
        return AtomicCheckpointIO()
    from lightning_fabric.plugins.io.xla import XLACheckpointIO

    class AtomicXLACheckpointIO(XLACheckpointIO):
        """XLA's writer with nas-run's atomic save: tensors to the CPU, written by the main process only."""

        def save_checkpoint(self, checkpoint, path, storage_options=None):
            import torch_xla.core.xla_model as xm
            import torch_xla.runtime as xr

            checkpoint = _xla_to_cpu(checkpoint)
            if xr.global_ordinal() == 0:
                AtomicCheckpointIO.save_checkpoint(self, checkpoint, path, storage_options)
            if xr.world_size() > 1:
                xm.rendezvous("nas-run checkpoint")

        def load_checkpoint(self, path, map_location=None, weights_only=None):
            return TorchCheckpointIO.load_checkpoint(self, path, map_location=map_location or
                                                     (lambda storage, loc: storage), weights_only=True)

    return AtomicXLACheckpointIO()


def _space_errno(err: BaseException, folder: Path, checkpoint) -> int | None:
    """ENOSPC / EDQUOT / EFBIG if ``err`` means the checkpoint did not fit, else None. torch.save
    hides the errno in a RuntimeError: then compare the checkpoint's size with the free space
    and the process's file-size limit."""
    code = getattr(err, "errno", None)
    if code is not None:
        return code if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else None
    import io
    import resource

    buf = io.BytesIO()
    torch.save(checkpoint, buf)
    size = buf.tell()
    if size >= shutil.disk_usage(folder).free:
        return errno.ENOSPC
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if soft != resource.RLIM_INFINITY and size > soft:
        return errno.EFBIG
    return None


def _xla_to_cpu(data):
    """TPU tensors cannot be pickled directly: bring them to the CPU first (others stay as they are)."""
    if "torch_xla" not in sys.modules:
        return data
    from lightning_utilities.core.apply_func import apply_to_collection

    return apply_to_collection(data, torch.Tensor, lambda t: t.cpu() if t.device.type == "xla" else t)


class PeriodicCheckpoint(pl.Callback):
    """``step<N>.ckpt`` every ``every`` optimizer steps, keeping the newest ``keep``
    (for checkpoint averaging). Saved through the trainer, so writes are atomic."""

    def __init__(self, dirpath: Path, every: int, keep: int):
        self.dirpath, self.every, self.keep = Path(dirpath), every, max(1, keep)
        self._last_saved = -1

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if step == 0 or step % self.every or step == self._last_saved:
            return
        self._last_saved = step
        trainer.save_checkpoint(self.dirpath / f"step{step}.ckpt", weights_only=False)
        if trainer.is_global_zero:
            # only the files this callback names (step<digits>.ckpt): a user's step_best.ckpt is not ours
            found = sorted((p for p in self.dirpath.glob("step*.ckpt") if p.stem[4:].isdigit()),
                           key=lambda p: int(p.stem[4:]))
            for old in found[: -self.keep]:
                old.unlink(missing_ok=True)


def unreadable_checkpoint(path: str) -> str | None:
    """None when ``path`` loads with the safe loader as a checkpoint with weights, else why not."""
    from nas_cli.infra.resume import unreadable_reason, load_safe

    try:
        if "state_dict" not in load_safe(Path(path)):
            return "no weights in it"
    except Exception as err:  # noqa: BLE001 - truncated, corrupt or holding objects the safe loader refuses
        return unreadable_reason(err)
    return None


def checkpoint_step(path: str | None) -> int | None:
    """The optimizer step a checkpoint was saved at; None without a path, -1 if unreadable."""
    if not path:
        return None
    try:
        return int(torch.load(path, map_location="cpu", weights_only=True, mmap=True).get("global_step", -1))
    except Exception:  # noqa: BLE001 - the test itself will say what is wrong with the file
        return -1


def tested_checkpoint(best: str | None, run_dir: Path, metric: str, value: float | None, final_step: int,
                      why: str | None = None) -> dict:
    """Which weights the test uses, said plainly (also the console line and summary.json)."""
    if not best:
        return {"checkpoint": None, "step": final_step, "metric": metric, "value": None,
                "line": f"{why or 'no validation ran'}: tested the final weights (step {final_step})"}
    step = checkpoint_step(best)
    shown = "?" if value is None else f"{value:.4g}"
    why_earlier = ("; no later validation was better, and of equal ones the earliest is kept"
                   if 0 <= step < final_step else "")
    return {"checkpoint": os.path.relpath(best, run_dir), "step": step, "metric": metric, "value": value,
            "line": f"tested checkpoint: step {step} of {final_step} (best {metric} = {shown}{why_earlier})"}
