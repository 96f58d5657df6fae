"""A run's set-up and wrap-up around the loop (`coevolve.loop`): the resolved config and run directory, the env and
D_0, the policy's prompt, the pool, the held-out set, and the closing summary. Plumbing, not the algorithm.
"""

from __future__ import annotations

import inspect
import json
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from coevolve.config import Config, ConfigError, load_config, micro_batches, write_config
from coevolve.envs import ENVS, make_env
from coevolve.envs.base import Env
from coevolve.jsonl import read_jsonl
from coevolve.pool import TaskPool, pool_path
from coevolve.records import Task

METRICS = "metrics.jsonl"
CHECKPOINT_CONFIG = "coevolve-config.yaml"
"""The run's resolved config, saved into every checkpoint: what its weights were trained with."""


FIXED_ON_RESUME = (
    "run.mode", "run.seed", "env.name", "env.split", "env.category", "env.limit", "env.tasks_file", "env.options",
    "model.name", "model.dtype", "model.reply_format", "model.demos", "model.demo_choice", "model.demo_without_tools",
    "model.demo_max_calls", "model.chat_template",
    "model.tool_style", "model.reasoning", "rollout.group_size", "rollout.max_new_tokens",
    "rollout.max_replies_per_turn", "rollout.max_turns", "rollout.max_episode_tokens", "rollout.temperature",
    "rollout.top_p", "rollout.top_k", "grpo.prompts_per_step", "grpo.micro_batch_size", "grpo.learning_rate",
    "grpo.epsilon_low", "grpo.epsilon_high", "grpo.beta", "grpo.kl_importance_correction", "grpo.ref_model",
    "grpo.loss_normalisation", "grpo.scale_rewards", "grpo.passes_per_batch", "grpo.max_grad_norm",
    "grpo.weight_decay", "grpo.warmup_steps", "grpo.lr_scheduler", "grpo.bf16", "grpo.master_weights",
    "grpo.mask_truncated", "grpo.guidance",
    "grpo.reward", "grpo.partial_credit", "lora", "loop.steps_per_iteration", "loop.synthetic_fraction",
    "loop.signal_weights", "loop.recur_fraction", "loop.sampler", "loop.curriculum", "loop.d0",
    "loop.synthetic_contexts", "signals",
    "synthesis.explorer", "synthesis.abstractor", "synthesis.step_budget", "synthesis.episodes_per_context",
    "synthesis.max_contexts", "synthesis.rest_contexts", "synthesis.focus_weight", "synthesis.max_solution_calls",
    "synthesis.dedup_threshold",
    "synthesis.check_execution", "synthesis.max_call_chars", "synthesis.focus_retries",
)
"""What gives a step, a sample or a synthesized task its meaning: a resumed run must keep them (README lists what
may change: run.max_steps, save and logging settings, held-out evaluation, time budgets, endpoints, vLLM)."""


def resolve_config(config_path: str | None, overrides: Sequence[str], output_dir: str | None,
                   resume: bool) -> tuple[Config, Path]:
    """The run's config and directory, checked, with nothing written. With `--resume` the directory's own
    config.yaml (or `--config FILE`, when given) is the base, and it and the overrides may change only what does
    not change the meaning of the steps trained (FIXED_ON_RESUME); a new run refuses a directory that holds one,
    or that cannot be a directory."""
    if resume:
        directory = Path(output_dir) if output_dir else Path(load_config(config_path, overrides).run.output_dir)
        saved_path = directory / "config.yaml"
        if not saved_path.exists():
            raise ConfigError(f"--resume: {directory} has no config.yaml; start the run without --resume")
        # `--config FILE --resume`: that file is the base (its differences in what fixes the steps' meaning are
        # refused below, like an override's); without it, the directory's own config.yaml.
        config = load_config(config_path if config_path else saved_path, overrides)
        # What the steps were trained with: the config saved beside the last checkpoint (an edited config.yaml
        # does not change it), else the run's config.yaml as it was written.
        trained = sorted(directory.glob(f"checkpoints/checkpoint-*/{CHECKPOINT_CONFIG}"),
                         key=lambda path: int(path.parent.name.rsplit("-", 1)[-1]))
        saved = load_config(trained[-1] if trained else saved_path)
        for key in FIXED_ON_RESUME:
            before, after = _lookup(saved, key), _lookup(config, key)
            if before != after:
                raise ConfigError(f"--resume: {key} is {after!r} here but {directory} was trained with {before!r}; "
                                  "keep it, or start a new run in another --output-dir")
    else:
        config = load_config(config_path, overrides)
        directory = Path(output_dir or config.run.output_dir)
        if (directory / "checkpoints").exists() or (directory / METRICS).exists():
            raise ConfigError(f"{directory} already holds a run; continue it with --resume, or pick another "
                              "--output-dir")
    _check_writable(directory)
    return replace(config, run=replace(config.run, output_dir=str(directory))), directory


