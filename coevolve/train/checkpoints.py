"""Checkpoints written off the critical path (`run.async_save: true`): a snapshot in memory, written by a thread.

transformers' `Trainer._save_checkpoint` writes step s's weights, optimizer state, scheduler, RNG and trainer state
while training waits: 3.5 s an iteration on the quickstart (BENCHMARKS.md "Where a GRPO step's seconds go"), about
4% of a run on two cores. Under `run.async_save` the trainer (`coevolve.train.grpo`'s subclass) hands the save to
`CheckpointWriter.save` instead, which

1. in the calling thread, copies what the next step mutates: every tensor of the model's state dict and of the
   optimizer's (AdamW's moments, the master weights under `grpo.master_weights`), and writes the small files at
   once, after a marker file `coevolve-writing` that says the folder is not a checkpoint yet: the RNG state
   (transformers' own `_save_rng_state`: it must be the RNG of step s), the scheduler, the tokenizer, the training
   arguments, TRL's model card and the trainer state (flos stored, the stateful callbacks exported, as
   transformers does);
2. in one background thread, writes the copies in transformers' layout and order: the weights
   (`save_pretrained` over the copied state dict), `optimizer.pt`; then removes the marker (the checkpoint is
   complete: `coevolve.train.calls.last_checkpoint` skips a folder that still has it) and rotates old checkpoints
   as `run.save_total_limit` says.

At most one save is in flight: the next save waits for it (`settle`). The next `train()` call does not: it resumes
from the checkpoint in flight (`resume_point`), as it would from the finished one, when the model in memory holds
that checkpoint's weights (the previous call trained them): the trainer state, scheduler and RNG come from the
small files already written, the optimizer state from the copy in memory (`load_in_flight`; `optimizer.pt` would
be read back to the CPU and loaded the same way), and the weights are the model's own (`_load_from_checkpoint`
skips them). So the write of iteration t's checkpoint overlaps iteration t+1's GRPO steps, and the values trained
are those of a synchronous save (tested). The iteration's metrics line (the commit, `coevolve.loop`) does not wait
either: a kill before the write ends leaves a committed iteration whose checkpoint is incomplete, and resume
redoes it (`coevolve.run_setup.resume_plan` drops metrics lines past the last complete checkpoint; the redo is the
path a kill in an iteration's feedback takes). The run's end waits (`coevolve.loop.save_final`). A kill during
the write leaves the marker, so resume skips that folder; a write that fails raises at the next wait, in the
training thread, with the step named. The copies cost one model and one optimizer state of host memory while a
write runs (on a GPU the copy is made to host memory, so device memory holds no second copy).

Where it does not apply the save stays transformers' own: several processes (DeepSpeed, FSDP and DDP save
collectively), a best-model metric, hyperparameter search. Copying the state dict of a LoRA model copies its base
weights too.
"""

from __future__ import annotations

import copy
import threading
import warnings
from pathlib import Path
from typing import Any

WRITING = "coevolve-writing"
"""A checkpoint folder holding this file is still being written (or its write was killed): not a checkpoint."""


