"""The CoEvolve loop, as named phases: train on D_t -> signals -> explore -> abstract -> validate -> D_{t+1}.

    coevolve train --config configs/quickstart.yaml [--output-dir DIR] [--resume] [section.key=value ...]

Phases of a run, top to bottom: the run directory (1), the env and D_0 (2), the policy's prompt (3), D_0 in the
pool (4), and then, from the GRPO trainer (TRL, `coevolve.train`), iteration after iteration:

    t = 1..T:  sample D_{t-1} into the trainer's slots -> `loop.steps_per_iteration` GRPO steps (10)
               -> signals from exactly the rollouts those steps trained on, success rates into the history (6)
               -> contexts (7): signal-guided (coevolve), random with the same count (random), none (static)
               -> explore, abstract, validate; the admitted tasks join D_t (8; coevolve.feedback)
               -> held-out evaluation every `loop.eval_every` iterations and after the last (5)
               -> one line of metrics.jsonl (9): the iteration's commit point

One iteration is one epoch of the trainer over `prompts_per_step x steps_per_iteration` slots; the slots stand
for a seeded sample of D_{t-1} (`EnvRollouts.assign_slots`), so the trainer and its checkpoints never change
while the data evolves. Modes (run.mode): zero-shot (iteration 0's evaluation only), static (GRPO on D_0;
signals are still counted), synthetic (one feedback pass over random contexts of D_0 before training, then
static), random, coevolve. `loop.signals` switches signals off; `feedback.check_execution: false` switches
validation off.

The run directory:
    config.yaml          the resolved config
    metrics.jsonl        one line per iteration (0 = before training): train and held-out success, signal counts,
                         candidates / accepted / rejected by code / skipped, pool size by source, phase seconds,
                         the feedback share of wall time
    steps.jsonl          one line per optimizer step: TRL's loss/reward/KL/clip ratios + our rollout summary
    rollouts.jsonl       one line per trajectory trained on (iteration, step, calls, score, reasons; no token ids)
    feedback.jsonl       one line per candidate: signal -> flagged trajectories -> episode -> candidate -> verdict
    pool.sqlite          D_t for every t, with provenance and each task's success history
    checkpoints/         TRL checkpoints every run.save_steps and at every iteration's end
    final/               the trained model (or LoRA adapter) and tokenizer; summary.json
    report.html          plots and the lineage table (`coevolve report DIR` rewrites it)
Resume (`--resume`) after a kill: training continues from the last checkpoint (steps after it run again, with the
same seeds); an iteration whose steps were all checkpointed but whose metrics line is missing (a kill in its
feedback phase) has its phases redone first, deterministically: the pool refuses what it already holds, the
feedback log replaces that iteration's lines, so nothing is lost or admitted twice.
"""

from __future__ import annotations

import inspect
import json
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from accelerate import PartialState

from coevolve.config import Config, ConfigError, load_config, write_config
from coevolve.envs import ENVS, make_env
from coevolve.envs.base import Env
from coevolve.explore import random_contexts
from coevolve.feedback import FeedbackResult, build_feedback, feedback_phase, signal_contexts, validation_config
from coevolve.pool import SamplingConfig as PoolSampling, TaskPool, pool_path
from coevolve.records import SIGNAL_KINDS, ExplorationContext, Task, Trajectory
from coevolve.report import write_report
from coevolve.signals import RolloutColumns, SignalConfig, SignalReport, mine_signals
from coevolve.train import JsonLines
from coevolve.validate import Validator

METRICS, STEPS, FEEDBACK_LOG = "metrics.jsonl", "steps.jsonl", "feedback.jsonl"


@dataclass(frozen=True)
class RunResult:
    output_dir: Path
    start_step: int
    final_step: int
    seconds: float
    first_success: float | None
    last_success: float | None


# ---------------------------------------------------------------------------------------------------------------
# Phase 1: the run directory
# ---------------------------------------------------------------------------------------------------------------


