"""Our BFCL scorer against bfcl-eval's own `multi_turn_checker`, entry by entry.

For every entry of the four multi-turn categories we build the ground-truth script and several perturbations of
it (drop a call, empty a turn, swap calls, alter an argument, duplicate a call, move a call across a turn
boundary, split a reply in two) and require our per-entry verdict to equal the official checker's on every one.
The official checker is run with a fresh model name per call and its module-global instance cache is cleared
afterwards, so no official run sees another's state.
"""

from __future__ import annotations

import itertools
import random

import pytest

from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker as official_checker
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils as official_utils

from coevolve.calls import parse_python_call
from coevolve.envs.bfcl import CATEGORIES, BFCLEnv, load_tasks
from coevolve.evaluate import oracle_script, run_script
from coevolve.records import Task, ToolCall

_run_counter = itertools.count()


def official_verdict(task: Task, script: list[list[list[str]]]) -> bool:
    """bfcl-eval's verdict for a decoded script (turns -> replies -> call strings)."""
    model_name = f"coevolve_cmp_{next(_run_counter)}"
    entry = {"id": task.name, "initial_config": task.initial_state, "involved_classes": task.meta["involved_classes"]}
    if len(script) != task.num_turns:  # eval_runner's force_terminated rule, applied before the checker
        return False
    try:
        result = official_checker.multi_turn_checker(
            [[list(reply) for reply in turn] for turn in script],
            [list(turn) for turn in task.ground_truth],
            entry,
            task.meta["category"],
            model_name,
        )
    finally:
        module_globals = vars(official_utils)
        for key in [key for key in module_globals if key.startswith(model_name)]:
            del module_globals[key]
    return bool(result["valid"])


def _flat(script):
    return [(t, r, c) for t, turn in enumerate(script) for r, reply in enumerate(turn) for c in range(len(reply))]


def _copy(script):
    return [[list(reply) for reply in turn] for turn in script]


def _clean(script):
    return [[reply for reply in turn if reply] for turn in script]


def _alter(call_text: str, rng: random.Random) -> str:
    call = parse_python_call(call_text)
    assert isinstance(call, ToolCall), call_text
    if not call.arguments and not call.positional:
        return call_text
    arguments = dict(call.arguments)
    positional = list(call.positional)
    slots = [("kw", key) for key in arguments] + [("pos", i) for i in range(len(positional))]
    kind, slot = rng.choice(slots)
    value = arguments[slot] if kind == "kw" else positional[slot]
    if isinstance(value, bool):
        value = not value
    elif isinstance(value, int):
        value = value + 1
    elif isinstance(value, float):
        value = value * 2 + 1
    elif isinstance(value, str):
        value = value + "_x"
    elif isinstance(value, list):
        value = value[:-1] if value else ["x"]
    else:
        value = "x"
    if kind == "kw":
        arguments[slot] = value
    else:
        positional[slot] = value
    return ToolCall(call.name, arguments, tuple(positional)).to_python()


def perturb(script, kind: str, rng: random.Random):
    script = _copy(script)
    calls = _flat(script)
    if not calls:
        return None
    t, r, c = rng.choice(calls)
    if kind == "drop":
        del script[t][r][c]
    elif kind == "empty_turn":
        script[t] = []
    elif kind == "swap":
        reply = script[t][r]
        if len(reply) < 2:
            return None
        i, j = rng.sample(range(len(reply)), 2)
        reply[i], reply[j] = reply[j], reply[i]
    elif kind == "alter":
        altered = _alter(script[t][r][c], rng)
        if altered == script[t][r][c]:
            return None
        script[t][r][c] = altered
    elif kind == "duplicate":
        script[t][r].insert(c, script[t][r][c])
    elif kind == "move_to_next_turn":
        if t + 1 >= len(script):
            return None
        call = script[t][r].pop(c)
        script[t + 1] = [[call]] + script[t + 1]
    elif kind == "split_reply":
        reply = script[t][r]
        if len(reply) < 2:
            return None
        cut = rng.randrange(1, len(reply))
        script[t][r:r + 1] = [reply[:cut], reply[cut:]]
    return _clean(script)


PERTURBATIONS = ("drop", "empty_turn", "swap", "alter", "duplicate", "move_to_next_turn", "split_reply")


@pytest.mark.parametrize("category", CATEGORIES)
def test_verdicts_equal_official_checker(category):
    rng = random.Random(f"official-{category}")
    env = BFCLEnv(category, scope="official")
    compared = {True: 0, False: 0}
    mismatches = []
    for task in load_tasks(category):
        scripts = [("oracle", oracle_script(task))]
        for kind in rng.sample(PERTURBATIONS, 4):
            perturbed = perturb(oracle_script(task), kind, rng)
            if perturbed is not None:
                scripts.append((kind, perturbed))
        for kind, script in scripts:
            ours = run_script(env, task, script).success
            theirs = official_verdict(task, script)
            compared[theirs] += 1
            if ours != theirs:
                mismatches.append((task.name, kind, ours, theirs))
    assert not mismatches, mismatches[:10]
    # The comparison means something only if the perturbations produce both verdicts, many times each.
    assert compared[True] >= 200 and compared[False] >= 300, compared


def test_exposed_scope_agrees_where_no_hidden_function_is_called():
    """The training scope refuses only functions not shown in the turn; elsewhere it scores as the checker."""
    rng = random.Random("exposed")
    env = BFCLEnv("multi_turn_miss_func", scope="exposed")
    compared = 0
    for task in load_tasks("multi_turn_miss_func")[:120]:
        for kind in ("drop", "move_to_next_turn", "alter"):
            script = perturb(oracle_script(task), kind, rng) or oracle_script(task)
            episode = env.reset(task)
            for replies in script:
                for calls in replies:
                    episode.act(calls)
                episode.end_turn()
            if any(step.error and "not available in this turn" in step.error for step in episode.steps):
                continue
            assert episode.score().success == official_verdict(task, script), (task.name, kind)
            compared += 1
    assert compared > 250
