"""A run's set-up and wrap-up around the loop (`coevolve.loop`): the resolved config and run directory, the env and
D_0, the policy's prompt, the pool, the held-out set, and the closing summary. Plumbing, not the algorithm.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Mapping, Sequence

from coevolve.config import Config, ConfigError, load_config, write_config
from coevolve.envs import ENVS, make_env
from coevolve.envs.base import Env
from coevolve.jsonl import read_jsonl
from coevolve.pool import TaskPool, pool_path
from coevolve.records import Task

METRICS = "metrics.jsonl"


def prepare_run(config_path: str | None, overrides: Sequence[str], output_dir: str | None,
                resume: bool) -> tuple[Config, Path]:
    """Resolve the config and the run directory. With `--resume` the directory's own config.yaml is the base
    (command-line overrides still apply, e.g. a larger run.max_steps to extend a finished run)."""
    if resume:
        directory = Path(output_dir) if output_dir else Path(load_config(config_path, overrides).run.output_dir)
        saved = directory / "config.yaml"
        if not saved.exists():
            raise ConfigError(f"--resume: {directory} has no config.yaml; start the run without --resume")
        config = load_config(saved, overrides)
    else:
        config = load_config(config_path, overrides)
        directory = Path(output_dir or config.run.output_dir)
        if (directory / "checkpoints").exists() or (directory / METRICS).exists():
            raise ConfigError(f"{directory} already holds a run; continue it with --resume, or pick another "
                              "--output-dir")
    directory.mkdir(parents=True, exist_ok=True)
    if process_state(config).is_main_process:
        write_config(config, directory / "config.yaml")
    return config, directory


def process_state(config: Config) -> Any:
    """accelerate's process state (the one TRL and the trainer use), set up for the run's device first: under
    `torchrun`/`accelerate launch` on CPUs, accelerate only sees the other processes (gloo) when told `cpu=True`;
    otherwise every process would believe it is alone and the main one."""
    from accelerate import PartialState

    from coevolve.policy.models import pick_device

    return PartialState(cpu=pick_device(config.model.device) == "cpu")


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
    """D_0: the env's split, or `env.tasks_file`, the first `env.limit` of them."""
    if config.env.tasks_file:
        path = Path(config.env.tasks_file)
        try:
            tasks = [Task.from_dict(row) for row in read_jsonl(path, skip_bad=False)]
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
                            tool_style=config.model.tool_style, reasoning=config.model.reasoning)
    return tokenizer, renderer, remaining


def open_pool(directory: Path, tasks: Sequence[Task]) -> TaskPool:
    """The run's task pool; a new run puts the training tasks in as D_0 (a resumed one finds them there). Other
    processes wait for the main one to create it."""
    from accelerate import PartialState

    process = PartialState()
    if not process.is_main_process:
        process.wait_for_everyone()
        return TaskPool(pool_path(directory), create=False)
    pool = TaskPool(pool_path(directory))
    if pool.latest_iteration() is None:
        pool.add_tasks(tasks, iteration=0)
    process.wait_for_everyone()
    return pool


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


def policy_backend(config: Config, tokenizer: Any) -> Any:
    from coevolve.policy.hf_backend import TransformersBackend
    from coevolve.policy.models import load_model

    model, _ = load_model(config.model.name, dtype=config.model.dtype, device=config.model.device)
    return TransformersBackend(model, tokenizer)


def check_processes(config: Config, num_processes: int, deepspeed: bool = False) -> None:
    """What a run on `num_processes` processes needs, checked before anything loads: a step's trajectories split
    into whole micro-batches on every process; the policy as explorer only where one process can generate alone
    (under DeepSpeed ZeRO every forward pass is collective, and synthesis runs on the main process only)."""
    trajectories = config.grpo.prompts_per_step * config.rollout.group_size
    micro = config.grpo.micro_batch_size or config.rollout.group_size
    if trajectories % (micro * num_processes):
        raise ConfigError(f"grpo.prompts_per_step x rollout.group_size = {trajectories} trajectories a step do not "
                          f"split into micro-batches of {micro} (grpo.micro_batch_size) on {num_processes} processes; "
                          f"make it a multiple of {micro * num_processes}")
    if num_processes > 1 and deepspeed and config.synthesis.explorer == "policy" and config.run.mode == "coevolve":
        raise ConfigError("synthesis.explorer: policy cannot run under DeepSpeed with several processes (synthesis "
                          "runs on the main process alone, and every ZeRO forward pass needs all of them); use "
                          "synthesis.explorer: llm with an endpoint, or offline")


def first_heldout(records: Sequence[dict[str, Any]]) -> float | None:
    return next((r["heldout_success"] for r in records if r["heldout_success"] is not None), None)


def last_heldout(records: Sequence[dict[str, Any]]) -> float | None:
    return next((r["heldout_success"] for r in reversed(records) if r["heldout_success"] is not None), None)


def summary_of(config: Config, records: Sequence[dict[str, Any]], sizes: Mapping[str, int], final: int,
               start: int, seconds: float) -> dict[str, Any]:
    feedback = sum(r["seconds"].get("signals", 0.0) + r["seconds"].get("synthesis", 0.0) for r in records)
    total = sum(sum(r["seconds"].values()) for r in records)
    return {
        "mode": config.run.mode, "steps": final, "resumed_from": start, "iterations": max(
            (r["iteration"] for r in records), default=0),
        "heldout_before": first_heldout(records), "heldout_after": last_heldout(records),
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