def prepare_run(config_path: str | None, overrides: Sequence[str], output_dir: str | None,
                resume: bool) -> tuple[Config, Path]:
    """Resolve the config and the run directory. With `--resume` the directory's own config.yaml is the base
    (command-line overrides still apply, e.g. a larger run.max_steps to extend a finished run)."""
    if resume:
        directory = Path(output_dir) if output_dir else None
        if directory is None:
            base = load_config(config_path, overrides)
            directory = Path(base.run.output_dir)
        saved = directory / "config.yaml"
        if not saved.exists():
            raise ConfigError(f"--resume: {directory} has no config.yaml; start the run without --resume")
        config = load_config(saved, overrides)
    else:
        config = load_config(config_path, overrides)
        directory = Path(output_dir or config.run.output_dir)
        if (directory / "checkpoints").exists() or (directory / "metrics.jsonl").exists():
            raise ConfigError(f"{directory} already holds a run; continue it with --resume, or pick another "
                              "--output-dir")
    directory.mkdir(parents=True, exist_ok=True)
    if _is_main_process():
        write_config(config, directory / "config.yaml")
    return config, directory


def _is_main_process() -> bool:
    from accelerate import PartialState  # the same answer TRL and the trainer use

    return PartialState().is_main_process


# ---------------------------------------------------------------------------------------------------------------
# Phase 2: D_0
# ---------------------------------------------------------------------------------------------------------------


def _takes_split(name: str) -> bool:
    """Whether env `name` has splits (bfcl-lite, appworld); BFCL's are categories."""
    try:
        return "split" in inspect.signature(ENVS.get(name)).parameters
    except KeyError:
        return False


def build_env(config: Config) -> Env:
    options: dict[str, Any] = dict(config.env.options)
    if config.env.split is not None and _takes_split(config.env.name):
        options["split"] = config.env.split
    if config.env.category is not None:
        options["category"] = config.env.category
    try:
        return make_env(config.env.name, **options)
    except (KeyError, ValueError, TypeError) as error:
        raise ConfigError(f"env: {error}") from None


def load_tasks(config: Config, env: Env) -> list[Task]:
    if config.env.tasks_file:
        path = Path(config.env.tasks_file)
        try:
            lines = [line for line in path.read_text().splitlines() if line.strip()]
            tasks = [Task.from_json(line) for line in lines]
        except OSError as error:
            raise ConfigError(f"env.tasks_file: cannot read {path}: {error.strerror}") from None
        except (ValueError, KeyError, TypeError) as error:
            raise ConfigError(f"env.tasks_file: {path} holds a line that is not a task: {error}") from None
    else:
        tasks = env.tasks()
    tasks = tasks[: config.env.limit] if config.env.limit else tasks
    if not tasks:
        raise ConfigError("env: no tasks to train on")
    return tasks


# ---------------------------------------------------------------------------------------------------------------
# Phase 3: the policy's prompt (tokenizer, chat template, worked examples)
# ---------------------------------------------------------------------------------------------------------------


def build_renderer(config: Config, env: Env, tasks: Sequence[Task]) -> tuple[Any, Any, list[Task]]:
    """(tokenizer, renderer, training tasks). Worked examples come from the training tasks and leave the set:
    a task whose solution is in the prompt teaches nothing."""
    from coevolve.policy.chat import ChatRenderer, build_demonstrations
    from coevolve.policy.models import load_tokenizer

    tokenizer = load_tokenizer(config.model.name)
    if config.model.chat_template:
        tokenizer.chat_template = Path(config.model.chat_template).read_text()
    demos = build_demonstrations(env, tasks, config.model.reply_format, config.model.demos, config.model.demo_choice)
    shown = {messages[0]["content"] for messages in demos}
    remaining = [task for task in tasks if task.turns[0][0]["content"] not in shown]
    if not remaining:
        raise ConfigError("model.demos: every task went into the worked examples; lower model.demos")
    renderer = ChatRenderer(tokenizer, config.model.reply_format, demonstrations=demos,
                            tool_style=config.model.tool_style)
    return tokenizer, renderer, remaining


# ---------------------------------------------------------------------------------------------------------------
# Phase 4: D_0 in the pool
# ---------------------------------------------------------------------------------------------------------------


def open_pool(directory: Path, tasks: Sequence[Task]) -> TaskPool:
    """The run's task pool; a new run puts the training tasks in as D_0 (a resumed one finds them there)."""
    pool = TaskPool(pool_path(directory))
    if pool.latest_iteration() is None:
        pool.add_tasks(tasks, iteration=0)
    return pool


