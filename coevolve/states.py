"""Action states: which state an action acts on, so that the rare signal can name a state D_t lacks (not the paper's).

The paper's rare signal counts action patterns: tool names and their n-grams. What a data set lacks is often not a
tool or an order but a *state*: the two-call shift's D_0 acts only at the file system's root, while every task of its
held-out two-call part acts inside a folder. An env therefore says, through its `states` (`StatePatterns`), which
state each call that ran acts on, as a pattern string `tool@state`:

    DirectoryStates (BFCL, BFCL-lite)   `tool@start` or `tool@folder`: the working directory the call runs in,
                                        the episode's start or a folder below it (tracked from the `cd` calls
                                        that ran: `..` climbs, `a/b` descends two)
    ArgumentStates (python, MCP, AppWorld) `tool@a,b`: the tool and the names of the arguments it was given
                                        (`tool@` without any): which of its inputs a call exercised

`space(tools)` is every pattern an episode exposing those tools could reach (BFCL: each tool at the start, and in a
folder when `cd` is among them; python / MCP: each tool with its required arguments, alone and with each optional
one). `signals.unexplored_states` counts the patterns over D_{t-1}'s solutions and the iteration's rollouts
(`reached_counts`) and fires a rare event on each pattern of the space reached fewer than `signals.rare_below`
times (`coevolve.signals.unexplored_states`). Its exploration follows the pattern's `route` (`Route`): the calls
that reach the state, each given values the episode has just observed and drawn again when the env refuses one
(BFCL: `ls`, `cd` into a listed name that turns out a folder, `ls` inside), then the pattern's tool with the
arguments it names (`coevolve.explore`). Abstraction keeps the solutions whose last call acts in that state, the
shortest first (`coevolve.abstract.focus_solutions`), and validation refuses one whose last call answers and
changes the same without the calls before it (`order_free`): a task that does not need the state.

Nothing here reads the held-out set: the space comes from the tools an episode exposes, the counts from D_t and
the policy's rollouts.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Protocol, Sequence

from coevolve.calls import parse_call
from coevolve.records import Task, ToolCall, Trajectory

STATE_SEPARATOR = "@"
"""Joins a tool and its state: `cat@folder`. MCP and python tool names never hold it (names are identifiers)."""


def is_state_pattern(focus: str | None) -> bool:
    """Whether an exploration focus names an action state (`cat@folder`) rather than a tool or an order."""
    return bool(focus) and STATE_SEPARATOR in focus  # type: ignore[operator]


def state_tool(pattern: str) -> str:
    """The tool of a state pattern: `cat` for `cat@folder`."""
    return pattern.split(STATE_SEPARATOR, 1)[0]


@dataclass(frozen=True)
class Route:
    """How an exploration reaches a state pattern and acts there."""

    before: tuple[str, ...]
    """Tools to call first, in turn, each on values the episode has just observed (drawn again when refused)."""
    tool: str
    """The tool that must then act in the state."""
    arguments: tuple[str, ...] = ()
    """Arguments the acting call must give (an optional argument the pattern names)."""
    exact: bool = False
    """The acting call gives exactly `arguments` (no other optional one): the pattern is its argument set."""
    description: str = ""
    """The state in words, for an LLM explorer's prompt."""


class StatePatterns(Protocol):
    """What an env says about the states its actions act on (module docstring)."""

    def patterns(self, calls: Sequence[ToolCall]) -> list[str]:
        """One pattern per call, for calls that ran, in the order they ran (from a fresh episode's start)."""
        ...

    def space(self, tools: Sequence[Mapping[str, Any]]) -> list[str]:
        """Every pattern an episode exposing `tools` (their schemas) could reach, in a fixed order."""
        ...

    def route(self, pattern: str) -> Route:
        """How an exploration reaches `pattern`'s state and acts there."""
        ...


class DirectoryStates:
    """BFCL's file system: the working directory a call runs in, relative to the episode's start."""

    enter = "cd"
    """The tool that changes the working directory."""
    look = "ls"
    """The tool that lists what the working directory holds (what the next call's values come from)."""

    def patterns(self, calls: Sequence[ToolCall]) -> list[str]:
        depth, found = 0, []
        for call in calls:
            found.append(f"{call.name}{STATE_SEPARATOR}{'folder' if depth > 0 else 'start'}")
            if call.name == self.enter:
                depth = _depth_after(depth, next(iter([*call.arguments.values(), *call.positional]), ""))
        return found

    def space(self, tools: Sequence[Mapping[str, Any]]) -> list[str]:
        names = [str(doc.get("name")) for doc in tools]
        where = ("start", "folder") if self.enter in names else ("start",)
        return [f"{name}{STATE_SEPARATOR}{state}" for name in names for state in where]

    def route(self, pattern: str) -> Route:
        tool, _, state = pattern.partition(STATE_SEPARATOR)
        if state != "folder":
            return Route((), tool, (), False, f"call {tool} in the starting folder")
        return Route((self.look, self.enter, self.look), tool, (), False,
                     f"call {tool} inside a folder: list the files, enter a folder that is there ({self.enter}), "
                     f"list it, then call {tool} on what it holds")