def clone_tensors(value: Any, memo: dict[tuple, Any] | None = None) -> Any:
    """A copy of a (nested) state dict whose tensors no later in-place update can reach. Tensors that share
    storage (tied embeddings) stay shared in the copy, so `save_pretrained` sees the same ties."""
    import torch

    memo = {} if memo is None else memo
    if isinstance(value, torch.Tensor):
        key = (value.untyped_storage().data_ptr(), value.storage_offset(), tuple(value.shape), tuple(value.stride()),
               value.dtype)
        if key not in memo:
            memo[key] = value.detach().to("cpu", copy=True)  # host memory: a GPU holds no second copy
        return memo[key]
    if isinstance(value, dict):
        return type(value)((k, clone_tensors(v, memo)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(clone_tensors(v, memo) for v in value)
    return copy.deepcopy(value)


def applies(trainer: Any) -> bool:
    """Whether a save of this trainer can be snapshotted here (see the module docstring), else transformers saves."""
    args = trainer.args
    return (trainer.accelerator.num_processes == 1 and not trainer.is_deepspeed_enabled
            and not trainer.is_fsdp_enabled and args.metric_for_best_model is None
            and trainer.hp_search_backend is None and args.should_save and not args.push_to_hub)


def writer_for(trainer: Any) -> "CheckpointWriter | None":
    """The background writer for `run.async_save`, or None (said once) where the save must stay transformers'."""
    if applies(trainer):
        return CheckpointWriter()
    warnings.warn("run.async_save: this trainer saves collectively or keeps a best model (several processes, "
                  "DeepSpeed, FSDP, metric_for_best_model), so its checkpoints are written as transformers writes "
                  "them", RuntimeWarning, stacklevel=2)
    return None


class CheckpointWriter:
    """One background writer of a trainer's checkpoints (see the module docstring)."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._failure: tuple[int, BaseException] | None = None
        self.writing_step: int | None = None
        """The step whose checkpoint is being written, None when nothing is in flight."""
        self.folder: Path | None = None
        self.optimizer_state: dict | None = None
        """The in-flight checkpoint's folder and the copy of its optimizer state (None: `run.save_only_model`)."""

    def save(self, trainer: Any) -> Path:
        """Step `trainer.state.global_step`'s checkpoint: copied now, written in the background."""
        import torch
        from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME, TRAINER_STATE_NAME, TRAINING_ARGS_NAME
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
        from transformers.trainer_callback import ExportableState

        self.settle()
        step = trainer.state.global_step
        folder = Path(trainer.args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{step}"
        if hasattr(trainer, "create_model_card"):  # what TRL's _save_checkpoint does first
            hub_id = getattr(trainer.args, "hub_model_id", None)
            name = hub_id.split("/")[-1] if hub_id else Path(trainer.args.output_dir).name
            trainer.create_model_card(model_name=name)
        trainer.store_flos()
        folder.mkdir(parents=True, exist_ok=True)
        (folder / WRITING).write_text(f"step {step}: written in the background; not complete while this file exists\n")
        weights = clone_tensors(trainer.model.state_dict())
        optimizer = None
        if not trainer.args.save_only_model:
            optimizer = clone_tensors(trainer.optimizer.state_dict())
            with warnings.catch_warnings():  # the scheduler's "please also save the optimizer" warning
                warnings.simplefilter("ignore", UserWarning)
                torch.save(trainer.lr_scheduler.state_dict(), folder / SCHEDULER_NAME)
            trainer._save_rng_state(str(folder))
        for callback in [*trainer.callback_handler.callbacks, trainer.control]:  # as transformers exports them
            if isinstance(callback, ExportableState):
                name, exported = type(callback).__name__, callback.state()
                if isinstance(trainer.state.stateful_callbacks.get(name), list):
                    trainer.state.stateful_callbacks[name].append(exported)
                else:
                    trainer.state.stateful_callbacks[name] = exported
        trainer.state.save_to_json(str(folder / TRAINER_STATE_NAME))  # what a resume from the copy reads
        if trainer.processing_class is not None:
            trainer.processing_class.save_pretrained(str(folder))
        torch.save(trainer.args, folder / TRAINING_ARGS_NAME)
        if getattr(trainer, "use_adaptive_entropy", False):  # TRL's GRPO entropy controller, as its save writes it
            import json

            (folder / "entropy_ctrl_state.json").write_text(json.dumps(
                {"entropy_coef": trainer.entropy_coef, "last_world_entropy": trainer._last_world_entropy}))
        model, limit = trainer.model, trainer.args.save_total_limit
        self.writing_step, self.folder, self.optimizer_state = step, folder, optimizer

        def write() -> None:
            from transformers.trainer_utils import rotate_checkpoints

            try:
                model.save_pretrained(str(folder), state_dict=weights, is_main_process=True)
                if optimizer is not None:
                    torch.save(optimizer, folder / OPTIMIZER_NAME)
                (folder / WRITING).unlink()  # last: the checkpoint is complete
                rotate_checkpoints(output_dir=str(folder.parent), save_total_limit=limit, use_mtime=True)
            except BaseException as error:  # raised in the training thread at the next wait
                self._failure = (step, error)

        # Not a daemon: a run that ends or fails while a write is in flight still finishes the checkpoint.
        self._thread = threading.Thread(target=write, name=f"coevolve-checkpoint-{step}")
        self._thread.start()
        return folder

    def settle(self) -> None:
        """Wait for the write in flight, if any; raise if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.writing_step, self.folder, self.optimizer_state = None, None, None
        if self._failure is not None:
            step, error = self._failure
            self._failure = None
            from coevolve.train.grpo import TrainingError

            raise TrainingError(f"run.async_save: writing the checkpoint of step {step} failed ({error!r}); the "
                               "previous complete checkpoint is what a resume starts from") from error


def settle_checkpoint(trainer: Any) -> None:
    """Wait until the trainer's last checkpoint is on disk (a no-op without `run.async_save`)."""
    writer = getattr(trainer, "coevolve_writer", None)
    if writer is not None:
        writer.settle()


def resume_point(trainer: Any) -> Path | None:
    """The checkpoint in flight when the next `train()` call can resume from it without waiting (the model holds
    its weights: `coevolve_weights_at`, set by `coevolve.train.calls.train_steps`); else waits for the write in
    flight, if any, and returns None (resume from `last_checkpoint`)."""
    writer = getattr(trainer, "coevolve_writer", None)
    if writer is None or writer.writing_step is None:
        return None
    if writer.writing_step == getattr(trainer, "coevolve_weights_at", None):
        return writer.folder
    writer.settle()
    return None


def load_in_flight(trainer: Any, checkpoint: str | None) -> bool:
    """transformers' `_load_optimizer_and_scheduler` for the checkpoint in flight: the optimizer state from the copy
    in memory (a fresh copy, so the write still reads the one it was given), the scheduler from its file. False
    when `checkpoint` is not the one in flight (transformers loads it from disk)."""
    import torch
    from transformers.trainer import SCHEDULER_NAME

    writer = getattr(trainer, "coevolve_writer", None)
    if writer is None or checkpoint is None or writer.folder is None or Path(checkpoint) != writer.folder \
            or writer.optimizer_state is None:
        return False
    trainer.optimizer.load_state_dict(clone_tensors(writer.optimizer_state))
    with warnings.catch_warnings():  # the scheduler's "please also save the optimizer" warning, as transformers'
        warnings.simplefilter("ignore", UserWarning)
        trainer.lr_scheduler.load_state_dict(torch.load(Path(checkpoint) / SCHEDULER_NAME, weights_only=True))
    return True