# ---------------------------------------------------------------------------------------------------------------
# Phase 5: evaluation on the held-out split (never trained on)
# ---------------------------------------------------------------------------------------------------------------


def build_eval(config: Config, env: Env) -> tuple[Env, list[Task]]:
    """The fixed held-out set: the eval env (the training env unless `loop.eval_env`), its split, the first N."""
    section = config.loop
    name = section.eval_env or config.env.name
    options: dict[str, Any] = dict(config.env.options) if name == config.env.name else {}
    if section.eval_split is not None and _takes_split(name):
        options["split"] = section.eval_split
    category = section.eval_category or (config.env.category if name == config.env.name else None)
    if category is not None:
        options["category"] = category
    try:
        eval_env = make_env(name, **options)
    except (KeyError, ValueError, TypeError) as error:
        raise ConfigError(f"loop.eval_env: {error}") from None
    tasks = eval_env.tasks()
    return eval_env, tasks[: section.eval_limit] if section.eval_limit else tasks


def eval_phase(config: Config, eval_env: Env, eval_tasks: Sequence[Task], backend: Any, renderer: Any) -> float:
    """Greedy held-out success rate (the env's binary score), one episode per task."""
    from coevolve.evaluate import evaluate_model
    from coevolve.policy.backends import SamplingConfig
    from coevolve.train import rollout_config

    from tqdm.auto import tqdm

    greedy = replace(rollout_config(config), group_size=1, sampling=SamplingConfig(temperature=0.0, seed=0))
    with tqdm(total=len(eval_tasks), desc="held-out eval", unit="task", leave=False) as bar:
        def progress(finished: int, total: int) -> None:
            bar.update(finished - bar.n)

        report, _ = evaluate_model(eval_env, list(eval_tasks), backend, renderer, greedy, "model", progress=progress)
    return report.accuracy


# ---------------------------------------------------------------------------------------------------------------
# Phases 6-9: after each iteration's GRPO steps, on the trajectories the trainer learned from
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IterationMetrics:
    """One line of metrics.jsonl: what iteration t did (iteration 0: the policy before training)."""

    iteration: int
    steps: tuple[int, int] | None
    """First and last optimizer step of the iteration (None for iteration 0)."""
    train_success: float | None
    """Success rate of the iteration's training rollouts."""
    heldout_success: float | None
    """Greedy success on the held-out set (None when not evaluated this iteration)."""
    signals: Mapping[str, int]
    feedback: Mapping[str, Any]
    """`FeedbackResult.summary()`: contexts, candidates, accepted, rejected by code, skipped, seconds per stage."""
    pool: Mapping[str, int]
    """D_t's size by source after the iteration."""
    seconds: Mapping[str, float]
    """Wall seconds per phase: train, signals, feedback, eval."""
    feedback_share: float
    """feedback / (train + signals + feedback + eval) seconds."""

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(self)))


class _Loop:
    """What the phases share during a run (the env, the pool, the trainer's rollout function, the logs)."""

    def __init__(self, config: Config, directory: Path, env: Env, renderer: Any, pool: TaskPool,
                 eval_env: Env, eval_tasks: Sequence[Task], say: Callable[[str], None]) -> None:
        self.config, self.directory, self.env, self.renderer, self.pool = config, directory, env, renderer, pool
        self.eval_env, self.eval_tasks, self.say = eval_env, list(eval_tasks), say
        self.metrics = JsonLines(directory / METRICS)
        self.feedback_log = JsonLines(directory / FEEDBACK_LOG)
        self.steps_per_iteration = config.loop.steps_per_iteration
        self.slots = config.grpo.prompts_per_step * self.steps_per_iteration // config.grpo.num_iterations
        self.iterations = math.ceil(config.run.max_steps / self.steps_per_iteration)
        self.explorer, self.abstractor, _ = build_feedback(config.feedback, env)
        self.iteration_started = time.perf_counter()
        process = PartialState()
        # Under `accelerate launch` (static mode only) every process trains on the same slots; the main process
        # runs the iteration's phases and writes the shared files. Evaluation needs every process's shard of the
        # model at once, so multi-process runs leave it to `coevolve eval` on the saved model.
        self.main, self.evaluate = process.is_main_process, process.num_processes == 1
        suffix = f".p{process.process_index}" if process.process_index else ""
        self.rollouts_log = JsonLines(directory / f"rollouts{suffix}.jsonl")

    def recorded(self) -> set[int]:
        return {record["iteration"] for record in self.metrics.read()}

    def sample(self, iteration: int) -> list[Task]:
        """The tasks of iteration t's slots: a seeded sample of D_{t-1} (the same on every resume)."""
        mix = PoolSampling(synthetic_fraction=self.config.loop.synthetic_fraction)
        drawn = self.pool.sample(iteration - 1, self.slots, rng_seed=self.config.run.seed * 7_919 + iteration,
                                 config=mix)
        return drawn or self.pool.tasks_at(iteration - 1)

    def trajectories(self, iteration: int) -> list[Trajectory]:
        # Always from the log, never from memory: a normal iteration end and the redo after a kill then read the
        # very same records (the log has no token ids, which the signals and the explorer do not use).
        return [Trajectory.from_dict({k: v for k, v in row.items() if k != "step"})
                for row in self.rollouts_log.read() if row.get("iteration") == iteration]