def write_run_config(config: Config, directory: Path, is_main: bool) -> None:
    """The run directory made and the resolved config written into it (main process; under the run's lock)."""
    directory.mkdir(parents=True, exist_ok=True)
    if is_main:
        write_config(config, directory / "config.yaml")


def _lookup(config: Config, key: str) -> Any:
    value: Any = config
    for part in key.split("."):
        value = getattr(value, part)
    return value


def _check_writable(directory: Path) -> None:
    """A run directory that cannot be one, said before anything runs: a file, a folder under a file, no write."""
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"--output-dir {directory} is a file; name a folder")
    existing = next((parent for parent in [directory, *directory.parents] if parent.exists()), None)
    if existing is not None and not existing.is_dir():
        raise ConfigError(f"--output-dir {directory} is under {existing}, which is a file; name a folder")
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"--output-dir {directory}: {existing} is not writable; name a folder you can write")
    if existing is not None:  # permission bits say little (root, /proc): a folder made and removed says it all
        import tempfile

        try:
            os.rmdir(tempfile.mkdtemp(prefix=".coevolve-probe-", dir=existing))
        except OSError as error:
            raise ConfigError(f"--output-dir {directory}: a folder cannot be made in {existing} "
                              f"({error.strerror or error}); name a folder you can write") from None


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
        env = make_env(config.env.name, **options)
    except (KeyError, ValueError, TypeError) as error:
        raise ConfigError(f"env: {error}") from None
    _check_env_for_run(config, env)
    return env


def _check_env_for_run(config: Config, env: Env) -> None:
    """What an env that anyone writes (env mcp) must give this run, checked before anything slow: room for a
    rollout's sessions, and schemas the offline explorer can draw arguments from."""
    sessions = env.max_sessions
    episodes = config.grpo.prompts_per_step * config.rollout.group_size
    if sessions is not None and episodes > sessions:
        raise ConfigError(f"a rollout opens {episodes} episodes at once (grpo.prompts_per_step x rollout.group_size), "
                          f"more than env.options.max_sessions ({sessions}): raise it or take fewer prompts a step")
    if config.run.mode in ("coevolve", "random", "synthetic") and config.synthesis.explorer == "offline":
        unfillable = env.exploration_problems()
        if unfillable:
            raise ConfigError(f"synthesis.explorer offline cannot draw a value for {', '.join(unfillable[:4])} "
                              "(required, of a schema it does not know); use synthesis.explorer: llm or policy, or "
                              "give the argument a plain type")