def _depth_after(depth: int, folder: Any) -> int:
    """The working directory's depth below the start after `cd(folder)` ran: `..` climbs (never above the start),
    `a/b` descends two, an absolute path counts from the root (where BFCL's episodes start)."""
    if not isinstance(folder, str):
        return depth
    if folder.startswith("/"):
        depth = 0
    for part in folder.split("/"):
        if part == "..":
            depth = max(0, depth - 1)
        elif part not in ("", "."):
            depth += 1
    return depth


class ArgumentStates:
    """Any tool env: a call's state is the set of argument names it gave (required ones are always there)."""

    def patterns(self, calls: Sequence[ToolCall]) -> list[str]:
        return [f"{call.name}{STATE_SEPARATOR}{','.join(sorted(call.arguments))}" for call in calls]

    def space(self, tools: Sequence[Mapping[str, Any]]) -> list[str]:
        found: list[str] = []
        for doc in tools:
            parameters = doc.get("parameters") or {}
            properties = list((parameters.get("properties") or {}) if isinstance(parameters, Mapping) else {})
            required = [name for name in (parameters.get("required") or ()) if name in properties] \
                if isinstance(parameters, Mapping) else []
            optional = [name for name in properties if name not in required]
            for extra in [None, *optional]:
                names = sorted([*required, *([extra] if extra else [])])
                found.append(f"{doc.get('name')}{STATE_SEPARATOR}{','.join(names)}")
        return list(dict.fromkeys(found))

    def route(self, pattern: str) -> Route:
        tool, _, names = pattern.partition(STATE_SEPARATOR)
        arguments = tuple(name for name in names.split(",") if name)
        return Route((), tool, arguments, True, f"call {tool} with the arguments {', '.join(arguments) or '(none)'}")


DIRECTORY_STATES = DirectoryStates()
ARGUMENT_STATES = ArgumentStates()


# ---------------------------------------------------------------------------------------------------------------
# Counting: D_t's solutions and the iteration's rollouts
# ---------------------------------------------------------------------------------------------------------------


def solution_calls(task: Task) -> list[ToolCall]:
    """A task's ground-truth calls, all turns in order (a call that does not parse is left out)."""
    parsed = (parse_call(text) for turn in task.ground_truth for text in turn)
    return [call for call in parsed if isinstance(call, ToolCall)]


def task_patterns(states: StatePatterns, task: Task) -> list[str]:
    """The states a task's solution acts on (a validated solution runs, every call of it)."""
    return states.patterns(solution_calls(task))


def reached_counts(states: StatePatterns, tasks: Iterable[Task], rollouts: Iterable[Sequence[ToolCall]]) -> Counter:
    """c_p per state pattern over the tasks' solutions and the rollouts' calls that ran."""
    counts: Counter[str] = Counter()
    for task in tasks:
        counts.update(task_patterns(states, task))
    for calls in rollouts:
        counts.update(states.patterns(calls))
    return counts


def new_state_tasks(states: StatePatterns, seed: Sequence[Task], synthetic: Sequence[Task]) -> dict[str, int]:
    """Synthesized tasks whose solution reaches a state no seed task's solution reaches (`admitted`), and how many
    of those exploration was sent to a state for (`steered`): metrics.jsonl's `state_tasks`."""
    seen = {pattern for task in seed for pattern in task_patterns(states, task)}
    new = [task for task in synthetic if set(task_patterns(states, task)) - seen]
    return {"admitted": len(new), "steered": sum(1 for task in new if is_state_pattern(task.provenance.focus_tool))}


def state_coverage(env: Any, tasks: Iterable[Task], trajectories: Iterable[Trajectory]
                   ) -> tuple[dict[str, list[str]], Counter]:
    """What `signals.unexplored_states` needs for one iteration: task id -> the state patterns a fresh episode of it
    could reach (for the tasks the rollouts ran), and c_p over the tasks' solutions (D_{t-1}) and the rollouts."""
    from coevolve.envs.base import step_failure  # envs.base names StatePatterns: imported here, not at the top

    tasks = list(tasks)
    trajectories = list(trajectories)
    ran = set(trajectory.task_id for trajectory in trajectories)
    space = {task.id: env.states.space(env.reset(task).tools()) for task in tasks if task.id in ran}
    calls = [[step.call for step in trajectory.steps if step.call is not None and step_failure(step) is None]
             for trajectory in trajectories]
    return space, reached_counts(env.states, tasks, calls)
