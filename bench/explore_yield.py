"""Exploration yield on the two-call shift: which tasks does the offline explorer admit from D_0's contexts?

Question: on `configs/lite-shift.yaml` every held-out two-call task is `cd` into a folder, then an action there,
and D_0 holds one-call tasks only. The replication (BENCHMARKS.md "replicate-teach") found that coevolve and random
admit plenty of multi-call tasks but hardly any that start with `cd`. Where is that lost: in the explorer's choice
of tool, in its arguments, or in abstraction and validation? And would a signal that pointed at `cd` be enough?

Setup: no model and no training: the synthesis phase of the loop (offline explorer -> template abstractor ->
validation against D_0) run once on contexts built from D_0's own tasks, with the config's exploration settings
(step budget, odds). Three kinds of context, one per D_0 task (or a sample of `--contexts` of them):
- `signal`: the context a boundary event on that task gets when no rollout split (`explore.build_context`): the
  task's ground-truth tools as focus tools, its arguments as focus values — what coevolve explores from;
- `random`: no signal, no focus (the paper's random-exploration ablation; `explore.random_contexts`);
- `focus cd`: the task's context with `cd` as its only focus tool — what a signal naming the first call of the
  missing order could at best give a tool-level explorer;
- `unexplored order`: the rare context of an order no rollout made (`signals.unexplored_orders`), the orders of a
  policy that never makes two calls (every ordered pair of two exposed tools) dealt to the tasks in turn.
Each kind is run with the shipped explorer and with the `coevolve wide` diagnosis arm's settings (focus weight
0.3, two episodes per context); the order contexts with the shipped explorer and with `focus_retries: 8`, as the
`coevolve + unexplored orders` arm of bench/replicate.py runs them. Counted: the explorer's `cd` calls (ran /
failed, and why the failures failed), the call after a `cd` that ran, the admitted tasks, those of two or more
calls, and those of two or more calls that start with `cd` (the shape of the held-out part), with their share of
all admitted tasks.
Usage: `python bench/explore_yield.py [--config configs/lite-shift.yaml] [--contexts 0 (all)] [--no-write]`.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench._report import machine_line, write_section  # noqa: E402

KINDS = ("signal", "random", "focus cd", "unexplored order")
FIRST_CALL = "cd"
"""The first call of every held-out two-call task in this setting."""


def contexts_of(kind: str, tasks: list, env, iteration: int = 1) -> list:
    from coevolve.explore import build_context
    from coevolve.records import ExplorationContext, SignalEvent
    from coevolve.run_setup import exposed_tools
    from coevolve.signals import unexplored_orders

    # The unexplored orders of a policy that never made two calls: every ordered pair of two exposed tools.
    orders = [pattern for pattern, _ in unexplored_orders(exposed_tools(env, tasks[:1]), (), iteration)]
    contexts = []
    for index, task in enumerate(tasks):
        if kind == "random":
            contexts.append(ExplorationContext(id=f"random-{task.id}-n{index}", task_id=task.id, signal=None,
                                               iteration=iteration))
            continue
        if kind == "unexplored order":  # each task in turn gets the next of the orders no rollout made
            pattern = orders[index % len(orders)]
            contexts.append(build_context(SignalEvent("rare", task.id, iteration, (), {
                "unexplored": pattern, "frequencies": {pattern: 0.0}}), task, {}))
            continue
        context = build_context(SignalEvent("boundary", task.id, iteration, (), {"scores": []}), task, {})
        if kind == "focus cd":
            context = replace(context, id=f"focus-cd-{task.id}", focus_tools=(FIRST_CALL,), focus_values=())
        contexts.append(context)
    return contexts


def order_counts(contexts: list) -> dict:
    """How many orders the contexts name, over how many tools, and how many of them `cd` leads."""
    from coevolve.signals import PATTERN_SEPARATOR

    orders = {context.focus_tool for context in contexts if context.focus_tool}
    tools = {tool for order in orders for tool in order.split(PATTERN_SEPARATOR)}
    return {"orders": len(orders), "tools": len(tools),
            "cd_orders": sum(1 for order in orders if order.split(PATTERN_SEPARATOR)[0] == FIRST_CALL)}


def solution_tools(task) -> tuple[str, ...]:
    from coevolve.records import call_name

    return tuple(call_name(text) or "?" for turn in task.ground_truth for text in turn)


def measure(env, tasks: dict, contexts: list, explore_config, synthesis) -> dict:
    from coevolve.envs.base import step_failure
    from coevolve.explore import OfflineExplorer
    from coevolve.synthesis import build_abstractor, synthesis_phase
    from coevolve.validate import Validator

    validator = Validator(env, synthesis.validation(), known=list(tasks.values()))
    result = synthesis_phase(env, contexts, tasks, OfflineExplorer(explore_config), build_abstractor(synthesis),
                             validator, iteration=1, seed=0)
    calls = [step for episode in result.episodes for step in episode.steps
             if step.call is not None and step.call.name == FIRST_CALL]
    failures = Counter(_failure_kind(step, tasks[episode.task_id]) for episode in result.episodes
                       for step in episode.steps if step.call is not None and step.call.name == FIRST_CALL
                       and step_failure(step) is not None)
    after = Counter()  # the call an episode makes next after a `cd` that ran
    for episode in result.episodes:
        for step, following in zip(episode.steps, episode.steps[1:]):
            if step.call is not None and step.call.name == FIRST_CALL and step_failure(step) is None:
                after[following.call.name if following.call is not None else "?"] += 1
    shapes = [solution_tools(task) for task in result.admitted]
    multi = [shape for shape in shapes if len(shape) >= 2]
    led = [shape for shape in multi if shape[0] == FIRST_CALL]
    return {"contexts": len(contexts), "episodes": len(result.episodes),
            "steps": sum(len(e.steps) for e in result.episodes), "cd_calls": len(calls),
            "cd_ran": len(calls) - sum(failures.values()), "cd_failures": dict(failures.most_common()),
            "after_cd": dict(after.most_common()),
            "admitted": len(shapes), "multi": len(multi), "cd_led": len(led),
            "order_free": result.rejected_by_code().get("order_free", 0),
            "cd_led_actions": dict(Counter(shape[1] for shape in led).most_common())}


def _failure_kind(step, task) -> str:
    """What a failed `cd` was given: a folder of the start (so the explorer stood elsewhere, e.g. inside it already),
    a file's name, or a name the start does not hold at all."""
    folders, files = set(), set()

    def walk(node) -> None:  # BFCL's file system: name -> {"type": "directory" | "file", "contents": ...}
        for name, item in node.items():
            if isinstance(item, dict) and item.get("type") == "directory":
                folders.add(name)
                walk(item.get("contents") or {})
            elif isinstance(item, dict) and item.get("type") == "file":
                files.add(name)
            elif isinstance(item, dict):
                walk(item)

    walk(task.initial_state)
    name = next(iter([*step.call.arguments.values(), *step.call.positional]), None)
    if name in folders:
        return "a folder, from elsewhere"
    return "a file" if name in files else "no such name"


