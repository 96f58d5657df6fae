"""The `coevolve` command line.

    coevolve eval --env bfcl --category multi_turn_base --policy oracle|replay:FILE [--json] [--limit N]
    coevolve eval --env bfcl-lite --split test --policy model:smollm2 [--backend transformers|vllm|openai]
                  [--samples K] [--format python|hermes] [--demos N] [--temperature T]
    coevolve eval --env appworld --split test_normal --policy oracle|replay:FILE|model:... (TGC and SGC)
    coevolve serve --model smollm2 [--port 8000]
    coevolve train --config configs/lite-static.yaml [--output-dir DIR] [--resume] [section.key=value ...]
    coevolve pool DIR [--json] [--iteration T] [--source seed|synthetic]

Errors a user can cause (unknown category, missing or malformed replay file) print one line on stderr and exit 2.
Imports stay light: evaluating scripted policies never imports torch.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import typing
from pathlib import Path
from typing import Any, Sequence

from coevolve.config import ModelSection, RolloutSection
from coevolve.envs.base import Env, Episode
from coevolve.policy.chat import DEMO_CHOICES

MODEL, ROLLOUT = ModelSection(), RolloutSection()
"""`coevolve eval` takes its model and rollout defaults from the config's sections (one definition each)."""
DTYPES = typing.get_args(typing.get_type_hints(ModelSection)["dtype"])
REPLY_FORMATS = typing.get_args(typing.get_type_hints(ModelSection)["reply_format"])
TOOL_STYLES = typing.get_args(typing.get_type_hints(ModelSection)["tool_style"])

EXIT_USAGE = 2
EXIT_FAILED = 1
"""A command that ran but could not produce what was asked (every evaluation request failed)."""


OWN_ENVS = {"python": "cls", "mcp": "server"}
"""`--env KIND:package.module:NAME`: your own tools as a class, or an MCP server (or a factory of one)."""


class UsageError(Exception):
    """A user error with a one-line message."""


