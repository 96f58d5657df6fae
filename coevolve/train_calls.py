"""The loop's GRPO steps and what they record: one `trainer.train()` call per CoEvolve iteration, resumed from
the checkpoint the previous call saved (`train_steps`: the optimizer, scheduler and RNG carry over exactly as in
one uninterrupted call, and as after a kill: a resume is the same path); TRL's logged values with our rollout
summary (steps.jsonl); and where every second of a GRPO step goes (`StepClock`). Nothing here imports TRL: the
trainer is the one `coevolve.train` builds.

A step's seconds, as the trainer's callbacks see them (transformers' `TrainerCallback` events, in order):

    on_step_begin -> [rollout_func: our rollouts] -> loss forward/backward over the micro-batches
    -> on_pre_optimizer_step -> optimizer step -> on_optimizer_step -> on_step_end -> logging (on_log)
    -> checkpoint save (on_save, at the end of each iteration and every run.save_steps)

- `rollout`: the rollout function's own time (generation, env, scoring; `StepRollouts.seconds`);
- `loss`: the rest of the time from the step's start to the optimizer: TRL's log-probability forward passes,
  advantages, the loss's forward and backward, gradient clipping;
- `optimizer`: AdamW's step (with `grpo.master_weights`, the fp32 copies' update and write-back too);
- `logging`: from the step's end to its metrics line (TRL's metrics, our steps.jsonl line);
- `save`: the checkpoint written after the step, when one is;
- `resume`: from a `train()` call's start to its first step: loading the checkpoint the previous call saved
  (weights, optimizer, scheduler, RNG) and setting the loop up again.
Summed over an iteration's steps they are `IterationMetrics.train_seconds` in metrics.jsonl.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from coevolve.jsonl import JsonLines

TRAIN_PARTS = ("rollout", "loss", "optimizer", "logging", "save", "resume")
CHECKPOINTS = "checkpoints"
"""The run directory's folder of TRL checkpoints."""


def metrics_callback(metrics: JsonLines, pending: dict[int, dict[str, Any]]) -> Any:
    """A `TrainerCallback` writing one metrics line per logged step: TRL's logs (loss, reward, KL, clip ratios,
    learning rate) merged with our rollout summary of that step."""
    from transformers import TrainerCallback

    class _Metrics(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if not logs or "train_runtime" in logs:  # the final summary line of `train()` is not a step
                return
            record = {"step": state.global_step, **{k: v for k, v in logs.items() if isinstance(v, (int, float))}}
            for step in sorted(s for s in pending if s <= state.global_step):
                record.update({k: v for k, v in pending.pop(step).items() if k != "step"})
            if state.is_world_process_zero:  # one line per step; rollout/* are the main process's share of it
                metrics.append(record)

    return _Metrics()


class StepClock:
    """Seconds per part of each GRPO step (see the module docstring), summed until `take()`.

    `rollout_seconds()` says how long the step's rollout function ran (read at the step's end). `started()` is
    called when a `train()` call starts; its first step's start closes the `resume` part."""

    def __init__(self, rollout_seconds: Callable[[], float]) -> None:
        self.rollout_seconds = rollout_seconds
        self.totals = dict.fromkeys(TRAIN_PARTS, 0.0)
        self._call_started: float | None = None
        self._marks: dict[str, float] = {}

    def started(self) -> None:
        self._call_started = time.perf_counter()

    def take(self) -> dict[str, float]:
        """The sums since the last call, rounded for metrics.jsonl; then start again from zero."""
        totals, self.totals = self.totals, dict.fromkeys(TRAIN_PARTS, 0.0)
        return {part: round(seconds, 3) for part, seconds in totals.items()}

    def _add(self, part: str, since: str, now: float) -> None:
        if since in self._marks:
            self.totals[part] += now - self._marks.pop(since)

    def callback(self) -> Any:
        from transformers import TrainerCallback

        clock = self

        class _Clock(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                now = time.perf_counter()
                if clock._call_started is not None:
                    clock.totals["resume"] += now - clock._call_started
                    clock._call_started = None
                clock._marks = {"step": now}

            def on_pre_optimizer_step(self, args, state, control, **kwargs):
                clock._marks["optimizer"] = time.perf_counter()

            def on_optimizer_step(self, args, state, control, **kwargs):
                now = time.perf_counter()
                if "optimizer" in clock._marks and "step" in clock._marks:
                    before = clock._marks["optimizer"] - clock._marks["step"]
                    clock.totals["loss"] += max(0.0, before - clock.rollout_seconds())
                    clock.totals["rollout"] += clock.rollout_seconds()
                clock._add("optimizer", "optimizer", now)

            def on_step_end(self, args, state, control, **kwargs):
                now = time.perf_counter()
                clock._marks["logging"] = clock._marks["save"] = now  # a step without a log line saves from here

            def on_log(self, args, state, control, logs=None, **kwargs):
                now = time.perf_counter()
                clock._add("logging", "logging", now)
                clock._marks["save"] = now

            def on_save(self, args, state, control, **kwargs):
                clock._add("save", "save", time.perf_counter())

        return _Clock()


def train_steps(trainer: Any, directory: Path, until_step: int, clock: Any = None) -> int:
    """Run GRPO steps up to optimizer step `until_step` (saving a checkpoint there), resuming from the run's last
    checkpoint; returns the global step reached. Each call is a `trainer.train(resume_from_checkpoint=...)`: the
    weights, optimizer, scheduler, RNG and step counter come back from the checkpoint the previous call saved, so
    a run of T calls trains exactly as one call over all steps would (tested), and a run resumed after a kill
    takes the very same path; `clock` (`coevolve.train_calls.StepClock`) times the call's start as `resume`."""
    from transformers import TrainerCallback

    class _StopAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step >= until_step:
                control.should_save = True  # the next call (or a resume) starts here
                control.should_training_stop = True
            return control

    checkpoint = last_checkpoint(directory)
    stop = _StopAt()
    trainer.add_callback(stop)
    if clock is not None:
        clock.started()
    try:
        trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    except BaseException:
        trainer.coevolve_weights_at = None  # the weights in memory may be half a step past any checkpoint
        raise
    finally:
        trainer.remove_callback(stop)
    # The call saved a checkpoint at its last step (`_StopAt`) from these very weights: the next call may skip
    # reading them back (`_load_from_checkpoint`).
    trainer.coevolve_weights_at = trainer.state.global_step
    return trainer.state.global_step


def load_weights(trainer: Any, checkpoint: Path) -> None:
    """The checkpoint's weights into the trainer's model (to evaluate them without training a step)."""
    trainer._load_from_checkpoint(str(checkpoint))


def checkpoint_step(path: Path) -> int:
    return int(path.name.rsplit("-", 1)[-1])


def last_checkpoint(output_dir: Path) -> Path | None:
    """The newest complete checkpoint (TRL writes `trainer_state.json` last)."""
    folder = output_dir / CHECKPOINTS
    done = [p for p in folder.glob("checkpoint-*") if (p / "trainer_state.json").exists()] if folder.exists() else []
    return max(done, key=checkpoint_step, default=None)
