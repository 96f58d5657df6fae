"""The protocols: the environment every env implements (BFCL, AppWorld, a user's own tools), and the explorer
and abstractor that synthesis drives over it.

An `Env` hands out `Task`s and opens one independent `Episode` per rollout. An episode is a multi-turn dialogue:

    episode = env.reset(task)
    while not episode.done:
        messages = episode.user_messages()       # what the user says to open this turn
        tools = episode.tools()                  # tool schemas exposed in this turn
        ...the agent replies; each reply's calls go through...
        steps = episode.act(calls)               # -> (action, observation) pairs, errors as data
        ...a reply with no call ends the agent's turn:
        episode.end_turn()
    score = episode.score()                      # Score(value, checks)

Contract (what rollouts, exploration and validation rely on):
- `reset` never shares state between episodes, even two of the same task run interleaved.
- `act` never raises on agent input: unknown tools, bad syntax, bad arguments and tool exceptions become a
  `Step` whose `error` says why. Nothing the agent writes is `eval`ed.
- `score` is the env's own binary verdict (1.0 / 0.0) with the reason of every check.
- `state` is a snapshot of what the episode's tools have changed so far, comparable with `==` and never shared
  with the live episode (BFCL: every public attribute of every instance, deep-copied). Validation of synthesized
  tasks compares it before/after a solution and between two executions.

A call can fail in two ways: the env refuses or the tool raises (`Step.error` is set), or the tool itself answers
with an error value, as BFCL's tools do (`{"error": "cd: photos: No such directory"}`, `Step.error` None, since
the official scorer treats it as an ordinary result). `step_failure` recognises both.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from coevolve.records import (Check, ExplorationContext, ExplorationEpisode, Message, Score, Step, Task, ToolCall,
                              canonical_json)
from coevolve.states import StatePatterns

CallInput = str | Mapping[str, Any] | ToolCall
"""A call as an agent gives it: a Python-call string, a JSON object `{"name", "arguments"}`, or a ToolCall."""


@runtime_checkable
class Episode(Protocol):
    task: Task

    @property
    def turn_index(self) -> int: ...

    @property
    def done(self) -> bool: ...

    def user_messages(self) -> list[Message]: ...

    def tools(self) -> list[dict[str, Any]]: ...

    def act(self, calls: Sequence[CallInput]) -> tuple[Step, ...]: ...

    def end_turn(self) -> None: ...

    def score(self) -> Score: ...

    def state(self) -> Any: ...


@runtime_checkable
class Env(Protocol):
    name: str
    states: StatePatterns
    """Which state each call acts on, as `tool@state` patterns (`coevolve.states`: the working directory for BFCL's
    file system, the arguments given for any other tools); the unexplored-state rare counts them."""

    def tasks(self) -> list[Task]: ...

    def reset(self, task: Task) -> Episode: ...


@runtime_checkable
class Explorer(Protocol):
    """Plays exploration episodes in an env from signal contexts (`coevolve.explore`: offline, the policy, an LLM).
    One episode per context and `episodes_per_context`; a failed one carries its `error` instead of raising."""

    def explore(self, env: Env, contexts: Sequence[ExplorationContext], tasks: Mapping[str, Task],
                seed: int = 0) -> list[ExplorationEpisode]: ...


@runtime_checkable
class Abstractor(Protocol):
    """Turns exploration episodes into candidate tasks (`coevolve.abstract`: template or LLM). Returns one
    `coevolve.abstract.Abstraction` per episode; `deadline` is a `time.monotonic()` value or None."""

    def abstract(self, env: Env, episodes: Sequence[ExplorationEpisode], tasks: Mapping[str, Task],
                 deadline: float | None = None) -> list[Any]: ...


class EnvUnavailable(RuntimeError):
    """An env cannot run on this machine (a missing venv, missing data); the message names the fix."""


ERROR_PREFIX = "Error during execution"


def step_failure(step: Step) -> str | None:
    """Why a call failed, or None when it ran and returned an ordinary result (see the module docstring)."""
    if step.error is not None:
        return step.error
    observation = step.observation
    if observation.startswith(ERROR_PREFIX):
        return observation
    if observation.startswith("{") and '"error"' in observation:
        try:
            value = json.loads(observation)
        except ValueError:
            return None
        if isinstance(value, dict) and "error" in value:
            return str(value["error"])
    return None


def turn_checks(turn: int, truth_calls: Sequence[str], calls_made: int, state: Mapping[str, Any],
                truth_state: Mapping[str, Any], results: Sequence[str], truth_results: Sequence[str]) -> list[Check]:
    """BFCL's rule for one turn whose ground truth makes calls: the agent called something, the state after the
    turn equals the state the ground truth leaves in a fresh instance (key by key), and each of the ground truth's
    results is among the agent's results so far (with multiplicity). Envs `python` and `mcp` score with it."""
    if calls_made == 0:
        return [Check(turn, "empty_turn", False, f"turn {turn}: no call, but the ground truth makes {len(truth_calls)}")]
    differing = sorted(key for key in set(state) | set(truth_state) if state.get(key) != truth_state.get(key))
    checks = [Check(turn, "state", not differing, f"turn {turn}: state differs in {', '.join(differing)}"
                    if differing else "")]
    remaining, missing = list(results), []
    for item in truth_results:
        if item in remaining:
            remaining.remove(item)
        else:
            missing.append(item)
    checks.append(Check(turn, "response", not missing, f"turn {turn}: {len(missing)} ground-truth result(s) missing, "
                        f"e.g. {missing[0][:200]!r}" if missing else ""))
    return checks