def _eval_parser(subparsers) -> None:
    parser = subparsers.add_parser("eval", help="score a policy on an environment's tasks")
    parser.add_argument("--env", default="bfcl", help="environment name: bfcl (default), bfcl-lite or appworld")
    parser.add_argument("--category", default=None,
                        help="bfcl: base (default), miss_func, miss_param, long_context (multi_turn_ prefix optional)")
    parser.add_argument("--split", default=None, help="bfcl-lite: train (default) or test; appworld: train, dev, "
                                                      "test_normal or test_challenge")
    parser.add_argument("--policy", required=True,
                        help="oracle | replay:FILE | model:ID_OR_PATH (model:smollm2 = the shipped offline model; "
                             "with --backend openai, the served model's name)")
    parser.add_argument("--limit", type=int, default=None, help="evaluate only the first N tasks")
    parser.add_argument("--tasks", default=None,
                        help="evaluate the tasks of this JSON-lines file: task records of the env (e.g. from `coevolve "
                             "pool DIR --export FILE`), or, for --env python:package.module:ClassName, its task file")
    model = parser.add_argument_group("model policies")
    model.add_argument("--backend", default="transformers", choices=("transformers", "vllm", "openai"))
    model.add_argument("--base-url", default=None, help="openai backend: the endpoint, e.g. http://localhost:8000/v1")
    model.add_argument("--samples", type=int, default=1, help="K samples per task (accuracy = mean success)")
    model.add_argument("--format", dest="reply_format", default=MODEL.reply_format, choices=REPLY_FORMATS,
                       help="tool-call format the model is prompted for (model.reply_format; default: BFCL's "
                            "Python-call list; code = fenced code blocks, AppWorld's way)")
    model.add_argument("--tool-style", default=MODEL.tool_style, choices=TOOL_STYLES,
                       help="tools in the system prompt as BFCL's JSON docs or one line per tool (~1/3 the tokens)")
    model.add_argument("--demos", type=int, default=MODEL.demos,
                       help=f"worked examples in the prompt (model.demos, default {MODEL.demos}), solved by their "
                            "ground truth, taken from tasks that are not evaluated (the train split for bfcl-lite)")
    model.add_argument("--reasoning", default=MODEL.reasoning, choices=("keep", "off"),
                       help="reasoning models (Qwen3): keep what the model thinks in context as sampled (default) or "
                            "use the template's no-thinking mode (model.reasoning)")
    model.add_argument("--demo-choice", default=MODEL.demo_choice, choices=DEMO_CHOICES,
                       help="which tasks become the examples: a new first tool each, in order (default), or the most "
                            "tools not yet shown, multi-call tasks included (the quickstart's prompt)")
    model.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    model.add_argument("--max-new-tokens", type=int, default=ROLLOUT.max_new_tokens,
                       help=f"token budget of one reply (rollout.max_new_tokens, default {ROLLOUT.max_new_tokens})")
    model.add_argument("--max-replies-per-turn", type=int, default=ROLLOUT.max_replies_per_turn,
                       help=f"rollout.max_replies_per_turn (default {ROLLOUT.max_replies_per_turn})")
    model.add_argument("--seed", type=int, default=0)
    model.add_argument("--device", default=MODEL.device)
    model.add_argument("--dtype", default=MODEL.dtype, choices=DTYPES)
    parser.add_argument("--scope", default="official", choices=("official", "exposed"),
                        help="dispatch scope: official = every public method of the involved classes, as the "
                             "official BFCL executor (default); exposed = only the tools shown in the turn")
    parser.add_argument("--state-call", action="append", default=[], metavar="CALL",
                        help="--env mcp:...: a read-only probe call whose result is the server's state, compared "
                             "with the ground truth's after each turn (env.options.state_calls; repeat it)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.set_defaults(handler=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    from coevolve.envs import ENVS, make_env

    if args.limit is not None and args.limit < 1:
        raise UsageError("--limit must be at least 1")
    kind, _, spec = args.env.partition(":")
    if spec and kind in OWN_ENVS:  # your own tools: a class, or an MCP server, and a task file
        from coevolve.envs.user_env import EnvDefinitionError

        if args.category is not None:
            raise UsageError("--category is for env bfcl; your own tools have one task file (choose with --split)")
        if not args.tasks:
            raise UsageError(f"--env {kind}:... needs --tasks FILE (JSON lines: query or turns, reset, ground_truth)")
        try:
            env = make_env(kind, **{OWN_ENVS[kind]: spec}, tasks=args.tasks, split=args.split,
                           **({"state_calls": args.state_call} if kind == "mcp" else {}))
        except (EnvDefinitionError, ValueError) as error:
            raise UsageError(str(error)) from None
        return _eval_env(args, env, {"split": args.split} if args.split else {})
    if args.env not in ENVS:
        raise UsageError(f"unknown env {args.env!r}; known: {', '.join(ENVS.names())}, python:package.module:Class, "
                         "mcp:package.module:SERVER")
    options = {name: value for name, value in (("category", args.category), ("split", args.split)) if value is not None}
    accepted = inspect.signature(ENVS.get(args.env)).parameters
    unknown = [f"--{name}" for name in options if name not in accepted]
    if unknown:
        raise UsageError(f"env {args.env!r} does not take {', '.join(unknown)}")
    try:
        env = make_env(args.env, scope=args.scope, **options)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if args.tasks:  # any task file of this env (e.g. `coevolve pool DIR --export FILE`) instead of its own tasks
        env = _WithTasks(env, _task_file(args.tasks, env.name, env.check_task))
    return _eval_env(args, env, options)


class _WithTasks(Env):
    """An env whose tasks come from a file; every other member of the contract is the env's own."""

    def __init__(self, env: Env, tasks: list) -> None:
        self._env, self._tasks = env, tasks
        self.name, self.states, self.category, self.split = env.name, env.states, env.category, env.split
        self.empty_observations, self.plain_arguments = env.empty_observations, env.plain_arguments
        self.max_sessions = env.max_sessions  # type: ignore[misc]

    def tasks(self) -> list:
        return list(self._tasks)

    def reset(self, task: Any) -> Episode:
        return self._env.reset(task)

    def check_task(self, task: Any) -> str | None:
        return self._env.check_task(task)

    def check_call(self, call: Any) -> tuple[str, str] | None:
        return self._env.check_call(call)

    def metrics(self, per_task: Any) -> dict[str, float]:
        return self._env.metrics(per_task)

    def with_split(self, split: str | None) -> Env | None:
        return self._env.with_split(split)

    def exploration_problems(self) -> list[str]:
        return self._env.exploration_problems()

    def close(self) -> None:
        self._env.close()


def _task_file(path: str, env_name: str, check_task: Any = None) -> list:
    from coevolve.jsonl import jsonl_rows
    from coevolve.records import task_record

    try:
        rows = list(jsonl_rows(Path(path)))
    except OSError as error:
        raise UsageError(f"--tasks {path}: {error.strerror or error}") from None
    except ValueError as error:
        raise UsageError(f"--tasks: {error}") from None
    tasks = []
    for number, row in rows:
        try:
            task = task_record(row, env_name)
        except ValueError as error:
            raise UsageError(f"--tasks {path}:{number}: {error}") from None
        problem = check_task(task) if check_task is not None else None
        if problem:
            raise UsageError(f"--tasks {path}:{number}: {problem}")
        tasks.append(task)
    if not tasks:
        raise UsageError(f"--tasks {path}: no task in it")
    return tasks


def _eval_env(args: argparse.Namespace, env, options: dict) -> int:
    from coevolve.evaluate import ReplayError, evaluate, load_replay, lost_episodes, oracle_script

    if args.policy.startswith("model:"):
        return _eval_model(args, env, options)
    if args.samples != 1:
        raise UsageError("--samples is for model policies: oracle and replay policies play each task once, the same "
                         "way every time")
    tasks = env.tasks()[: args.limit]
    if args.policy == "oracle":
        script_for = oracle_script
    elif args.policy.startswith("replay:"):
        try:
            scripts = load_replay(args.policy.removeprefix("replay:"), {task.name for task in env.tasks()})
        except ReplayError as error:
            raise UsageError(str(error)) from None
        script_for = lambda task: scripts.get(task.name)  # noqa: E731
    else:
        raise UsageError(f"unknown policy {args.policy!r}; use oracle, replay:FILE or model:ID_OR_PATH")
    report = evaluate(env, tasks, script_for, args.policy, env.category)
    lost = lost_episodes(report)  # the env's own failures: a scripted policy has no other way to fail outside
    _show(report, env, args.json, outside=len(lost), cause=lost[0] if lost else None)
    return 0


def _show(report, env, as_json: bool, outside: int = 0, cause: str | None = None, model: bool = False) -> None:
    """The report, with the env's own metrics when it has some (AppWorld: TGC and SGC), and how many episodes
    failed outside the model or script (their 0 is not the policy's score)."""
    extra = env.metrics(report.per_task())
    if as_json:
        print(json.dumps({**report.to_dict(), **extra, "failed_outside_model": outside}))
        return
    if outside:
        print(f"warning: {outside} of {report.n} episodes failed outside the {'model' if model else 'script'} "
              f"(e.g. {cause}); they score 0 here", file=sys.stderr)
    _print_report(report)
    if extra:
        print("  ".join(f"{key} {value:.4f}" if isinstance(value, float) else f"{key} {value}"
                        for key, value in extra.items()))


def _eval_model(args: argparse.Namespace, env, options: dict) -> int:
    from coevolve.evaluate import evaluate_model
    from coevolve.policy.backends import BackendUnavailable, SamplingConfig, make_backend
    from coevolve.policy.chat import ChatRenderer, build_demonstrations
    from coevolve.policy.models import ModelError, check_device
    from coevolve.rollout import RolloutConfig

    spec = args.policy.removeprefix("model:")
    if not spec:
        raise UsageError("model: needs a model id or path, e.g. model:smollm2")
    if args.samples < 1 or args.demos < 0 or args.max_new_tokens < 1 or args.temperature < 0:
        raise UsageError("--samples and --max-new-tokens must be >= 1, --demos and --temperature >= 0")
    if args.max_replies_per_turn < 1:
        raise UsageError("--max-replies-per-turn must be >= 1 (a turn needs one reply at least)")
    try:
        check_device(args.device)
    except ModelError as error:
        raise UsageError(f"--device: {error}") from None
    if args.backend == "openai" and not args.base_url:
        raise UsageError("--backend openai needs --base-url (or use a hosted endpoint's URL)")
    tasks, demo_env, demo_tasks = evaluation_tasks(env, args.env, args.scope, args.limit, args.demos)
    try:
        backend = make_backend(args.backend, spec, device=args.device, dtype=args.dtype, base_url=args.base_url)
    except (ModelError, BackendUnavailable) as error:
        raise UsageError(str(error)) from None
    demos = (build_demonstrations(demo_env, demo_tasks, args.reply_format, args.demos, args.demo_choice)
             if args.demos else ())
    renderer = ChatRenderer(getattr(backend, "tokenizer", None), args.reply_format, demonstrations=demos,
                            tool_style=args.tool_style, reasoning=args.reasoning)
    config = RolloutConfig(group_size=args.samples, max_new_tokens=args.max_new_tokens,
                           max_replies_per_turn=args.max_replies_per_turn, max_turns=ROLLOUT.max_turns,
                           max_episode_tokens=ROLLOUT.max_episode_tokens,
                           sampling=SamplingConfig(temperature=args.temperature, seed=args.seed))
    report, batch = _with_progress(lambda progress: evaluate_model(
        env, tasks, backend, renderer, config, args.policy, env.category, progress), quiet=args.json)
    failed = [t.failure for t in batch.trajectories if t.failure]
    if failed and len(failed) == len(batch.trajectories):
        # Nothing was evaluated: a 0.0 here would read as the model's score.
        print(f"coevolve eval: error: every episode ({len(failed)}) failed outside the model, e.g. {failed[0]}; "
              "no result", file=sys.stderr)
        return EXIT_FAILED
    _show(report, env, args.json, outside=len(failed), cause=failed[0] if failed else None, model=True)
    return 0


def evaluation_tasks(env: Any, env_name: str, scope: str, limit: int | None, demos: int) -> tuple[list, Any, list]:
    """(tasks to evaluate, env of the worked examples, tasks they may come from), never overlapping. The limit
    applies first, so examples can come from the evaluated split's other tasks (bfcl-lite's train split)."""
    from coevolve.envs import make_env

    tasks = env.tasks()[:limit]
    if not demos:
        return tasks, env, []
    own_split = env.with_split("train")  # an env that makes its own train split (your own tools, MCP)
    if own_split is not None:
        evaluated = {task.id for task in tasks}
        return tasks, own_split, [task for task in own_split.tasks() if task.id not in evaluated]
    if env.split is not None:  # an env with splits, one of them chosen (BFCL's are optional)
        demo_env = make_env(env_name, scope=scope, split="train")
        evaluated = {task.id for task in tasks}
        return tasks, demo_env, [task for task in demo_env.tasks() if task.id not in evaluated]
    # No train split: the examples come from the end of the list and stay out of the evaluation.
    demo_tasks = env.tasks()[-demos:]
    return [task for task in tasks if task not in demo_tasks], env, demo_tasks


def _with_progress(work, quiet: bool):
    """Run `work(progress)` under a rich progress bar of finished episodes (on stderr; none with --json)."""
    if quiet:
        return work(None)
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as bar:
        job = bar.add_task("episodes", total=None)
        return work(lambda done, total: bar.update(job, completed=done, total=total))


def _print_report(report) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"[bold]{report.env}[/bold] {report.category}, policy [bold]{report.policy}[/bold]")
    table = Table()
    for column in ("tasks", "samples", "correct", "accuracy"):
        table.add_column(column, justify="right")
    table.add_row(str(len(report.per_task())), str(report.samples), str(report.correct), f"{report.accuracy:.4f}")
    console.print(table)
    failures = [r for r in report.results if not r.score.success]
    if failures:
        detail = Table(title=f"failed tasks (first {min(len(failures), 20)} of {len(failures)})")
        detail.add_column("task")
        detail.add_column("first failed check")
        for result in failures[:20]:
            detail.add_row(result.name, result.score.reasons[0] if result.score.reasons else "")
        console.print(detail)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="coevolve", description=__doc__.split("\n")[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    _eval_parser(subparsers)
    _serve_parser(subparsers)
    _pool_parser(subparsers)
    _train_parser(subparsers)
    _report_parser(subparsers)
    _env_parser(subparsers)
    return parser


def _report_parser(subparsers) -> None:
    parser = subparsers.add_parser("report", help="write DIR/report.html from a run directory")
    parser.add_argument("directory", help="a run directory (what `coevolve train` wrote)")
    parser.set_defaults(handler=run_report)


def run_report(args: argparse.Namespace) -> int:
    from coevolve.report import write_report

    try:
        path = write_report(args.directory)
    except FileNotFoundError as error:
        raise UsageError(str(error)) from None
    print(path)
    return 0


def _train_parser(subparsers) -> None:
    parser = subparsers.add_parser("train", help="the CoEvolve loop (run.mode: zero-shot, static, synthetic, "
                                                 "random, coevolve)")
    parser.add_argument("--config", help="YAML config (see configs/); defaults apply to anything it leaves out")
    parser.add_argument("--output-dir", help="run directory (default: run.output_dir of the config)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in the output directory from its last checkpoint")
    parser.add_argument("--dry-run", action="store_true",
                        help="check the config (and, with --resume, that it may continue the run) and print it "
                             "resolved; load nothing, write nothing")
    parser.add_argument("--paper", action="store_true",
                        help="the paper's coevolve: every switch of coevolve.config.STEERING back to the paper's value "
                             "(guidance, the unexplored and state rare, the history sampler off); overrides still win")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value",
                        help="config overrides, e.g. grpo.learning_rate=2e-6 run.max_steps=40")
    parser.set_defaults(handler=run_train)


