"""The loop's GRPO steps and what they record: one `trainer.train()` call per CoEvolve iteration, resumed from
the checkpoint the previous call saved (`train_steps`: the optimizer, scheduler and RNG carry over exactly as in
one uninterrupted call, and as after a kill: a resume is the same path); TRL's logged values with our rollout
summary (steps.jsonl); where every second of a GRPO step goes (`StepClock`); the trainer's other callbacks (the
config saved into each checkpoint, one progress bar over the run) and `attach_trainer`, which builds the trainer
(`coevolve.train.grpo`) for a run. Checkpoint I/O is here too (`last_checkpoint`, `load_weights`).

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
from typing import TYPE_CHECKING, Any, Callable

from coevolve.jsonl import JsonLines
from coevolve.train.checkpoints import WRITING, resume_point, settle_checkpoint

if TYPE_CHECKING:
    from coevolve.config import Config
    from coevolve.loop import Run

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
    takes the very same path; `clock` (`coevolve.train.calls.StepClock`) times the call's start as `resume`."""
    from transformers import TrainerCallback

    class _StopAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step >= until_step:
                control.should_save = True  # the next call (or a resume) starts here
                control.should_training_stop = True
            return control

    # Under run.async_save the previous call's last checkpoint may still be in flight: resumed from as it is (its
    # optimizer state from memory) when the model holds its weights, else waited for.
    checkpoint = resume_point(trainer) or last_checkpoint(directory)
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
    """The newest complete checkpoint: transformers writes `trainer_state.json` last; `run.async_save` removes its
    marker last (`coevolve.train.checkpoints`)."""
    folder = output_dir / CHECKPOINTS
    done = [p for p in folder.glob("checkpoint-*")
            if (p / "trainer_state.json").exists() and not (p / WRITING).exists()] if folder.exists() else []
    return max(done, key=checkpoint_step, default=None)


# The trainer of a run, and its console


def quiet_console(trainer: Any, total_steps: int, show: bool) -> None:
    """Replace the trainer's console output (a bar per train() call, and every step's metrics dict printed) with
    one bar over the run's steps; the metrics are in steps.jsonl."""
    from transformers import PrinterCallback, ProgressCallback, TrainerCallback
    from tqdm.auto import tqdm

    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)

    class _Steps(TrainerCallback):
        bar = None

        def on_train_begin(self, args, state, control, **kwargs):
            if show and self.bar is None:
                self.bar = tqdm(total=total_steps, desc="GRPO steps", unit="step", dynamic_ncols=True)
            if self.bar is not None:
                self.bar.n = state.global_step
                self.bar.refresh()

        def on_step_end(self, args, state, control, **kwargs):
            if self.bar is not None:
                self.bar.update(state.global_step - self.bar.n)
                if state.global_step >= total_steps:
                    self.bar.close()

    trainer.add_callback(_Steps())




def attach_trainer(run: "Run", tokenizer: Any) -> None:
    """TRL's GRPO trainer over the run's model, with our rollouts (`coevolve.train.grpo.EnvRollouts`) as its
    rollout function, its step clock and its metrics and config callbacks: the one place `Run.trainer`,
    `Run.rollouts` and `Run.clock` are set."""
    from coevolve.policy.models import resolve_model
    from coevolve.train.grpo import EnvRollouts, build_trainer as trl_trainer, slot_dataset
    from coevolve.train.trackers import prepare_trackers
    from coevolve.rollout import trajectory_summary

    config, pending = run.config, {}

    def on_step(record) -> None:
        pending[record.step] = record.summary()
        run.rollouts_log.extend([{"step": record.step, **trajectory_summary(t)} for t in record.trajectories])

    run.rollouts = EnvRollouts(run.env, run.pool.tasks_at(0), run.renderer, config.rollout.engine(),
                               seed=config.run.seed, mask_truncated=config.grpo.mask_truncated, backend=run.backend,
                               on_step=on_step, reward=config.grpo.reward, partial_credit=config.grpo.partial_credit,
                               max_consecutive_failures=config.rollout.max_consecutive_failures,
                               guidance=config.grpo.guidance)
    run.clock = StepClock(lambda: run.rollouts.last.seconds if run.rollouts.last is not None else 0.0)
    run.trainer = trl_trainer(config, run.directory, resolve_model(config.model.name), tokenizer, run.rollouts, [],
                              callbacks=[metrics_callback(run.steps_log, pending), config_callback(config),
                                         run.clock.callback()],
                              dataset=slot_dataset(run.slots))
    quiet_console(run.trainer, config.run.max_steps, run.is_main)
    prepare_trackers(run.trainer, run.directory)  # TensorBoard in DIR/tensorboard: one place, continued on resume


def config_callback(config: Config) -> Any:
    """A `TrainerCallback` that saves the run's config into every checkpoint (what `--resume` compares against)."""
    from transformers import TrainerCallback

    from coevolve.config import write_config
    from coevolve.run_setup import CHECKPOINT_CONFIG

    class _SaveConfig(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
                write_config(config, folder / CHECKPOINT_CONFIG)
            return control

    return _SaveConfig()