class ToolEpisode:
    """The turn loop that envs `python` and `mcp` share: `act` checks each call (`_checked`), runs it (`_run`) and
    keeps its result; `end_turn` scores a turn whose ground truth makes calls with `turn_checks`, against what
    `_truth_turn` says the ground truth leaves (None when the env failed to play it: the subclass says why)."""

    env: Any
    task: Task

    def _start(self) -> None:
        self._turn, self._calls_in_turn = 0, 0
        self._results: list[str] = []
        self.checks: list[Check] = []

    @property
    def turn_index(self) -> int:
        return self._turn

    @property
    def done(self) -> bool:
        return self._turn >= self.task.num_turns

    def tools(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self.env.docs)

    def _checked(self, raw: Any) -> ToolCall | str: ...

    def _run(self, call: ToolCall) -> tuple[str, str | None]: ...

    def _truth_turn(self, turn: int) -> tuple[list[str], Mapping[str, Any]] | None: ...

    def state(self) -> Any: ...

    def act(self, calls: Sequence[Any]) -> tuple[Step, ...]:
        if isinstance(calls, (str, bytes)) or not isinstance(calls, Sequence):
            calls = [calls]
        steps = []
        for raw in calls:
            action = raw if isinstance(raw, str) else canonical_json(raw.to_dict() if isinstance(raw, ToolCall) else raw)
            action = action[:4096]
            if self.done:
                steps.append(Step(self._turn, 0, action, None, "Error: the episode is over", "the episode is over"))
                continue
            checked = self._checked(raw)
            if isinstance(checked, str):
                steps.append(Step(self._turn, 0, action, None, f"Error: {checked}", checked))
                continue
            observation, error = self._run(checked)
            self._results.append(observation)
            self._calls_in_turn += 1
            steps.append(Step(self._turn, 0, action, checked, observation, error))
        return tuple(steps)

    def end_turn(self) -> None:
        if self.done:
            return
        truth_calls = self.task.ground_truth[self._turn]
        truth = self._truth_turn(self._turn) if truth_calls else None
        if truth is not None:
            results, state = truth
            self.checks += turn_checks(self._turn, truth_calls, self._calls_in_turn, self.state(), state,
                                       self._results, results)
        self._turn += 1
        self._calls_in_turn = 0