def load_tasks(config: Config, env: Env) -> list[Task]:
    """D_0: the env's split, or `env.tasks_file`, the first `env.limit` of them."""
    if config.env.tasks_file:
        path = Path(config.env.tasks_file)
        if not path.is_file():
            raise ConfigError(f"env.tasks_file: {path} is {'a folder' if path.is_dir() else 'not there'}; name a "
                              "JSON-lines file of task records (e.g. what `coevolve pool DIR --export FILE` wrote)")
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
        where = f"env.tasks_file {config.env.tasks_file} holds no task" if config.env.tasks_file else "env: no tasks"
        raise ConfigError(f"{where} to train on")
    if config.env.tasks_file:  # a file's records are untrusted: checked before anything runs
        for task in tasks:
            problem = f"it is a task of env {task.env!r}" if task.env != env.name else env.check_task(task)
            if problem:
                raise ConfigError(f"env.tasks_file: task {task.name[:60]!r} cannot run in env {env.name!r}: {problem}")
    return tasks


USER_ENV_CHECKED_TASKS = 2
"""How many of D_0's tasks a run plays twice at its start, as `coevolve env check` would (user envs only)."""


def env_check_warnings(env: Env, tasks: Sequence[Task], limit: int = USER_ENV_CHECKED_TASKS) -> list[str]:
    """What `coevolve env check` would refuse in a user env (`mcp:`, `python:`), from its first `limit` tasks'
    ground truths played twice, so a run says it at its start instead of training on a server whose episodes
    differ or fail. Other envs (`Env.user_tools` false): nothing (their tasks are checked by their own tests)."""
    from coevolve.envs.user_env import truth_problem

    if not env.user_tools:
        return []
    cause = ("randomness, the clock, or state every episode shares: one shared MCP server, a class attribute? "
             "`coevolve env check` says which")
    lines = []
    for task in list(tasks)[:limit]:
        problem = truth_problem(env, task, cause)
        if problem:
            lines.append(f"`coevolve env check` refuses task {task.name!r}: {problem}")
    return lines


def build_renderer(config: Config, env: Env, tasks: Sequence[Task]) -> tuple[Any, Any, list[Task]]:
    """(tokenizer, renderer, training tasks). Worked examples come from the training tasks and leave the set:
    a task whose solution is in the prompt teaches nothing."""
    from coevolve.policy.chat import ChatRenderer, build_demonstrations
    from coevolve.policy.models import load_tokenizer

    tokenizer = load_tokenizer(config.model.name)
    if config.model.chat_template:
        tokenizer.chat_template = Path(config.model.chat_template).read_text()
    hidden = set(config.model.demo_without_tools)
    longest = config.model.demo_max_calls
    shown_tasks = [task for task in tasks if not hidden & set(task.truth_tools)
                   and (longest is None or len(task.truth_tools) <= longest)]
    demos = build_demonstrations(env, shown_tasks, config.model.reply_format, config.model.demos,
                                 config.model.demo_choice)
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


def _start_key(task: Task) -> tuple[str, str, str]:
    query = " ".join(" ".join(str(m.get("content", "")).split()) for turn in task.turns[:1] for m in turn).lower()
    return task.env, json.dumps(task.initial_state, sort_keys=True, default=str), query


def heldout_overlap(train: Sequence[Task], heldout: Sequence[Task]) -> list[Task]:
    """The held-out tasks that are also training tasks: the same id, or the same env, initial state and first
    query (whitespace and case aside)."""
    ids, starts = {task.id for task in train}, {_start_key(task) for task in train}
    return [task for task in heldout if task.id in ids or _start_key(task) in starts]


def check_heldout(config: Config, train: Sequence[Task], heldout: Sequence[Task]) -> None:
    """Refuse, in one line, a held-out set that shares tasks with D_0 (the worked examples included), unless
    `loop.allow_heldout_overlap`."""
    shared = heldout_overlap(train, heldout)
    if shared and not config.loop.allow_heldout_overlap:
        names = ", ".join(task.name for task in shared[:3])
        raise ConfigError(f"the held-out set shares {len(shared)} of its {len(heldout)} tasks with D_0 (e.g. {names}): "
                          "a score there measures memory, not skill; give D_0 and the held-out set disjoint splits "
                          "(env.split: train, loop.eval_split: test; BFCL's are a seeded half each), or set "
                          "loop.allow_heldout_overlap: true on purpose")


