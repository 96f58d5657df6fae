"""Training rewards: the env's score (the paper's), or a graded score with partial credit for matching calls.

The paper trains on the env's verdict: BFCL's state and response checks give 1 or 0 per trajectory. GRPO learns
only from groups whose K rewards differ, and a small model on BFCL-lite fails most tasks in every sample (the
quickstart's SmolLM2-135M at T=0.5: 17 of 24 held-out tasks 0 of 8 samples right, BENCHMARKS.md): most groups
carry no signal. `graded` (an option, not the paper's objective) keeps a solved trajectory at 1 and gives an
unsolved one `partial_credit x call_match(...)` < 1, so a sample that makes some of the right calls, or the right
call with some of its arguments right, ranks above one that does not. Fine-grained tool-call rewards of this kind
are what ToolRL (Qian et al., 2025) found to help small models; the held-out metric stays the env's binary success.

call_match, per user turn, then averaged over the turns that have ground-truth calls:

    match(a, t)  = 0                                         if a.name != t.name
                 = |{k : a[k] == t[k]}| / |keys(a) u keys(t)|     otherwise (1 when both are empty)
    turn score   = sum over truth calls t (in order) of the best match among the agent's calls not yet used
                   / max(#agent calls, #truth calls)

Dividing by the larger count means extra calls cost credit as missing ones do. The tool's name alone earns nothing
(measured: with 1/2 for the name, GRPO reinforced right-name calls with wrong argument keys, and SmolLM2 moved to
`folder=` for every tool, `cat(folder=...)` included: 15 of 16 calls at step 8, held-out success 0.275 -> 0.025
after 8 static steps). Positional arguments count as keys "#0", "#1", ... Values compare by equality (the parsed
literals). Pure functions, tested by hand.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from coevolve.calls import parse_python_call
from coevolve.records import Task, ToolCall, Trajectory

REWARDS = ("env", "graded")


def _arguments(call: ToolCall) -> dict[str, Any]:
    values: dict[str, Any] = {f"#{index}": value for index, value in enumerate(call.positional)}
    values.update(call.arguments)
    return values


def call_similarity(agent: ToolCall, truth: ToolCall) -> float:
    """match(a, t) of the module docstring: 0 for another tool, else the share of equal arguments."""
    if agent.name != truth.name:
        return 0.0
    mine, theirs = _arguments(agent), _arguments(truth)
    keys = set(mine) | set(theirs)
    if not keys:
        return 1.0
    equal = sum(1 for key in keys if key in mine and key in theirs and mine[key] == theirs[key])
    return equal / len(keys)


def turn_match(agent_calls: Sequence[ToolCall], truth_calls: Sequence[ToolCall]) -> float:
    """One turn's score: truth calls matched in order to the best unused agent call, over the larger count."""
    if not truth_calls:
        return 1.0 if not agent_calls else 0.0
    unused = list(range(len(agent_calls)))
    total = 0.0
    for truth in truth_calls:
        if not unused:
            break
        best = max(unused, key=lambda index: call_similarity(agent_calls[index], truth))
        similarity = call_similarity(agent_calls[best], truth)
        if similarity > 0:
            total += similarity
            unused.remove(best)
    return total / max(len(agent_calls), len(truth_calls))


def truth_calls(task: Task) -> list[list[ToolCall]]:
    """The task's ground truth per turn, parsed (a call that does not parse is left out: it cannot be matched)."""
    turns = []
    for turn in task.ground_truth:
        parsed = [parse_python_call(text) for text in turn]
        turns.append([call for call in parsed if isinstance(call, ToolCall)])
    return turns


def call_match(trajectory: Trajectory, truth: Sequence[Sequence[ToolCall]]) -> float:
    """call_match of the module docstring: the mean turn score over the turns with ground-truth calls."""
    by_turn: Mapping[int, list[ToolCall]] = {}
    for step in trajectory.steps:
        if step.call is not None:
            by_turn.setdefault(step.turn_index, []).append(step.call)  # type: ignore[attr-defined]
    scored = [turn_match(by_turn.get(index, []), calls) for index, calls in enumerate(truth) if calls]
    return sum(scored) / len(scored) if scored else 0.0


def training_reward(trajectory: Trajectory, task: Task, reward: str = "env", partial_credit: float = 0.5) -> float:
    """What GRPO maximises for one trajectory: the env score (`env`), or with `graded` the env score when the task
    is solved and `partial_credit` x call_match otherwise."""
    if reward not in REWARDS:
        raise ValueError(f"unknown reward {reward!r}; expected one of {REWARDS}")
    if reward == "env" or trajectory.score >= 1.0:
        return float(trajectory.score)
    return partial_credit * call_match(trajectory, truth_calls(task))


# The reward functions handed to TRL's GRPOTrainer (`coevolve.train.grpo.build_trainer`): they read what our
# rollout function returned per trajectory, so they take TRL's keyword arguments and ignore the rest.


def env_score_reward(prompts: Sequence[Any], completions: Sequence[Any], env_score: Sequence[float],
                     **_: Any) -> list[float]:
    """The reward: the env's score of each trajectory (BFCL's binary state/response checks)."""
    return [float(score) for score in env_score]


def graded_reward(prompts: Sequence[Any], completions: Sequence[Any], train_reward: Sequence[float],
                  **_: Any) -> list[float]:
    """`grpo.reward: graded`: the env score when solved, else partial credit for matching calls (`coevolve.reward`)."""
    return [float(value) for value in train_reward]
