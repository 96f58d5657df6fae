"""The env contract (`coevolve.envs.base.Env` and `Episode`): every shipped env implements it, a minimal env that
writes only what it must gets the documented defaults and runs through validation, and no module finds an env's
or an episode's capability by name."""

from __future__ import annotations

import re
from pathlib import Path

from coevolve.envs.appworld import AppWorldEnv, AppWorldEpisode
from coevolve.envs.appworld_process import WorkerFailed
from coevolve.envs.base import ENV_FAILURE, Env, EnvFailed, Episode, ToolEpisode
from coevolve.envs.bfcl import BFCLEnv, BFCLEpisode
from coevolve.envs.bfcl_lite import BFCLLiteEnv
from coevolve.envs.mcp_bridge import SessionLost
from coevolve.envs.mcp_env import MCPEnv, MCPEpisode
from coevolve.envs.python_env import PythonEnv, PythonEpisode
from coevolve.envs.python_worker import WorkerLost
from coevolve.records import Candidate, Check, Score, Step, Task, ToolCall
from coevolve.states import ARGUMENT_STATES, DIRECTORY_STATES
from coevolve.validate import Validator

ROOT = Path(__file__).resolve().parent.parent


def test_every_shipped_env_and_episode_implements_the_contract():
    for env in (BFCLEnv, BFCLLiteEnv, PythonEnv, MCPEnv, AppWorldEnv):
        assert issubclass(env, Env), env
    for episode in (BFCLEpisode, AppWorldEpisode, PythonEpisode, MCPEpisode, ToolEpisode):
        assert issubclass(episode, Episode), episode
    for failure in (SessionLost, WorkerLost, WorkerFailed):  # one type for "the env itself failed"
        assert issubclass(failure, EnvFailed), failure
    assert BFCLEnv.states is DIRECTORY_STATES and PythonEnv.states is ARGUMENT_STATES
    assert not AppWorldEnv.plain_arguments and AppWorldEnv.empty_observations == ("Execution successful.",)
    lite = BFCLLiteEnv("train")
    assert (lite.category, lite.split, lite.with_split("test"), lite.max_sessions) == ("lite/train", "train", None, None)
    # The tools a run checks at its start are declared, not guessed from the env's name.
    assert [env.user_tools for env in (BFCLEnv, BFCLLiteEnv, AppWorldEnv, PythonEnv, MCPEnv)] == [
        False, False, False, True, True]


class Counter(Env):
    """The least an env writes: a name, its tasks and a reset."""

    name = "counter"

    def tasks(self) -> list[Task]:
        return [Task.create("counter", "count-to-2", [[{"role": "user", "content": "Add 2."}]], {"value": 0},
                            [["add(amount=2)"]], {})]

    def reset(self, task: Task) -> "CounterEpisode":
        return CounterEpisode(task)


class CounterEpisode(Episode):
    def __init__(self, task: Task) -> None:
        self.task, self.value, self.turn = task, dict(task.initial_state)["value"], 0

    @property
    def turn_index(self) -> int:
        return self.turn

    @property
    def done(self) -> bool:
        return self.turn >= 1

    def user_messages(self):
        return list(self.task.turns[0])

    def tools(self):
        return [{"name": "add", "description": "Add an amount.",
                 "parameters": {"type": "object", "properties": {"amount": {"type": "integer"}},
                                "required": ["amount"]}}]

    def act(self, calls):
        steps = []
        for call in calls:
            parsed = call if isinstance(call, ToolCall) else ToolCall("add", {"amount": int(str(call).split("=")[1][:-1])})
            self.value += int(parsed.arguments["amount"])
            steps.append(Step(0, 0, parsed.to_python(), parsed, str(self.value)))
        return tuple(steps)

    def end_turn(self) -> None:
        self.turn += 1

    def score(self) -> Score:  # the state the ground truth leaves, from the same start
        target = dict(self.task.initial_state)["value"] + sum(
            int(call.split("=")[1][:-1]) for turn in self.task.ground_truth for call in turn)
        return Score(1.0 if self.value == target else 0.0, (Check(0, "state", self.value == target, ""),))

    def state(self):
        return {"value": self.value}


def test_a_minimal_env_gets_the_defaults_and_its_candidates_validate():
    env = Counter()
    assert (env.category, env.split, env.with_split("train"), env.metrics({"a": 1.0})) == ("", None, None, {})
    assert (env.check_task(env.tasks()[0]), env.check_call(ToolCall("add")), env.exploration_problems()) == (
        None, None, [])
    assert env.plain_arguments and env.empty_observations == () and env.max_sessions is None and env.close() is None
    assert not env.user_tools
    episode = env.reset(env.tasks()[0])
    assert (episode.lost, episode.new_tools(), episode.close()) == (None, [], None)
    assert ENV_FAILURE == "process"
    task = env.tasks()[0]
    candidate = Candidate.create("counter", "add three", "Add three.", ["add(amount=3)"], task.initial_state, {},
                                 task.id, "boundary", "e", "template")
    assert Validator(env, known=env.tasks()).validate(candidate, 1).verdict.accepted


def test_no_module_finds_an_env_or_episode_capability_by_name():
    pattern = re.compile(r"\b(?:getattr|hasattr)\((?:self\.)?(?:env|episode|run\.env|self\._env)\s*,")
    found = [f"{path.relative_to(ROOT)}:{number}" for path in sorted((ROOT / "coevolve").rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, found
