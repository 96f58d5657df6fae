"""Training rewards: call matching by hand-computed numbers, and the graded reward's ordering."""

from __future__ import annotations

import pytest

from coevolve.config import ConfigError, load_config
from coevolve.records import Step, Task, ToolCall, Trajectory
from coevolve.reward import call_match, call_similarity, training_reward, truth_calls, turn_match


def call(name: str, **arguments) -> ToolCall:
    return ToolCall(name, arguments)


def trajectory(calls_by_turn: list[list[ToolCall]], score: float = 0.0) -> Trajectory:
    steps = tuple(Step(turn_index=turn, reply_index=0, action=c.to_python(), call=c, observation="")
                  for turn, calls in enumerate(calls_by_turn) for c in calls)
    return Trajectory(id="t-0", task_id="x", iteration=0, sample_index=0, steps=steps, score=score)


def task(*turns: list[str]) -> Task:
    return Task.create(env="bfcl-lite", name="t", turns=[[{"role": "user", "content": "q"}] for _ in turns],
                       initial_state={}, ground_truth=[list(turn) for turn in turns])


def test_call_similarity_by_hand():
    assert call_similarity(call("cd", folder="a"), call("ls")) == 0.0
    assert call_similarity(call("ls"), call("ls")) == 1.0
    assert call_similarity(call("cd", folder="a"), call("cd", folder="a")) == 1.0
    assert call_similarity(call("cd", folder="b"), call("cd", folder="a")) == 0.0  # the name alone earns nothing
    assert call_similarity(call("cat", folder="x"), call("cat", file_name="x")) == 0.0  # right value, wrong key
    # keys {source, destination, extra}: one equal of three -> 1/3
    assert call_similarity(call("mv", source="x", destination="z", extra=1),
                           call("mv", source="x", destination="y")) == pytest.approx(1 / 3)
    # positional arguments count as keys "#0", ...: ("a",) vs folder="a" share nothing
    assert call_similarity(ToolCall("cd", {}, ("a",)), call("cd", folder="a")) == 0.0


def test_turn_match_counts_missing_and_extra_calls():
    truth = [call("cd", folder="a"), call("ls")]
    assert turn_match(truth, truth) == 1.0
    assert turn_match([call("ls")], truth) == 0.5                       # one of two, exactly
    assert turn_match([call("ls"), call("cd", folder="a")], truth) == 1.0   # order does not matter
    assert turn_match([call("cd", folder="b"), call("ls"), call("pwd")], truth) == pytest.approx(1 / 3)
    assert turn_match([], truth) == 0.0
    assert turn_match([call("pwd")], []) == 0.0 and turn_match([], []) == 1.0
    # one agent call cannot answer two truth calls
    assert turn_match([call("ls")], [call("ls"), call("ls")]) == 0.5


def test_call_match_averages_turns_with_truth_calls():
    truth = [[call("cd", folder="a")], [], [call("ls")]]
    agent = trajectory([[call("cd", folder="a")], [call("pwd")], []])
    assert call_match(agent, truth) == 0.5  # turn 0: 1, turn 2: 0; turn 1 has no truth calls and is not scored


def test_graded_reward_keeps_solving_first():
    gold = task(["cd(folder='a')", "ls()"])
    assert [c.name for c in truth_calls(gold)[0]] == ["cd", "ls"]
    solved = trajectory([[call("cd", folder="a"), call("ls")]], score=1.0)
    close = trajectory([[call("cd", folder="a")]])
    wrong_argument = trajectory([[call("cd", folder="b")]])
    nothing = trajectory([[]])
    rewards = [training_reward(t, gold, "graded", 0.5) for t in (solved, close, wrong_argument, nothing)]
    assert rewards == [1.0, 0.25, 0.0, 0.0]
    assert [training_reward(t, gold, "env") for t in (solved, close)] == [1.0, 0.0]
    with pytest.raises(ValueError):
        training_reward(solved, gold, "dense")


def test_config_checks_the_reward():
    assert load_config(None, ["grpo.reward=graded"]).grpo.reward == "graded"
    with pytest.raises(ConfigError, match="grpo.reward"):
        load_config(None, ["grpo.reward=dense"])
    with pytest.raises(ConfigError, match="grpo.partial_credit"):
        load_config(None, ["grpo.partial_credit=1.0"])
