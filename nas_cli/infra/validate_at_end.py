"""When a run validates: also at the very end of training.

Lightning validates every ``trainer.val_check_interval`` batches or at epoch ends. A run whose
``trainer.max_steps`` (or ``trainer.max_time``, or last epoch under ``check_val_every_n_epoch``)
ends between two validations would otherwise never validate its last steps, and the test would
silently use an older best checkpoint. :class:`ValidateAtEnd` adds one validation at the final
training batch, so the best checkpoint is chosen among all the steps trained.

Lightning has no public switch for this; the callback wraps the training epoch loop's
``_should_check_val_fx`` (Lightning 2.x) on the trainer it is attached to, and says so once if a
future Lightning no longer has it.
"""
from __future__ import annotations

import pytorch_lightning as pl
from pytorch_lightning.utilities import rank_zero_warn


class ValidateAtEnd(pl.Callback):
    def on_train_start(self, trainer, pl_module) -> None:
        loop = trainer.fit_loop.epoch_loop
        decide = getattr(loop, "_should_check_val_fx", None)
        if decide is None or getattr(decide, "_nas_final", False):
            if decide is None:
                rank_zero_warn("this Lightning version cannot be told to validate at the end of training; "
                               "the last steps after the final scheduled validation are not validated")
            return

        def should_check_val(data_fetcher) -> bool:
            return bool(decide(data_fetcher)) or (trainer.enable_validation and _last_batch(trainer))

        should_check_val._nas_final = True
        loop._should_check_val_fx = should_check_val


def _last_batch(trainer: pl.Trainer) -> bool:
    """Called after the optimizer step of a batch: is this the last batch training will run?"""
    loop = trainer.fit_loop
    if trainer.max_steps is not None and trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
        return True
    if trainer.should_stop:  # trainer.max_time reached (Timer), or another callback asked to stop
        return True
    max_epochs = loop.max_epochs
    return (max_epochs is not None and max_epochs > 0 and loop.epoch_loop.batch_progress.is_last_batch
            and trainer.current_epoch + 1 >= max_epochs)
