"""Your own tools as an environment: a Python class whose public, type-hinted, documented methods are the tools,
and a JSON-lines task file. The convention is TRL's `environment_factory`: `reset(**row)` starts an episode (its
keyword arguments are the task's initial state; a string it returns is added to the user's first message), and
an optional `get_reward()` scores an episode that has no ground truth.

    env = PythonEnv("examples.shop.shop:Shop", tasks="examples/shop/tasks.jsonl", split="train")
    coevolve eval --env python:examples.shop.shop:Shop --tasks examples/shop/tasks.jsonl --policy oracle

- Tools: every public method but `reset`, the reward method and `state` (never tools: the episode's start, its
  score, and what a class may define to show its state), with a JSON schema from its type hints and its
  docstring (Google or NumPy style: the first paragraph describes the tool, `Args:`/`Parameters` its arguments). A
  method without hints on every argument, or without a docstring, is refused when the class is loaded, by name.
- Tasks (one JSON object a line): `query` (the user's one message) or `turns` (a list of turns, each a list of
  user messages); `reset` (keyword arguments for `reset`; may be absent); `ground_truth` (a list per turn of
  Python-call strings, `"lend(title='Dune', member='ana')"`); optional `id` and `split` (`train` / `test`).
- Episodes: a fresh instance each, never shared, living in the tools' worker process
  (`coevolve.envs.python_worker`): every call waits at most `call_timeout_s` (10 s; `env.options.call_timeout_s`),
  and a tool that exits, hangs or kills its process costs its episode, never the run. Calls are parsed as BFCL's are (`coevolve.calls`: literals only,
  never evaluated), only the tools can be called, arguments are bound to the signature before the method runs,
  and anything a method raises is an observation with its reason. `state()` is a plain-data snapshot of the
  instance's public attributes, so validation's state checks work unchanged.
- Score: with ground truth, BFCL's rule (after each turn the state equals the state the ground truth leaves in a
  fresh instance, and the ground truth's results are among the agent's); without, the class's `get_reward()`
  (1.0 when it returns at least 0.5 and is a number, as a binary score; the value is kept in the check).
"""

from __future__ import annotations

import copy
import inspect
import json
import types
import typing
from typing import Any, Callable, Literal, Mapping, Sequence

from coevolve.calls import DEFAULT_LIMITS, CallError, CallLimits, fresh_arguments, parse_call
from coevolve.envs import ENVS
from coevolve.envs.base import ENV_FAILURE, Env, ToolEpisode
from coevolve.envs.python_worker import (DEFAULT_CALL_TIMEOUT_S, BrokenInstance, ClassRaised, RemoteInstance,
                                         ToolWorker, WorkerLost, can_isolate)
from coevolve.envs.user_env import (EnvDefinitionError, doc_parts, import_attribute,
                                    load_task_file, truth_problem)
from coevolve.records import Check, Message, Score, Task, ToolCall, canonical_json
from coevolve.states import ARGUMENT_STATES, StatePatterns

NOT_TOOLS = ("reset", "get_reward", "state")
"""Public methods that are never tools: the episode's start, its reward, and a `state` the class may define."""
REWARD_METHOD = "get_reward"
MAX_OBSERVATION_CHARS = 8000


# --------------------------------------------------------------------------------------------------------------
# The class: import, tools and their schemas
# --------------------------------------------------------------------------------------------------------------


def load_class(spec: str) -> type:
    """`package.module:ClassName` (see `import_attribute`)."""
    cls = import_attribute(spec)
    if not isinstance(cls, type):
        module_name, _, class_name = spec.partition(":")
        raise EnvDefinitionError(f"{spec!r}: {module_name} has no class {class_name}")
    return cls


_JSON_TYPES = {str: "string", int: "integer", float: "float", bool: "boolean", list: "array", dict: "dict",
               tuple: "array", type(None): "null"}


