"""The cost of safe dispatch for your own tools: env steps/s through `PythonEnv` vs calling the bound methods.

Question: `coevolve.envs.python_env` parses every call with `ast` (never evaluated), checks the name against the
class's tools, binds the arguments to the signature, copies them, catches what the method raises and turns the
result into an observation. What does that cost next to calling the same methods directly?

Method: the example shop's (`examples/shop`) ground-truth call sequences, every task, repeated `--rounds` times,
in one process. Baseline: a fresh `Shop()` per task, `reset(**task.reset)`, then the same calls as bound-method
calls with the same arguments (already parsed). Ours: `env.reset(task)` and `episode.act([call text])` per call.
Both include the per-task instance and reset. Figures: calls per second and the ratio.

Usage: `python bench/python_env.py [--rounds 200] [--no-write]`; writes the `python_env` section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import ast
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench._report import machine_line, write_section  # noqa: E402


def direct_plan(tasks):
    """Each task's calls as (method name, keyword arguments), parsed once, outside the timed loop."""
    plan = []
    for task in tasks:
        calls = []
        for turn in task.ground_truth:
            for text in turn:
                node = ast.parse(text, mode="eval").body
                calls.append((node.func.id, {k.arg: ast.literal_eval(k.value) for k in node.keywords}))
        plan.append((dict(task.initial_state), calls))
    return plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    from coevolve.envs.python_env import PythonEnv
    from examples.shop.shop import Shop

    env = PythonEnv(Shop, tasks=str(REPO / "examples" / "shop" / "tasks.jsonl"))
    tasks = env.tasks()
    plan = direct_plan(tasks)
    calls = sum(len(steps) for _, steps in plan) * args.rounds

    started = time.perf_counter()
    for _ in range(args.rounds):
        for reset, steps in plan:
            shop = Shop()
            shop.reset(**reset)
            for name, keywords in steps:
                try:
                    getattr(shop, name)(**keywords)
                except ValueError:
                    pass
    direct = time.perf_counter() - started

    started = time.perf_counter()
    for _ in range(args.rounds):
        for task in tasks:
            episode = env.reset(task)
            for turn in task.ground_truth:
                for text in turn:
                    episode.act([text])
    ours = time.perf_counter() - started
    lines = ["## Your own tools: safe dispatch vs calling the methods (`bench/python_env.py`)", "",
             f"Command: `python bench/python_env.py --rounds {args.rounds}` ({machine_line()}): the shop example's "
             f"{len(tasks)} ground-truth sequences x {args.rounds}, {calls} calls, a fresh instance and reset per task.",
             "", "| path | seconds | calls/s | time ratio |", "|---|---|---|---|",
             f"| bound methods, arguments parsed beforehand (baseline) | {direct:.3f} | {calls / direct:,.0f} | 1.00 |",
             f"| `PythonEnv` episodes: parse, check, bind, copy, catch, observe | {ours:.3f} | {calls / ours:,.0f} | "
             f"{ours / direct:.2f} |", "",
             "The safe path costs microseconds a call: nothing next to a model's reply (milliseconds to seconds)."]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section("python_env", text)


if __name__ == "__main__":
    main()