def _leave_process_group() -> None:
    """Under torchrun, leave the process group before the interpreter exits: with gloo's threads left to the exit
    handlers, a process now and then aborted after a finished run ("terminate called without an active
    exception", exit -6). No barrier first: a process whose peer died would wait on it forever."""
    torch = sys.modules.get("torch")  # a run that never imported torch (a refused config) has no group
    if torch is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def run_train(args: argparse.Namespace) -> int:
    from coevolve.config import ConfigError, paper_overrides
    from coevolve.loop import run
    from coevolve.policy.models import ModelError
    from coevolve.rollout import RolloutFailures
    from coevolve.train import TrainingError

    if not args.config and not args.resume:
        raise UsageError("--config FILE is required (e.g. configs/lite-static.yaml), unless --resume")
    overrides = [*paper_overrides(), *args.overrides] if args.paper else list(args.overrides)
    try:
        if args.dry_run:  # everything a run checks before it writes: the config, the env, D_0, the held-out set
            import yaml

            from coevolve.run_setup import (build_env, build_eval, check_heldout, env_check_warnings, load_tasks,
                                            resolve_config)

            config, _ = resolve_config(args.config, overrides, args.output_dir, args.resume)
            env = build_env(config)
            seed_tasks, (_, heldout) = load_tasks(config, env), build_eval(config, env)
            if config.run.mode != "zero-shot" and config.loop.d0 == "entries":
                check_heldout(config, seed_tasks, heldout)
            for line in env_check_warnings(env, seed_tasks):
                print(f"coevolve train: warning: {line}", file=sys.stderr)
            print(yaml.safe_dump(config.to_dict(), sort_keys=False), end="")
            return 0
        run(args.config, overrides, args.output_dir, args.resume)
    except (ConfigError, ModelError, TrainingError, RolloutFailures) as error:
        raise UsageError(str(error)) from None
    finally:
        _leave_process_group()
    return 0