def _schema(hint: Any, where: str) -> dict[str, Any]:
    """A JSON schema (BFCL's type names) for a type hint."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        kinds = {_JSON_TYPES.get(type(arg), "string") for arg in args}
        return {"type": kinds.pop() if len(kinds) == 1 else "string", "enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        options = [arg for arg in args if arg is not type(None)]
        return _schema(options[0], where) if len(options) == 1 else {"type": "string"}
    if origin in (list, tuple, set, frozenset, Sequence):
        item = args[0] if args and args[0] is not Ellipsis else Any
        return {"type": "array", "items": _schema(item, where) if item is not Any else {}}
    if origin in (dict, Mapping):
        return {"type": "dict"}
    if hint in _JSON_TYPES:
        return {"type": _JSON_TYPES[hint]}
    if hint is Any:
        return {}
    raise EnvDefinitionError(f"{where}: type {hint!r} has no JSON schema; use str, int, float, bool, list, dict, "
                             "Literal or Optional of them")


def tool_docs(cls: type) -> list[dict[str, Any]]:
    """The class's tools as function docs (name, description, parameters), in definition order."""
    docs = []
    for name, function in _public_methods(cls):
        where = f"{cls.__name__}.{name}"
        if inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function):
            raise EnvDefinitionError(f"{where} is `async def`: its calls would return coroutines that never run; "
                                     "make it a plain `def` (run the awaitable inside it with asyncio.run)")
        if inspect.isgeneratorfunction(function):
            raise EnvDefinitionError(f"{where} yields: a tool returns its answer (return a list instead)")
        doc = inspect.getdoc(function)
        if not doc:
            raise EnvDefinitionError(f"{where} has no docstring: write what the tool does (the agent reads it)")
        signature = inspect.signature(function)
        try:
            hints = typing.get_type_hints(function)
        except Exception as error:  # noqa: BLE001 - an unresolvable annotation, named
            raise EnvDefinitionError(f"{where}: its type hints cannot be read ({error})") from None
        description, described = doc_parts(doc)
        properties, required = {}, []
        for parameter in list(signature.parameters.values())[1:]:
            if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                stars = "*" if parameter.kind == parameter.VAR_POSITIONAL else "**"
                raise EnvDefinitionError(f"{where}: {stars}{parameter.name} cannot be a tool argument; name each one")
            if parameter.name not in hints:
                raise EnvDefinitionError(f"{where}: argument {parameter.name!r} has no type hint")
            schema = _schema(hints[parameter.name], f"{where}({parameter.name})")
            schema["description"] = described.get(parameter.name, "")
            if parameter.default is parameter.empty:
                required.append(parameter.name)
            else:
                schema["default"] = parameter.default
            properties[parameter.name] = schema
        docs.append({"name": name, "description": description,
                     "parameters": {"type": "dict", "properties": properties, "required": required}})
    if not docs:
        raise EnvDefinitionError(f"{cls.__name__} has no public method to offer as a tool")
    return docs


def _public_methods(cls: type) -> list[tuple[str, Callable[..., Any]]]:
    """Public functions of the class and its bases, in definition order (the agent sees the tools in it)."""
    found: dict[str, Callable[..., Any]] = {}
    for klass in reversed(cls.__mro__[:-1]):
        for name, member in vars(klass).items():
            if inspect.isfunction(member) and not name.startswith("_") and name not in NOT_TOOLS:
                found[name] = member
    return list(found.items())


def plain(value: Any, depth: int = 0) -> Any:
    """JSON-like plain data for a state snapshot (sets sorted, objects by their public attributes)."""
    if depth > 20:
        return repr(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(key): plain(item, depth + 1) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item, depth + 1) for item in value]
    if isinstance(value, (set, frozenset)):
        return sorted((plain(item, depth + 1) for item in value), key=lambda item: canonical_json(item))
    if hasattr(value, "__dict__"):
        return {key: plain(item, depth + 1) for key, item in vars(value).items() if not key.startswith("_")}
    return repr(value)


