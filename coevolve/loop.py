"""A training run, as named phases: prepare the run directory -> load D_0 -> build the policy's prompt -> train.

    coevolve train --config configs/lite-static.yaml [--output-dir DIR] [--resume] [section.key=value ...]

Mode `static` is the paper's baseline: plain GRPO (`coevolve.train`, TRL underneath) on the fixed task set D_0.
The feedback modes of the CoEvolve loop (signals -> exploration -> abstraction -> validation -> D_{t+1}) build on
these phases and are not in this module yet; the config refuses them with a message saying so.

The run directory (a person can read it, and `--resume` continues it):
    config.yaml          the resolved config (every default filled in)
    metrics.jsonl        one line per optimizer step: TRL's loss/reward/KL/clip ratios + our rollout summary
    rollouts.jsonl       one line per trajectory trained on (steps, score, reasons; no token ids)
    checkpoints/         TRL checkpoints (model, optimizer, scheduler, RNG, step) every run.save_steps and at the end
    final/               the trained model (or LoRA adapter) and tokenizer
    summary.json         steps trained, first/last success rates, wall time
A kill loses at most the steps since the last checkpoint: on resume, lines written after it are dropped and those
steps are trained again, with the same rollout seeds, so the files end up as if nothing had happened.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from coevolve.config import Config, ConfigError, load_config, write_config
from coevolve.envs import make_env
from coevolve.envs.base import Env
from coevolve.records import Task


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


def build_env(config: Config) -> Env:
    options: dict[str, Any] = {}
    if config.env.split is not None and config.env.name == "bfcl-lite":
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
    demos = build_demonstrations(env, tasks, config.model.reply_format, config.model.demos)
    shown = {messages[0]["content"] for messages in demos}
    remaining = [task for task in tasks if task.turns[0][0]["content"] not in shown]
    if not remaining:
        raise ConfigError("model.demos: every task went into the worked examples; lower model.demos")
    return tokenizer, ChatRenderer(tokenizer, config.model.reply_format, demonstrations=demos), remaining


# ---------------------------------------------------------------------------------------------------------------
# Phase 4: GRPO
# ---------------------------------------------------------------------------------------------------------------


def train_phase(config: Config, directory: Path, env: Env, tasks: Sequence[Task], tokenizer: Any, renderer: Any,
                resume: bool, backend: Any = None, say: Callable[[str], None] = print) -> tuple[int, int]:
    """Train with TRL until run.max_steps; returns (step resumed from, final step)."""
    from accelerate import PartialState

    from coevolve.policy.models import resolve_model
    from coevolve.train import (EnvRollouts, JsonLines, TrainingError, build_trainer, checkpoint_step,
                                last_checkpoint, metrics_callback, rollout_config, trajectory_summary)

    process = PartialState()
    # Under `accelerate launch` every process rolls out its own share: each keeps its own rollout log, and only
    # the main process writes the files the run shares.
    suffix = f".p{process.process_index}" if process.process_index else ""
    metrics = JsonLines(directory / "metrics.jsonl")
    rollouts_log = JsonLines(directory / f"rollouts{suffix}.jsonl")
    checkpoint = last_checkpoint(directory) if resume else None
    start = checkpoint_step(checkpoint) if checkpoint else 0
    if resume and checkpoint is None:
        say(f"no checkpoint in {directory / 'checkpoints'} yet: training from step 0")
    # Steps after the checkpoint were lost with the kill; they run again, so their lines go.
    logs = (metrics, rollouts_log) if process.is_main_process else (rollouts_log,)
    for log in logs:
        if log.path.exists():
            log.truncate_after(start)
    if start >= config.run.max_steps:
        say(f"nothing to train: the last checkpoint is at step {start} = run.max_steps; raise run.max_steps "
            "to continue")
        return start, start

    pending: dict[int, dict[str, Any]] = {}

    def on_step(record) -> None:
        pending[record.step] = record.summary()
        rollouts_log.extend([{"step": record.step, **trajectory_summary(t)} for t in record.trajectories])

    rollouts = EnvRollouts(env, tasks, renderer, rollout_config(config), seed=config.run.seed,
                           mask_truncated=config.grpo.mask_truncated, backend=backend, on_step=on_step)
    callbacks = [metrics_callback(metrics, pending)] if process.is_main_process else []
    trainer = build_trainer(config, directory, resolve_model(config.model.name), tokenizer, rollouts, tasks,
                            callbacks=callbacks)
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    final = trainer.state.global_step
    # The known failure mode: a resumed run that believes it is done (epoch/step bookkeeping) trains nothing.
    if final <= start:
        origin = f"resumed from step {start}" if start else "started"
        raise TrainingError(f"{origin} but no step was trained (global step {final}, run.max_steps "
                            f"{config.run.max_steps}); if resumed, the checkpoint's trainer_state.json may not match "
                            "this config (prompts_per_step, group_size)")
    final_dir = directory / "final"
    trainer.save_model(str(final_dir))  # collective under DeepSpeed/FSDP; writes from the main process only
    if process.is_main_process:
        tokenizer.save_pretrained(str(final_dir))
    return start, final


# ---------------------------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------------------------


def run(config_path: str | None, overrides: Sequence[str] = (), output_dir: str | None = None,
        resume: bool = False, backend: Any = None, say: Callable[[str], None] = print) -> RunResult:
    started = time.perf_counter()
    config, directory = prepare_run(config_path, overrides, output_dir, resume)
    env = build_env(config)
    tasks = load_tasks(config, env)
    tokenizer, renderer, tasks = build_renderer(config, env, tasks)
    say(f"run {directory}: mode {config.run.mode}, {len(tasks)} tasks, model {config.model.name}, "
        f"{config.run.max_steps} steps of {config.grpo.prompts_per_step} tasks x {config.rollout.group_size} rollouts")
    start, final = train_phase(config, directory, env, tasks, tokenizer, renderer, resume, backend, say)
    rates = [m["rollout/success_rate"] for m in _read_jsonl(directory / "metrics.jsonl")
             if "rollout/success_rate" in m]
    result = RunResult(directory, start, final, time.perf_counter() - started,
                       rates[0] if rates else None, rates[-1] if rates else None)
    if not _is_main_process():
        return result
    (directory / "summary.json").write_text(json.dumps({
        "mode": config.run.mode, "steps": final, "resumed_from": start, "seconds": round(result.seconds, 2),
        "first_step_success_rate": result.first_success, "last_step_success_rate": result.last_success,
    }, indent=2) + "\n")
    say(f"trained steps {start + 1}..{final} in {result.seconds:.1f}s; rollout success rate "
        f"{result.first_success} (first step) -> {result.last_success} (last step); model in {directory / 'final'}")
    return result


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