def heldout_shapes(config) -> Counter:
    from coevolve.config import load_config
    from coevolve.run_setup import build_env

    held = build_env(load_config(config, ["env.split=test"]))
    return Counter(" > ".join(solution_tools(task)) if len(solution_tools(task)) > 1 else "one call"
                   for task in held.tasks())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/lite-shift.yaml")
    parser.add_argument("--contexts", type=int, default=0, help="D_0 tasks to start from (0: all of them)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    from coevolve.config import load_config
    from coevolve.run_setup import build_env

    config = load_config(args.config, [])
    env = build_env(config)
    seed_tasks = sorted(env.tasks(), key=lambda task: task.id)
    tasks = {task.id: task for task in seed_tasks}
    chosen = random.Random(0).sample(seed_tasks, args.contexts) if 0 < args.contexts < len(seed_tasks) else seed_tasks
    shipped = config.synthesis.exploration()
    explorers = {"shipped": shipped, "wide": replace(shipped, focus_weight=0.3, episodes_per_context=2)}
    started = time.perf_counter()
    rows = []
    for kind in KINDS:
        contexts = contexts_of(kind, chosen, env)
        # An order's contexts are run as the `coevolve + unexplored orders` arm runs them (focus_retries 8).
        variants = ({"shipped": shipped, "retries 8": replace(shipped, focus_retries=8)} if kind == "unexplored order"
                    else explorers)
        for label, explore_config in variants.items():
            if kind == "random" and label == "wide":
                explore_config = replace(explore_config, focus_weight=shipped.focus_weight)  # no focus: same draws
            row = {"kind": kind, "explorer": label, **measure(env, tasks, contexts, explore_config, config.synthesis),
                   **order_counts(contexts)}
            rows.append(row)
            print(row, flush=True)
    held = heldout_shapes(args.config)
    seconds = time.perf_counter() - started
    if not args.no_write:
        write_section("explore-yield", render(rows, held, shipped, args, len(chosen), seconds,
                                              synthesized_groups(config)))


def synthesized_groups(config) -> float:
    """About how many GRPO groups of a run are synthesized tasks: every iteration after the first draws its tasks,
    a `recur_fraction` of them recurring, a `synthetic_fraction` of the rest synthesized."""
    loop, grpo = config.loop, config.grpo
    later_tasks = max(0, config.run.max_steps - loop.steps_per_iteration) * grpo.prompts_per_step
    return later_tasks * (1 - (loop.recur_fraction or 0.0)) * (loop.synthetic_fraction or 0.0)


def render(rows: list[dict], held: Counter, shipped, args, starts: int, seconds: float, groups: float) -> str:
    def share(part: int, whole: int) -> str:
        return f"{part / whole:.1%}" if whole else "-"

    lines = [
        "## Exploration yield on the two-call shift (`bench/explore_yield.py`)",
        "",
        "Question: the held-out two-call tasks all start with `cd` (held-out shapes: "
        + ", ".join(f"{name}: {count}" for name, count in sorted(held.items())) + "). How many tasks of that "
        "shape does the offline explorer admit from D_0's contexts, and where are the others lost?",
        "",
        f"Setup: `{args.config}`, {starts} D_0 tasks as starting points, one context each; explorer "
        f"`step_budget={shipped.step_budget}`, shipped `focus_weight={shipped.focus_weight}`, 1 episode per "
        "context; `wide` = focus weight 0.3, 2 episodes (random has no focus, so only the episode count changes); "
        "template abstractor; validation against D_0. No model is involved: this is the synthesis phase alone. "
        f"{seconds:.0f} s in all. {machine_line()}",
        "",
        "| contexts | explorer | episodes | `cd` calls (ran / all) | why the others failed | admitted | "
        "next call after a `cd` that ran | of 2+ calls | of 2+ calls led by `cd` | share of admitted | their second "
        "call |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        failures = ", ".join(f"{reason} {count}" for reason, count in row["cd_failures"].items()) or "-"
        after = ", ".join(f"{name} {count}" for name, count in row["after_cd"].items()) or "-"
        actions = ", ".join(f"{name} {count}" for name, count in row["cd_led_actions"].items()) or "-"
        lines.append(f"| {row['kind']} | {row['explorer']} | {row['episodes']} | {row['cd_ran']} / {row['cd_calls']} "
                     f"| {failures} | {row['admitted']} | {after} | {row['multi']} | {row['cd_led']} | "
                     f"{share(row['cd_led'], row['admitted'])} | {actions} |")
    signal = next(row for row in rows if row["kind"] == "signal" and row["explorer"] == "shipped")
    focused = next(row for row in rows if row["kind"] == "focus cd" and row["explorer"] == "shipped")
    orders = next(row for row in rows if row["kind"] == "unexplored order" and row["explorer"] == "retries 8")
    lines += [
        "",
        f"Reading: from coevolve's contexts the explorer calls `cd` in {signal['cd_calls']} of "
        f"{signal['steps']} steps and {signal['cd_calls'] - signal['cd_ran']} of those fail; "
        f"{share(signal['cd_led'], signal['admitted'])} of what it admits has the held-out part's shape. Even with "
        f"`cd` as the only focus tool ({focused['cd_ran']} of {focused['cd_calls']} `cd` calls run) that share is "
        f"{share(focused['cd_led'], focused['admitted'])}: most `cd` calls name a file, a name the start does not "
        "hold, or a folder while the explorer stands inside another, and the call after a `cd` that ran is "
        f"`cd` again in {focused['after_cd'].get(FIRST_CALL, 0)} of {sum(focused['after_cd'].values())} cases "
        f"there. `cd > cat` and `cd > rm` ({held['cd > cat'] + held['cd > rm']} of the held-out part) need a file "
        "of the folder entered, which the explorer's values (the last observation, the evidence, the start's "
        f"names) seldom give. A replication run trains about {groups:.0f} groups on synthesized tasks "
        "(`run.max_steps`, `loop.recur_fraction` and `loop.synthetic_fraction` of the config, from the second "
        f"iteration on), so at {share(signal['cd_led'], signal['admitted'])} about "
        f"{groups * signal['cd_led'] / max(1, signal['admitted']):.1f} of them would have the held-out part's shape "
        "if the draw were uniform over what is admitted. What D_0 lacks here is an order (`cd`, then an action), "
        "and neither the signals, which flag tools and the patterns the policy produced, nor a random walk over "
        "tools produce that order at a useful rate.",
        "",
        f"An order's context (`signals.unexplored_orders`) makes its two calls in turn: with `focus_retries: 8`, "
        f"{share(orders['cd_led'], orders['admitted'])} of what it admits is led by `cd` ({orders['cd_led']} of "
        f"{orders['admitted']}; validation refused {orders['order_free']} candidates whose last call needs no "
        f"order, `order_free`), against {share(signal['cd_led'], signal['admitted'])} from coevolve's contexts. "
        f"The orders are many ({orders['orders']} for {orders['tools']} tools, {orders['cd_orders']} of them led by "
        f"`cd`), a context yields {orders['admitted'] / max(1, orders['contexts']):.2f} tasks, and a run explores "
        "a few an iteration (`synthesis.max_contexts`, the kinds taking turns), so a run admits a handful beside "
        "the ~150 tasks the other contexts give: the replication's arm (`coevolve + unexplored orders`) weighs them "
        "30 in the draw so that they fill about half of the synthetic slots. Whether that is enough for the "
        "learner is the replication's question, not this one's.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