def public_state(instance: Any) -> dict[str, Any]:
    return {key: plain(copy.deepcopy(value)) for key, value in vars(instance).items() if not key.startswith("_")}


def observation_of(result: Any) -> str:
    text = result if isinstance(result, str) else json.dumps(plain(result), ensure_ascii=False)
    return text if len(text) <= MAX_OBSERVATION_CHARS else text[:MAX_OBSERVATION_CHARS] + " ...(cut)"


# --------------------------------------------------------------------------------------------------------------
# Tasks
# --------------------------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------------------------
# The episode
# --------------------------------------------------------------------------------------------------------------


TOOL_EXITS = (SystemExit, KeyboardInterrupt, GeneratorExit)
"""What a tool may raise that is not an Exception: in the tools' worker an observation like any error (a tool
ending the process, or faking Ctrl-C); in the caller's process (`isolate=False`) they propagate."""


class _Instance:
    """One instance of the user's class and the safe way to call its tools."""

    def __init__(self, cls: type, reset: Mapping[str, Any], tools: Mapping[str, inspect.Signature],
                 catch_exits: bool = False) -> None:
        self.tools = tools
        self.caught = (Exception, *TOOL_EXITS) if catch_exits else (Exception,)
        self.lost: str | None = None
        self.object = cls()
        self.opening = ""
        if reset and not hasattr(self.object, "reset"):  # never dropped in silence (`env check` says it too)
            raise TypeError(f"the task gives reset arguments {sorted(reset)}, but {cls.__name__} has no reset()")
        if hasattr(self.object, "reset"):
            returned = self.object.reset(**copy.deepcopy(dict(reset)))
            self.opening = returned if isinstance(returned, str) else ""

    def run(self, call: ToolCall) -> tuple[str, str | None]:
        """(observation, error); never raises on agent input."""
        signature = self.tools.get(call.name)
        if signature is None:
            reason = f"no tool named {call.name!r}; the tools are {', '.join(sorted(self.tools))}"
            return f"Error: {reason}", reason
        positional, keywords = fresh_arguments(call)
        try:
            bound = signature.bind(None, *positional, **keywords)
        except TypeError as error:
            return f"Error: {call.name}: {error}", f"{call.name}: {error}"
        try:
            result = getattr(self.object, call.name)(*bound.args[1:], **bound.kwargs)
        except self.caught as error:  # noqa: BLE001 - a tool that raises gives the agent its reason
            reason = f"{call.name} raised {type(error).__name__}: {str(error)[:300]}"
            return f"Error: {reason}", reason
        return observation_of(result), None

    def state(self) -> dict[str, Any]:
        return public_state(self.object)

    def reward(self) -> Any:
        """The class's `get_reward()` (raises what it raises; None when there is none)."""
        method = getattr(self.object, REWARD_METHOD, None)
        return None if method is None else ("value", method())


def _worker_instance(cls: type, reset: Mapping[str, Any], catch_exits: bool = False) -> _Instance:
    """An instance as the tools' worker makes it (`coevolve.envs.python_worker`)."""
    return _Instance(cls, reset, {name: inspect.signature(m) for name, m in _public_methods(cls)}, catch_exits)