def policy_backend(config: Config, tokenizer: Any) -> Any:
    from coevolve.policy.hf_backend import TransformersBackend
    from coevolve.policy.models import load_model

    model, _ = load_model(config.model.name, dtype=config.model.dtype, device=config.model.device)
    return TransformersBackend(model, tokenizer)


def check_processes(config: Config, num_processes: int, deepspeed: bool = False) -> None:
    """What a run on `num_processes` processes needs, checked before anything loads: a step's trajectories split
    into whole micro-batches on every process; the policy as explorer only where one process can generate alone
    (under DeepSpeed ZeRO every forward pass is collective, and synthesis runs on the main process only)."""
    micro, _ = micro_batches(config, num_processes)
    group_size = config.rollout.group_size
    if num_processes > 1 and config.grpo.guidance != "off" and micro % group_size:
        # Each process rolls out whole micro-batches: with micro < K (or not a multiple of K) a GRPO group is split
        # across processes, and guidance, which replaces a rollout of an all-failure group, could not see one.
        raise ConfigError(f"grpo.guidance needs whole GRPO groups on each process: grpo.micro_batch_size ({micro}) "
                          f"must be a multiple of rollout.group_size ({group_size}) on {num_processes} processes")
    if num_processes > 1 and deepspeed and config.synthesis.explorer == "policy" and config.run.mode == "coevolve":
        raise ConfigError("synthesis.explorer: policy cannot run under DeepSpeed with several processes (synthesis "
                          "runs on the main process alone, and every ZeRO forward pass needs all of them); use "
                          "synthesis.explorer: llm with an endpoint, or offline")


def first_heldout(records: Sequence[dict[str, Any]]) -> float | None:
    """Before training: iteration 0's figure (None when `loop.eval_before_training` was off)."""
    return next((r["heldout_success"] for r in records if r["iteration"] == 0), None)


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


# --------------------------------------------------------------------------------------------------------------
# The console: a progress bar and one line per iteration; the libraries' chatter goes to run.log
# --------------------------------------------------------------------------------------------------------------

LIBRARY_LOGGERS = ("transformers", "trl", "accelerate", "datasets", "peft", "mcp", "coevolve")
"""Loggers whose records go to run.log during a run; `coevolve` is the loop's own notes (`Run.note_once`)."""