def signals_phase(loop: _Loop, iteration: int, trajectories: Sequence[Trajectory]) -> SignalReport:
    """The iteration's signals from the rollouts the trainer used; the success rates join the pool's history."""
    section = loop.config.loop
    config = SignalConfig(window=section.window, theta_percent=section.theta_percent, enabled=section.signals)
    history = loop.pool.histories(before=iteration, window=section.window)
    report = mine_signals(RolloutColumns.from_trajectories(trajectories), history, config, iteration)
    loop.pool.record_success_rates(iteration, report.success_rates)
    return report


def contexts_phase(loop: _Loop, iteration: int, report: SignalReport, trajectories: Sequence[Trajectory]
                   ) -> list[ExplorationContext]:
    """What to explore after iteration t: signal contexts (coevolve), as many random ones (random), or none."""
    mode, cap = loop.config.run.mode, loop.config.feedback.max_contexts
    tasks = {task.id: task for task in loop.pool.tasks_at(iteration - 1)}
    if mode == "coevolve":
        return signal_contexts(report.events, tasks, {t.id: t for t in trajectories}, cap)
    if mode == "random":  # the same budget as the signals would have spent, without their steering
        return random_contexts(list(tasks.values()), min(len(report.events), cap), iteration, loop.config.run.seed)
    return []


def synthesis_phase(loop: _Loop, iteration: int, contexts: Sequence[ExplorationContext]) -> FeedbackResult:
    """Explore, abstract, validate; the admitted tasks join D_iteration (once: the pool refuses duplicates)."""
    base = loop.pool.tasks_at(max(iteration - 1, 0))
    tasks = {task.id: task for task in base}
    validator = Validator(loop.env, validation_config(loop.config.feedback), known=base)
    result = feedback_phase(loop.env, contexts, tasks, loop.explorer, loop.abstractor, validator, iteration,
                            seed=loop.config.run.seed, time_budget_seconds=loop.config.feedback.time_budget_seconds)
    loop.feedback_log.rewrite(lambda row: row.get("iteration") != iteration)  # a redone iteration replaces its rows
    loop.feedback_log.extend(result.lineage())
    loop.pool.add_tasks(result.admitted, iteration)  # a redo after a kill finds them there: refused, not doubled
    return result


def pool_sizes(pool: TaskPool, iteration: int) -> dict[str, int]:
    sizes = {source: len(pool.entries_at(iteration, source=source)) for source in ("seed", "synthetic")}
    return {**sizes, "total": sum(sizes.values())}