class PythonEpisode(ToolEpisode):
    def __init__(self, env: "PythonEnv", task: Task) -> None:
        self.env, self.task = env, task
        self._agent = env.instance(task.initial_state)
        self._start()
        self._truth: tuple[list[list[str]], list[dict[str, Any]]] | None = None
        self._shadow_lost = ""

    @property
    def lost(self) -> str | None:
        """Why the instance is gone (its constructor raised, the worker died or hung), or None."""
        return self._agent.lost

    def user_messages(self) -> list[Message]:
        if self.done:
            return []
        messages = [dict(m) for m in self.task.turns[self._turn]]
        if self._turn == 0 and self._agent.opening and messages:
            messages[0]["content"] = messages[0]["content"] + "\n\n" + self._agent.opening
        return messages

    def _checked(self, raw: Any) -> ToolCall | str:
        parsed = parse_call(raw, self.env.limits)
        return parsed.reason if isinstance(parsed, CallError) else parsed

    def _run(self, call: ToolCall) -> tuple[str, str | None]:
        return self._agent.run(call)

    def _truth_turn(self, turn: int) -> tuple[list[str], dict[str, Any]]:
        results, states = self._truth_trace()
        return results[turn], states[turn]

    def score(self) -> Score:
        checks = list(self.checks)
        lost = self._agent.lost or (self._shadow_lost or None)
        if lost:  # the tools' worker died or hung: the env's failure, not the agent's (`rollout` counts it)
            checks.append(Check(self._turn, ENV_FAILURE, False, lost))
        if not self.done:
            checks.append(Check(self._turn, "force_terminated", False,
                                f"episode ended at turn {self._turn} of {self.task.num_turns} (force_terminated)"))
        if not any(self.task.ground_truth):
            return self._reward_score(checks)
        return Score(1.0 if all(check.passed for check in checks) else 0.0, tuple(checks))

    def state(self) -> dict[str, Any]:
        return self._agent.state()

    def _reward_score(self, checks: list[Check]) -> Score:
        try:
            answer = self._agent.reward()
        except WorkerLost as error:
            return Score(0.0, (*checks, Check(self._turn, ENV_FAILURE, False, str(error))))
        except ClassRaised as error:
            return Score(0.0, (*checks, Check(self._turn, "reward", False, f"get_reward raised {error}")))
        except Exception as error:  # noqa: BLE001 - a reward that raises scores 0, with why
            return Score(0.0, (*checks, Check(self._turn, "reward", False, f"get_reward raised {error!r}")))
        if answer is None:
            return Score(0.0, (*checks, Check(self._turn, "reward", False, "no ground truth and no get_reward()")))
        value = answer[1]
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0.5
        return Score(1.0 if ok and all(c.passed for c in checks) else 0.0,
                     (*checks, Check(self._turn, "reward", ok, f"get_reward() = {value!r}")))

    def _truth_trace(self) -> tuple[list[list[str]], list[dict[str, Any]]]:
        """The ground truth played once on a fresh instance: each turn's results and the state after it."""
        if self._truth is None:
            shadow = self.env.instance(self.task.initial_state)
            results, states = [], []
            for calls in self.task.ground_truth:
                turn_results = []
                for text in calls:
                    parsed = parse_call(text, self.env.limits)
                    turn_results.append(shadow.run(parsed)[0] if isinstance(parsed, ToolCall) else parsed.reason)
                results.append(turn_results)
                states.append(shadow.state())
            self._shadow_lost = shadow.lost or ""
            self._truth = (results, states)
        return self._truth


# --------------------------------------------------------------------------------------------------------------
# The env
# --------------------------------------------------------------------------------------------------------------


