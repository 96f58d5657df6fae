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

import json
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from coevolve.records import ExplorationContext, ExplorationEpisode, Message, Score, Step, Task, ToolCall

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