def finish_iteration(loop: _Loop, iteration: int, backend: Any) -> IterationMetrics:
    """Signals -> contexts -> feedback -> D_t -> (held-out eval) -> the metrics line, for iteration t >= 1."""
    train_seconds = time.perf_counter() - loop.iteration_started
    trajectories = loop.trajectories(iteration)
    started = time.perf_counter()
    report = signals_phase(loop, iteration, trajectories)
    signal_seconds = time.perf_counter() - started
    started = time.perf_counter()
    loop.pool.start_iteration(iteration)
    contexts = contexts_phase(loop, iteration, report, trajectories)
    result = synthesis_phase(loop, iteration, contexts) if contexts else None
    feedback_seconds = time.perf_counter() - started
    heldout = None
    started = time.perf_counter()
    every = loop.config.loop.eval_every
    if loop.evaluate and (iteration == loop.iterations or (every and iteration % every == 0)):
        heldout = eval_phase(loop.config, loop.eval_env, loop.eval_tasks, backend, loop.renderer)
    eval_seconds = time.perf_counter() - started
    seconds = {"train": train_seconds, "signals": signal_seconds, "feedback": feedback_seconds, "eval": eval_seconds}
    steps = ((iteration - 1) * loop.steps_per_iteration + 1,
             min(iteration * loop.steps_per_iteration, loop.config.run.max_steps))
    metrics = IterationMetrics(
        iteration, steps, sum(t.score >= 1.0 for t in trajectories) / max(1, len(trajectories)), heldout,
        {kind: report.count(kind) for kind in SIGNAL_KINDS},
        result.summary() if result is not None else {}, pool_sizes(loop.pool, iteration),
        {key: round(value, 3) for key, value in seconds.items()},
        round(feedback_seconds / max(1e-9, sum(seconds.values())), 4),
    )
    loop.metrics.append(metrics.to_dict())  # the iteration's commit point: a resume redoes what came before it
    loop.say(f"iteration {iteration}: train success {metrics.train_success:.2f}, held-out "
             f"{'-' if heldout is None else f'{heldout:.3f}'}, signals {dict(metrics.signals)}, accepted "
             f"{metrics.feedback.get('accepted', 0)}, pool {metrics.pool['total']}, feedback share "
             f"{metrics.feedback_share:.1%}")
    loop.iteration_started = time.perf_counter()
    return metrics


# ---------------------------------------------------------------------------------------------------------------
# Phase 10: GRPO steps, with the loop's phases at every iteration's end
# ---------------------------------------------------------------------------------------------------------------


