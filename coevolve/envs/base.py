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
from coevolve.states import ARGUMENT_STATES, StatePatterns

CallInput = str | Mapping[str, Any] | ToolCall
"""A call as an agent gives it: a Python-call string, a JSON object `{"name", "arguments"}`, or a ToolCall."""


EMPTY_RESULTS = frozenset({"", "None", "null", "{}", "[]", '""', "''"})
"""Tool results that say nothing: a solution whose results are all of these and that changes nothing is refused
(validation's `no_effect`, `env check`'s ground-truth check)."""

ENV_FAILURE = "process"
"""The check kind that says the env itself failed in an episode (its worker or server died, hung or broke its
protocol), never the agent: a rollout with such a failed check is counted as `environment` in metrics.jsonl's
`failures`, not as the model's 0."""


class EnvFailed(RuntimeError):
    """The env itself failed (a worker process or a server died, hung or broke its protocol): the one type every
    process mechanism raises (AppWorld's worker, your tools' worker, an MCP session). The episode is lost with the
    reason (`Episode.lost`, a check of kind `ENV_FAILURE`); the run goes on."""


class Episode:
    """One independent episode of a task (`Env.reset`): the contract in the module docstring. Subclass it and
    implement the methods that raise `NotImplementedError`; the others have the defaults documented on them."""

    task: Task
    lost: str | None = None
    """Why the env itself failed in this episode (see `EnvFailed`), or None: what the rollout reports as the
    episode's failure. Its score says it too, as a failed check of kind `ENV_FAILURE`."""

    @property
    def turn_index(self) -> int:
        raise NotImplementedError

    @property
    def done(self) -> bool:
        raise NotImplementedError

    def user_messages(self) -> list[Message]:
        """What the user says to open the current turn."""
        raise NotImplementedError

    def tools(self) -> list[dict[str, Any]]:
        """The tool schemas exposed in the current turn."""
        raise NotImplementedError

    def act(self, calls: Sequence[CallInput]) -> tuple[Step, ...]:
        """Run the calls of one reply: one `Step` each, errors as data, never raising on agent input."""
        raise NotImplementedError

    def end_turn(self) -> None:
        raise NotImplementedError

    def score(self) -> Score:
        raise NotImplementedError

    def state(self) -> Any:
        raise NotImplementedError

    def new_tools(self) -> list[dict[str, Any]]:
        """Tools that appear from this turn on (BFCL's missing-function category), shown in the user turn.
        Default: none, the tools of `tools()` are all there is."""
        return []

    def close(self) -> None:
        """Release what the episode holds (a session, a worker's instance). Default: nothing to release."""
        return None


class Env:
    """What every env gives the loop, validation, the explorer and the CLI. Subclass it: implement `tasks` and
    `reset`; every other capability below has a documented default, so an env declares only what it changes.

    Why a base class and not a Protocol: the defaults must live in one place a reader sees, and a Protocol's
    defaults reach only classes that subclass it anyway. Nothing here is looked up by name: the loop and the CLI
    call these members on every env."""

    name: str = ""
    """The env's name in task records (`Task.env`) and in `env.name` of a config."""
    states: StatePatterns = ARGUMENT_STATES
    """Which state each call acts on, as `tool@state` patterns (`coevolve.states`: the working directory for BFCL's
    file system; by default the arguments a call gave); the unexplored-state rare counts them."""
    category: str = ""
    """The category its tasks come from, as `coevolve eval` reports it (BFCL: `multi_turn_base`); default none."""
    split: str | None = None
    """The split its tasks are (`train` / `test`), or None: every task."""
    empty_observations: tuple[str, ...] = ()
    """Results that say nothing (AppWorld's `Execution successful.`): validation does not count them as an effect."""
    plain_arguments: bool = True
    """Whether call arguments are plain values, checked by validation's path and unsafe-pattern gate; False where
    `check_call` is the gate instead (AppWorld: the argument is code)."""
    max_sessions: int | None = None
    """How many episodes may be open at once (an MCP server's sessions), or None: no limit. A run that opens more
    at once (`grpo.prompts_per_step` x `rollout.group_size`) is refused before anything slow."""
    user_tools: bool = False
    """Whether the tools are a user's code that no shipped test checks (your tools, an MCP server): a run then plays
    its first tasks' ground truths twice at its start and says what `coevolve env check` would refuse."""

    def tasks(self) -> list[Task]:
        raise NotImplementedError

    def reset(self, task: Task) -> Episode:
        """A fresh episode of `task`; never shares state with another episode."""
        raise NotImplementedError

    def check_task(self, task: Task) -> str | None:
        """Why a task record from a file (`env.tasks_file`, `eval --tasks`) cannot run here, or None (default:
        every record of this env can)."""
        return None

    def check_call(self, call: ToolCall) -> tuple[str, str] | None:
        """Validation's own gate for one call of a synthesized solution: (rejection code, reason), or None when it
        passes (default: no gate beyond the plain-value one)."""
        return None

    def metrics(self, per_task: Mapping[str, float]) -> dict[str, float]:
        """The env's own metrics over an evaluation's per-task successes (AppWorld: TGC, SGC); default none."""
        return {}

    def with_split(self, split: str | None) -> "Env | None":
        """The same env with another split of its own tasks (your tools, MCP: from the task records' `split`), or
        None (default) when it makes no split itself."""
        return None

    def exploration_problems(self) -> list[str]:
        """`tool(argument)` for each required argument the offline explorer cannot draw a value for (default
        none): a run that explores offline is refused up front."""
        return []

    def close(self) -> None:
        """Release what the env holds (worker processes, server sessions); default nothing."""
        return None


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


class ToolEpisode(Episode):
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