@contextmanager
def run_logging(directory: Path) -> Iterator[Path]:
    """For the run's duration, Python warnings and the libraries' log records go to DIR/run.log (appended), not
    to the console, which keeps the progress bars and the loop's own lines."""
    import logging
    import warnings

    from transformers.utils import logging as transformers_logging

    transformers_logging.get_logger()  # transformers adds its console handler on first use: let it, then move it
    path = directory / "run.log"
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    saved = []
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, logger.handlers[:], logger.propagate))
        logger.handlers = [handler]
        logger.propagate = False
    shown = warnings.showwarning

    def to_log(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001 - warnings' signature
        handler.stream.write(warnings.formatwarning(message, category, filename, lineno, line))
        handler.flush()

    warnings.showwarning = to_log
    bars = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()  # "Loading weights", "Writing model shards": not the run's progress
    try:
        yield path
    finally:
        if bars:
            transformers_logging.enable_progress_bar()
        warnings.showwarning = shown
        for logger, handlers, propagate in saved:
            logger.handlers, logger.propagate = handlers, propagate
        handler.close()


# Where a run picks up (plumbing the loop's `_run` calls; its trainer: `coevolve.train.calls.attach_trainer`)


@dataclass(frozen=True)
class ResumePlan:
    """Where a run picks up: the step of its last checkpoint and the first iteration without a metrics line."""

    checkpoint_step: int
    first_iteration: int
    baseline_done: bool


def resume_plan(run: Any, resume: bool) -> ResumePlan:
    """Decide what a (resumed) run still has to do, and drop the log lines of steps lost with a kill: those steps
    train again with the same seeds, so their lines would otherwise come twice."""
    from coevolve.train.calls import checkpoint_step, last_checkpoint

    checkpoint = last_checkpoint(run.directory) if resume else None
    step = checkpoint_step(checkpoint) if checkpoint else 0
    if resume and checkpoint is None and run.config.run.mode != "zero-shot":
        run.say(f"no checkpoint in {run.directory / 'checkpoints'} yet: training from step 0")
    for log in (run.steps_log, run.rollouts_log):
        log.truncate_after(step)
    # An iteration committed before its checkpoint was complete (`run.async_save`, then a kill) is done again: every
    # process plans without its line, the main process drops it.
    def covered(record: dict) -> bool:
        return not resume or not record.get("steps") or record["steps"][1] <= step

    if resume and run.is_main:
        run.metrics_log.rewrite(covered)
    recorded = {record["iteration"] for record in run.metrics_log.read() if covered(record)}
    pending = [t for t in range(1, run.iterations + 1) if t not in recorded]
    return ResumePlan(step, pending[0] if pending else run.iterations + 1, 0 in recorded)


class PhaseTimer:
    """Wall seconds per named phase (`with timer("train"): ...`)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - started


# ---------------------------------------------------------------------------------------------------------------
# What an iteration's record reports (`coevolve.loop.record_iteration`)
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Heldout:
    """One held-out evaluation: greedy success over all tasks, by the number of ground-truth calls, and by whether
    the tools the ground truth calls are all called somewhere in D_0 (`seen`) or not (`unseen`)."""

    success: float
    by_calls: Mapping[str, float]
    by_tools: Mapping[str, float] = field(default_factory=dict)


def success_by(rows: Sequence[Mapping[str, Any]], key: Callable[[Mapping[str, Any]], str]) -> dict[str, float]:
    """Mean success of the rows in each group; shorter keys first, so "2" comes before "10" and "seen" before
    "unseen"."""
    groups: dict[str, list[bool]] = {}
    for row in rows:
        groups.setdefault(key(row), []).append(row["success"])
    return {group: sum(found) / len(found)
            for group, found in sorted(groups.items(), key=lambda item: (len(item[0]), item[0]))}


def heldout_text(metrics: Any) -> str:
    """`0.550 (1-call 0.733, 2-call 0.000)`, `0.438 (seen tools 0.663, unseen tools 0.000)`: each split only when
    it has several parts; `-` when not evaluated."""
    if metrics.heldout_success is None:
        return "-"
    parts = [f"{calls}-call {rate:.3f}" for calls, rate in metrics.heldout_by_calls.items()
             if len(metrics.heldout_by_calls) > 1]
    parts += [f"{part} tools {rate:.3f}" for part, rate in metrics.heldout_by_tools.items()
              if len(metrics.heldout_by_tools) > 1]
    return f"{metrics.heldout_success:.3f}" + (f" ({', '.join(parts)})" if parts else "")


def pool_sizes(pool: TaskPool, t: int) -> dict[str, int]:
    sizes = {source: len(pool.entries_at(t, source=source)) for source in ("seed", "synthetic")}
    return {**sizes, "total": sum(sizes.values())}


def new_tool_tasks(pool: TaskPool, t: int, seed_tools: set[str]) -> dict[str, int]:
    """Synthesized tasks of D_t calling a tool no task of D_0 calls, and how many of them are one call long."""
    found = [task for task in pool.tasks_at(t, source="synthetic") if set(task.truth_tools) - seed_tools]
    return {"admitted": len(found), "one_call": sum(len(task.truth_tools) == 1 for task in found)}


def exposed_tools(env: Env, tasks: Sequence[Task]) -> dict[str, list[str]]:
    """Task id -> the names of the tools a fresh episode of it exposes (the unexplored rare's `exposed`)."""
    return {task.id: [doc["name"] for doc in env.reset(task).tools()] for task in tasks}