def iteration_callback(loop: _Loop, rollouts: Any, backend_for: Callable[[], Any]) -> Any:
    """A `TrainerCallback`: a checkpoint at every iteration's last step, then (at the epoch's end, one epoch being
    one iteration) the iteration's phases and the next iteration's sample of D_t."""
    from transformers import TrainerCallback

    class _Iterations(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % loop.steps_per_iteration == 0:
                control.should_save = True  # resume restarts at an iteration's end at the latest
            return control

        def on_epoch_end(self, args, state, control, **kwargs):
            iteration = math.ceil(state.global_step / loop.steps_per_iteration)
            if state.global_step == 0:
                return control
            if loop.main and iteration not in loop.recorded():
                with backend_for() as backend:
                    finish_iteration(loop, iteration, backend)
            PartialState().wait_for_everyone()  # the next sample reads the pool the main process just wrote
            if iteration < loop.iterations:
                rollouts.assign_slots(loop.sample(iteration + 1), iteration + 1, loop.slots)
            return control

    return _Iterations()


def train_phase(loop: _Loop, tokenizer: Any, resume: bool, backend: Any = None) -> tuple[int, int]:
    """GRPO until run.max_steps, the loop's phases after every iteration; returns (step resumed from, final step)."""
    from coevolve.policy.models import resolve_model
    from coevolve.train import (EnvRollouts, TrainingError, build_trainer, checkpoint_step, last_checkpoint,
                                metrics_callback, rollout_config, slot_dataset, trajectory_summary)

    config, directory = loop.config, loop.directory
    steps_log = JsonLines(directory / STEPS)
    checkpoint = last_checkpoint(directory) if resume else None
    start = checkpoint_step(checkpoint) if checkpoint else 0
    if resume and checkpoint is None:
        loop.say(f"no checkpoint in {directory / 'checkpoints'} yet: training from step 0")
    # Steps after the checkpoint were lost with the kill; they run again, so their lines go.
    for log in (steps_log, loop.rollouts_log):
        if log.path.exists():
            log.truncate_after(start)
    pending: dict[int, dict[str, Any]] = {}

    def on_step(record) -> None:
        pending[record.step] = record.summary()
        loop.rollouts_log.extend([{"step": record.step, **trajectory_summary(t)} for t in record.trajectories])

    rollouts = EnvRollouts(loop.env, loop.pool.tasks_at(0), loop.renderer, rollout_config(config),
                           seed=config.run.seed, mask_truncated=config.grpo.mask_truncated, backend=backend,
                           on_step=on_step, reward=config.grpo.reward, partial_credit=config.grpo.partial_credit)
    callbacks = [metrics_callback(steps_log, pending),
                 iteration_callback(loop, rollouts, lambda: _backend(rollouts, trainer))]
    trainer = build_trainer(config, directory, resolve_model(config.model.name), tokenizer, rollouts, [],
                            callbacks=callbacks, dataset=slot_dataset(loop.slots))
    current = start // loop.steps_per_iteration + 1  # the iteration the next step belongs to
    done = loop.recorded()
    ended = math.ceil(start / loop.steps_per_iteration)  # the last iteration whose steps are all in the checkpoint
    complete = start % loop.steps_per_iteration == 0 or start >= config.run.max_steps
    redo = loop.main and ended >= 1 and complete and ended not in done
    if checkpoint is not None and loop.evaluate and redo:
        trainer._load_from_checkpoint(str(checkpoint))  # the redone phases evaluate the checkpoint's weights
    if redo:
        # Killed after iteration t's last checkpoint, before its phases were recorded: redo them first (the
        # pool's transactions and the feedback log make the redo idempotent).
        with _backend(rollouts, trainer) as generation:
            finish_iteration(loop, ended, generation)
    if loop.main and 0 not in done:
        with _backend(rollouts, trainer) as generation:
            record_baseline(loop, generation)
    if start >= config.run.max_steps:
        loop.say(f"nothing to train: the last checkpoint is at step {start} = run.max_steps; raise run.max_steps "
                 "to continue")
        if not (directory / "final").exists():
            trainer.save_model(str(directory / "final"))
            tokenizer.save_pretrained(str(directory / "final"))
        return start, start
    rollouts.assign_slots(loop.sample(current), current, loop.slots)
    loop.iteration_started = time.perf_counter()
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    final = trainer.state.global_step
    # The known failure mode: a resumed run that believes it is done (epoch/step bookkeeping) trains nothing.
    if final <= start:
        origin = f"resumed from step {start}" if start else "started"
        raise TrainingError(f"{origin} but no step was trained (global step {final}, run.max_steps "
                            f"{config.run.max_steps}); if resumed, the checkpoint's trainer_state.json may not match "
                            "this config (prompts_per_step, group_size, loop.steps_per_iteration)")
    loop.say(f"trained steps {start + 1}..{final}")
    final_dir = directory / "final"
    trainer.save_model(str(final_dir))  # collective under DeepSpeed/FSDP; writes from the main process only
    if loop.main:
        tokenizer.save_pretrained(str(final_dir))
    return start, final


def _backend(rollouts: Any, trainer: Any) -> Any:
    """The generation backend over the model being trained (what rollouts use), as a context manager."""
    return rollouts._generation_backend(trainer)


def record_baseline(loop: _Loop, backend: Any) -> IterationMetrics:
    """Iteration 0: the policy before any training step, on the held-out set; D_0's size."""
    started = time.perf_counter()
    heldout = eval_phase(loop.config, loop.eval_env, loop.eval_tasks, backend, loop.renderer) if loop.evaluate else None
    seconds = {"train": 0.0, "signals": 0.0, "feedback": 0.0, "eval": round(time.perf_counter() - started, 3)}
    metrics = IterationMetrics(0, None, None, heldout, {kind: 0 for kind in SIGNAL_KINDS}, {},
                               pool_sizes(loop.pool, 0), seconds, 0.0)
    loop.metrics.append(metrics.to_dict())
    if heldout is not None:
        loop.say(f"before training: held-out success {heldout:.3f} on {len(loop.eval_tasks)} tasks")
    return metrics


# ---------------------------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------------------------


def run(config_path: str | None, overrides: Sequence[str] = (), output_dir: str | None = None,
        resume: bool = False, backend: Any = None, say: Callable[[str], None] = print) -> RunResult:
    started = time.perf_counter()
    config, directory = prepare_run(config_path, overrides, output_dir, resume)
    _check_single_process(config)
    env = build_env(config)
    tasks = load_tasks(config, env)
    tokenizer, renderer, tasks = build_renderer(config, env, tasks)
    eval_env, eval_tasks = build_eval(config, env)
    say(f"run {directory}: mode {config.run.mode}, {len(tasks)} tasks, model {config.model.name}, "
        f"{config.run.max_steps} steps of {config.grpo.prompts_per_step} tasks x {config.rollout.group_size} rollouts "
        f"in iterations of {config.loop.steps_per_iteration}; held-out: {len(eval_tasks)} tasks")
    process = PartialState()
    if not process.is_main_process:
        process.wait_for_everyone()  # the main process creates the pool with D_0 first
    pool = open_pool(directory, tasks) if process.is_main_process else TaskPool(pool_path(directory), create=False)
    if process.is_main_process:
        process.wait_for_everyone()
    with pool:
        loop = _Loop(config, directory, env, renderer, pool, eval_env, eval_tasks, say)
        if config.run.mode == "synthetic" and 0 not in loop.recorded():
            # One synthesis pass before training: random contexts over D_0, the admitted tasks join D_0.
            contexts = random_contexts(pool.tasks_at(0), config.loop.synthetic_contexts, 0, config.run.seed)
            result = synthesis_phase(loop, 0, contexts)
            say(f"synthesis before training: {len(result.admitted)} tasks admitted of {len(result.candidates)}")
        if config.run.mode == "zero-shot":
            start = final = 0
            if 0 not in loop.recorded():
                record_baseline(loop, backend if backend is not None else _policy_backend(config, tokenizer))
        else:
            start, final = train_phase(loop, tokenizer, resume, backend)
        records = loop.metrics.read()
        sizes = pool_sizes(pool, pool.latest_iteration() or 0)
    result = RunResult(directory, start, final, time.perf_counter() - started, _first(records), _last(records))
    if not process.is_main_process:
        return result
    summary = summary_of(config, records, sizes, final, start, result.seconds)
    (directory / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    report = write_report(directory)
    say(summary_table(summary) + f"\nreport: {report}")
    return result


def _policy_backend(config: Config, tokenizer: Any) -> Any:
    from coevolve.policy.hf_backend import TransformersBackend
    from coevolve.policy.models import load_model

    model, _ = load_model(config.model.name, dtype=config.model.dtype, device=config.model.device)
    return TransformersBackend(model, tokenizer)


def _check_single_process(config: Config) -> None:
    if PartialState().num_processes > 1 and config.run.mode != "static":
        raise ConfigError(f"run.mode {config.run.mode}: the feedback modes run in one process (the feedback phase "
                          "and the pool are not shared across processes); multi-process training is mode static")


def _first(records: Sequence[dict[str, Any]]) -> float | None:
    return next((r["heldout_success"] for r in records if r["heldout_success"] is not None), None)


def _last(records: Sequence[dict[str, Any]]) -> float | None:
    return next((r["heldout_success"] for r in reversed(records) if r["heldout_success"] is not None), None)


def summary_of(config: Config, records: Sequence[dict[str, Any]], sizes: Mapping[str, int], final: int,
               start: int, seconds: float) -> dict[str, Any]:
    feedback = sum(r["seconds"]["feedback"] for r in records)
    total = sum(sum(r["seconds"].values()) for r in records)
    return {
        "mode": config.run.mode, "steps": final, "resumed_from": start, "iterations": max(
            (r["iteration"] for r in records), default=0),
        "heldout_before": _first(records), "heldout_after": _last(records),
        "tasks_added": sizes.get("synthetic", 0), "pool": dict(sizes),
        "feedback_share": round(feedback / total, 4) if total else 0.0, "seconds": round(seconds, 2),
    }


def summary_table(summary: Mapping[str, Any]) -> str:
    def fmt(value: Any) -> str:
        return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)

    rows = [("mode", summary["mode"]), ("steps", summary["steps"]), ("held-out success before", summary["heldout_before"]),
            ("held-out success after", summary["heldout_after"]), ("synthetic tasks in the pool", summary["tasks_added"]),
            ("feedback share of wall time", f"{summary['feedback_share']:.1%}"), ("seconds", summary["seconds"])]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {fmt(value)}" for name, value in rows)
