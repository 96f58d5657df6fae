"""The `coevolve` command line.

    coevolve eval --env bfcl --category multi_turn_base --policy oracle|replay:FILE [--json] [--limit N]
    coevolve eval --env bfcl-lite --split test --policy oracle
    coevolve pool DIR [--json] [--iteration T] [--source seed|synthetic]

Errors a user can cause (unknown category, missing or malformed replay file) print one line on stderr and exit 2.
Imports stay light: evaluating scripted policies never imports torch.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from typing import Sequence

EXIT_USAGE = 2


class UsageError(Exception):
    """A user error with a one-line message."""


def _eval_parser(subparsers) -> None:
    parser = subparsers.add_parser("eval", help="score a policy on an environment's tasks")
    parser.add_argument("--env", default="bfcl", help="environment name: bfcl (default) or bfcl-lite")
    parser.add_argument("--category", default=None,
                        help="bfcl: base (default), miss_func, miss_param, long_context (multi_turn_ prefix optional)")
    parser.add_argument("--split", default=None, help="bfcl-lite: train (default) or test")
    parser.add_argument("--policy", required=True, help="oracle | replay:FILE")
    parser.add_argument("--limit", type=int, default=None, help="evaluate only the first N tasks")
    parser.add_argument("--scope", default="official", choices=("official", "exposed"),
                        help="dispatch scope: official = every public method of the involved classes, as the "
                             "official BFCL executor (default); exposed = only the tools shown in the turn")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.set_defaults(handler=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    from coevolve.envs import ENVS, make_env
    from coevolve.evaluate import ReplayError, evaluate, load_replay, oracle_script

    if args.env not in ENVS:
        raise UsageError(f"unknown env {args.env!r}; known: {', '.join(ENVS.names())}")
    if args.limit is not None and args.limit < 1:
        raise UsageError("--limit must be at least 1")
    options = {name: value for name, value in (("category", args.category), ("split", args.split)) if value is not None}
    accepted = inspect.signature(ENVS.get(args.env)).parameters
    unknown = [f"--{name}" for name in options if name not in accepted]
    if unknown:
        raise UsageError(f"env {args.env!r} does not take {', '.join(unknown)}")
    try:
        env = make_env(args.env, scope=args.scope, **options)
    except ValueError as error:
        raise UsageError(str(error)) from None
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
        raise UsageError(f"unknown policy {args.policy!r}; use oracle or replay:FILE")
    report = evaluate(env, tasks, script_for, args.policy, getattr(env, "category", ""))
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        _print_report(report)
    return 0


def _print_report(report) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"[bold]{report.env}[/bold] {report.category}, policy [bold]{report.policy}[/bold]")
    table = Table()
    for column in ("tasks", "correct", "accuracy"):
        table.add_column(column, justify="right")
    table.add_row(str(report.n), str(report.correct), f"{report.accuracy:.4f}")
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
    _pool_parser(subparsers)
    return parser


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


if __name__ == "__main__":
    sys.exit(main())