@ENVS.register("python")
class PythonEnv(Env):
    """`PythonEnv(cls="package.module:ClassName", tasks="tasks.jsonl", split=None)`: see the module docstring."""

    user_tools = True  # checked at a run's start (`coevolve.run_setup.env_check_warnings`)

    states: StatePatterns = ARGUMENT_STATES
    """Which state a call acts on: its tool and the arguments it gave (`coevolve.states`)."""

    def __init__(self, cls: str | type, tasks: str | None = None, split: str | None = None,
                 limits: CallLimits = DEFAULT_LIMITS, scope: str = "exposed",
                 call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S, isolate: bool = True) -> None:
        """`call_timeout_s`: the most one tool call (or the constructor and reset) may take; `isolate`: run the
        tools in a worker process (`coevolve.envs.python_worker`), so that none can end or hang the run."""
        self.cls = load_class(cls) if isinstance(cls, str) else cls
        self.name = f"python:{cls if isinstance(cls, str) else f'{cls.__module__}:{cls.__qualname__}'}"
        self.docs = tool_docs(self.cls)
        self.signatures = {name: inspect.signature(method) for name, method in _public_methods(self.cls)}
        self.limits, self.split = limits, split
        if split is not None and split not in ("train", "test"):
            raise ValueError(f"split must be train or test, got {split!r}")
        no_reward = None if callable(getattr(self.cls, REWARD_METHOD, None)) else \
            f"{self.cls.__name__} has no {REWARD_METHOD}()"
        self._tasks = load_task_file(tasks, self.name, no_reward) if tasks else []
        self.worker: ToolWorker | None = None
        if isolate and can_isolate(self.cls):
            self.worker = ToolWorker(self.cls, _worker_instance, call_timeout_s)
        elif isolate:  # refused, not warned: in this process a tool that exits ends the run, one that loops hangs it
            raise EnvDefinitionError(
                f"{self.cls.__module__}:{self.cls.__qualname__} cannot be imported by name in a worker process "
                "(defined in the __main__ script or inside a function): move it into a module, or pass isolate=False "
                "(env.options.isolate: false) to run its tools in this process, with no deadline")

    def instance(self, reset: Mapping[str, Any]) -> "_Instance | RemoteInstance | BrokenInstance":
        """A fresh instance of the class, started with `reset`'s arguments: in the tools' worker when isolated."""
        if self.worker is not None:
            return RemoteInstance(self.worker, reset)
        try:
            return _Instance(self.cls, reset, self.signatures)
        except Exception as error:  # noqa: BLE001 - a constructor or reset that raises: the episode says why
            return BrokenInstance(f"the class raised {type(error).__name__} before any call: {str(error)[:300]}")

    def tasks(self) -> list[Task]:
        return [task for task in self._tasks if self.split is None or task.meta.get("split") == self.split]

    def with_split(self, split: str | None) -> "PythonEnv":
        """The same class and task file, another split."""
        other = copy.copy(self)
        other.split = split
        return other

    def reset(self, task: Task) -> PythonEpisode:
        return PythonEpisode(self, task)


# --------------------------------------------------------------------------------------------------------------
# `coevolve env check`
# --------------------------------------------------------------------------------------------------------------


def check_env(spec: str, tasks_path: str) -> list[str]:
    """What is wrong with a class and a task file, one plain line each (empty: all is well): the tools' hints and
    docstrings, the task file's shape, each task's reset arguments, whether its ground truth runs, does something,
    and ends the same way twice (randomness or the clock without a seed would not)."""
    try:
        env = PythonEnv(spec, tasks=tasks_path)
    except EnvDefinitionError as error:
        return [str(error)]
    problems = []
    reset = getattr(env.cls, "reset", None)
    for task in env.tasks():
        where = f"task {task.name!r}"
        if task.initial_state:
            if reset is None:
                problems.append(f"{where}: gives reset arguments, but {env.cls.__name__} has no reset(); add one")
                continue
            try:
                inspect.signature(reset).bind(None, **task.initial_state)
            except TypeError as error:
                taken = ", ".join(list(inspect.signature(reset).parameters)[1:]) or "nothing"
                problems.append(f"{where}: reset() cannot take {sorted(task.initial_state)} ({error}); it takes "
                                f"{taken}")
                continue
        shared = [name for name, value in vars(env.cls).items()
                  if not name.startswith("_") and isinstance(value, (list, dict, set))]
        cause = (f"class attribute {', '.join(shared)} is shared by every instance, so one episode's changes leak "
                 "into the next: make it an instance attribute in __init__" if shared else
                 "randomness or the clock without a seed?")
        problem = truth_problem(env, task, cause)
        if problem:
            problems.append(f"{where}: {problem}")
    return problems