def _serve_parser(subparsers) -> None:
    parser = subparsers.add_parser("serve", help="an OpenAI-compatible chat endpoint over a local model")
    parser.add_argument("--model", default="smollm2", help="model id or path (default: the shipped SmolLM2)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--device", default=MODEL.device)
    parser.add_argument("--dtype", default=MODEL.dtype, choices=DTYPES)
    parser.set_defaults(handler=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    import time

    import socket

    from coevolve.policy.backends import make_backend
    from coevolve.policy.models import ModelError, check_device
    from coevolve.policy.serve import ChatServer

    if not 0 < args.port < 65536:
        raise UsageError(f"--port {args.port} is not a port (1-65535)")
    try:
        check_device(args.device)
    except ModelError as error:
        raise UsageError(f"--device: {error}") from None
    try:  # the address is checked before the model loads, not after
        with socket.create_server((args.host, args.port)):
            pass
    except OSError as error:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {error.strerror or error}") from None
    try:
        backend = make_backend("transformers", args.model, device=args.device, dtype=args.dtype)
    except ModelError as error:
        raise UsageError(str(error)) from None
    server = ChatServer(backend, model_name=args.model, host=args.host, port=args.port).start()
    print(f"serving {args.model} at {server.base_url} (Ctrl-C to stop)", file=sys.stderr, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()
    return 0


def _env_parser(subparsers) -> None:
    parser = subparsers.add_parser("env", help="check your own tools: a class or an MCP server, and a task file")
    commands = parser.add_subparsers(dest="env_command", required=True)
    check = commands.add_parser("check", help="say in plain words what is wrong with your tools and their task file")
    check.add_argument("cls", metavar="package.module:ClassName | mcp:package.module:SERVER")
    check.add_argument("--tasks", required=True, help="the JSON-lines task file")
    check.add_argument("--state-call", action="append", default=[], metavar="CALL",
                       help="mcp: a read-only probe call (env.options.state_calls; repeat it)")
    check.set_defaults(handler=run_env_check)


def run_env_check(args: argparse.Namespace) -> int:
    from coevolve.envs.python_env import check_env

    if args.cls.startswith("mcp:"):
        from coevolve.envs.mcp_env import check_mcp_env

        problems = check_mcp_env(args.tasks, args.state_call, server=args.cls.removeprefix("mcp:"))
    else:
        if args.state_call:
            raise UsageError("--state-call is for MCP servers (mcp:package.module:SERVER): a class's state is read "
                             "whole")
        problems = check_env(args.cls.removeprefix("python:"), args.tasks)
    for problem in problems:
        print(problem)
    if not problems:
        print(f"{args.cls} with {args.tasks}: all well")
    return 1 if problems else 0


def _pool_parser(subparsers) -> None:
    from coevolve.pool_cli import add_pool_parser, run_pool

    add_pool_parser(subparsers).set_defaults(handler=run_pool)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except UsageError as error:
        print(f"coevolve {args.command}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as error:  # an env that cannot run here (AppWorld without its venv or data) says why
        from coevolve.envs.base import EnvUnavailable

        if not isinstance(error, EnvUnavailable):
            raise
        print(f"coevolve {args.command}: error: {error}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
