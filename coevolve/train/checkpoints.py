"""Checkpoints written off the critical path (`run.async_save: true`): a snapshot in memory, written by a thread.

transformers' `Trainer._save_checkpoint` writes step s's weights, optimizer state, scheduler, RNG and trainer state
while training waits: 3.5 s an iteration on the quickstart (BENCHMARKS.md "Where a GRPO step's seconds go"), about
4% of a run on two cores. Under `run.async_save` the trainer (`coevolve.train.grpo`'s subclass) hands the save to
`CheckpointWriter.save` instead, which

1. in the calling thread, copies what the next step mutates: every tensor of the model's state dict and of the
   optimizer's (AdamW's moments, the master weights under `grpo.master_weights`), the trainer state (flos stored,
   the stateful callbacks exported, as transformers does), and writes the small files at once: the RNG state
   (transformers' own `_save_rng_state`: it must be the RNG of step s), the scheduler, the tokenizer, the training
   arguments, and TRL's model card;
2. in one background thread, writes the copies in transformers' layout and order: the weights
   (`save_pretrained` over the copied state dict), `optimizer.pt`, then `trainer_state.json`, the file that marks a
   checkpoint complete (`coevolve.train.calls.last_checkpoint`), then rotates old checkpoints as
   `run.save_total_limit` says.

At most one save is in flight. What reads a checkpoint or commits to one waits for it (`settle`): the next save,
the next `train()` call (it resumes from that checkpoint, `coevolve.train.calls.train_steps`) and the iteration's
metrics line (`coevolve.loop.record_iteration`, the commit point), so a committed iteration always has its
checkpoint on disk. A kill during the write leaves a folder without trainer_state.json, which resume skips, as
after a kill during a synchronous save. A write that fails raises at the next wait, in the training thread, with the
step named. The files hold the same values as a synchronous save (tested); the copies cost one model and one
optimizer state of host memory while a write runs (on a GPU the copy is made to host memory, so device memory holds no
second copy; transformers reads optimizer.pt to the CPU first either way).

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
        state = copy.deepcopy(trainer.state)
        if trainer.processing_class is not None:
            trainer.processing_class.save_pretrained(str(folder))
        torch.save(trainer.args, folder / TRAINING_ARGS_NAME)
        if getattr(trainer, "use_adaptive_entropy", False):  # TRL's GRPO entropy controller, as its save writes it
            import json

            (folder / "entropy_ctrl_state.json").write_text(json.dumps(
                {"entropy_coef": trainer.entropy_coef, "last_world_entropy": trainer._last_world_entropy}))
        model, limit = trainer.model, trainer.args.save_total_limit
        self.writing_step = step

        def write() -> None:
            from transformers.trainer_utils import rotate_checkpoints

            try:
                model.save_pretrained(str(folder), state_dict=weights, is_main_process=True)
                if optimizer is not None:
                    torch.save(optimizer, folder / OPTIMIZER_NAME)
                state.save_to_json(str(folder / TRAINER_STATE_NAME))  # last: the checkpoint is complete
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
        self.writing_step = None
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
