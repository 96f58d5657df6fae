"""An MCP server as an environment: tools from `list_tools`, a fresh stateful session per episode, BFCL's scoring
through read-only probe calls, and synthesis over it unchanged.

    env = MCPEnv(server="examples.notes.server:make_server", tasks="examples/notes/tasks.jsonl", split="train",
                 state_calls=["list_notes()"])
    coevolve eval --env mcp:examples.notes.server:make_server --tasks examples/notes/tasks.jsonl --policy oracle

- The server. `server="package.module:ATTR"` names an MCP server object (the SDK's `MCPServer`, or a low-level
  `Server`) or a factory returning one. With a factory every episode gets a fresh server, made with the task's
  `reset` keyword arguments; an object is one global server that every episode shares (its state is never
  reset: `env check` says so when that makes two runs differ). In-process servers talk through the SDK's own
  in-process client (no sockets, no JSON-RPC framing). `command=[program, arg, ...]`: a stdio server, started per
  episode and ended with it; the task's `reset` reaches it as JSON in the environment variable COEVOLVE_MCP_RESET.
  Sessions run on one event loop in one thread (`coevolve.envs.mcp_bridge`), at most `max_sessions` open
  (1024 in-process, 64 stdio by default).
- Tools: `list_tools` (every page), once, when the env is made: name, description and input schema, as the agent
  sees them. The `reward_tool`, if any, is hidden from the agent.
- Calls: parsed as BFCL's are (`coevolve.calls`: literals only, never evaluated), by name among the listed tools,
  named arguments only, checked against the tool's input schema with `jsonschema` before anything is sent (an
  argument it does not name is refused unless it sets `additionalProperties`). The
  observation is the result's text (or its structured content), cut at `max_result_chars`; a result with
  `isError` and a protocol error are observations with their text, and `Step.error` says why.
- Failures of the server, not the agent: one that cannot start, does not answer within `call_timeout_s`, or dies
  fails its episode's `process` check, every later call says why, and the rollout counts as an environment
  failure (`rollout.max_consecutive_failures` stops a run whose server keeps failing). Never a hung run.
- State: the results of the probe calls — `state_calls` (every task) and the task's own `checks` — on the episode's
  session, `{call: result}`. They must be read-only; their results are not among the agent's.
- Score: with ground truth, BFCL's rule (`coevolve.envs.base.turn_checks`): after each turn the probe results
  equal those of a fresh server that ran the ground truth (played once per task, cached), and the ground truth's
  results are among the agent's. Without one, `reward_tool` called with no arguments when the episode is scored:
  1.0 when it returns a number >= 0.5.
- Logs: the SDK's and the server's (a traceback when a tool raises, a stdio server's stderr) go to the `mcp`
  logger, which a run writes to run.log; outside a run they are dropped (the observations carry the errors).
"""

from __future__ import annotations

import collections
import copy
import json
import re
import time
import warnings
import weakref
from typing import Any, Mapping, Sequence

from coevolve.calls import DEFAULT_LIMITS, CallError, CallLimits, parse_call
from coevolve.envs import ENVS
from coevolve.envs.base import ENV_FAILURE, Env, ToolEpisode
from coevolve.envs.mcp_bridge import (DEFAULT_MAX_RESULT_CHARS, DEFAULT_MAX_SESSIONS, MAX_TOOLS, START_TIMEOUT_S,
                                      ServerSource,
                                      Session, SessionLost, Slots, result_text, route_logs)
from coevolve.envs.mcp_worker import WorkerSession, mcp_worker
from coevolve.envs.user_env import EnvDefinitionError, doc_parts, load_task_file
from coevolve.envs.python_worker import DEFAULT_CALL_TIMEOUT_S
from coevolve.records import Check, Message, Score, Task, ToolCall, canonical_json
from coevolve.states import ARGUMENT_STATES, StatePatterns

__all__ = ["MCPEnv", "MCPEpisode", "check_mcp_env", "result_text"]
TRUTH_CACHE_SIZE = 512
TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
"""A tool name as the MCP specification allows it; any other (a newline, a space, 300 characters) is refused."""


# --------------------------------------------------------------------------------------------------------------
# Results and tools
# --------------------------------------------------------------------------------------------------------------


def _tool_doc(name: str, description: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    """A tool as the agent sees it. The SDK's `MCPServer` sends a function's whole docstring as the description
    and no argument descriptions; a Google- or NumPy-style docstring is split as env `python` splits it: its
    first paragraph describes the tool, its `Args:` fill the arguments that have no description of their own.
    Calls are checked against the schema as the server sent it."""
    summary, described = doc_parts(description)
    parameters = copy.deepcopy(dict(schema))
    parameters.pop("title", None)  # pydantic's "add_cardArguments", "Title": annotations, tokens the agent pays for
    for argument, value in (parameters.get("properties") or {}).items():
        if isinstance(value, dict):
            value.pop("title", None)
            if not value.get("description") and described.get(argument):
                value["description"] = described[argument]
    return {"name": name, "description": summary or description, "parameters": parameters}


# --------------------------------------------------------------------------------------------------------------
# The env
# --------------------------------------------------------------------------------------------------------------


@ENVS.register("mcp")
class MCPEnv(Env):
    """`MCPEnv(server="package.module:ATTR" | command=[...], tasks="tasks.jsonl", split=None, state_calls=(),
    reward_tool=None)`: see the module docstring."""

    user_tools = True  # checked at a run's start (`coevolve.run_setup.env_check_warnings`)

    states: StatePatterns = ARGUMENT_STATES
    """Which state a call acts on: its tool and the arguments it gave (`coevolve.states`)."""

    def __init__(self, server: Any = None, command: Sequence[str] | None = None, tasks: str | None = None,
                 split: str | None = None, state_calls: Sequence[str] = (), reward_tool: str | None = None,
                 call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S, max_result_chars: int = DEFAULT_MAX_RESULT_CHARS,
                 max_sessions: int | None = None, cwd: str | None = None,
                 limits: CallLimits = DEFAULT_LIMITS, scope: str = "exposed", isolate: bool = True,
                 max_tools: int = MAX_TOOLS, start_timeout_s: float = START_TIMEOUT_S) -> None:
        """`scope` is taken for the CLI's sake: an MCP server's tools are all exposed in every turn. `isolate`:
        an in-process server named `package.module:ATTR` runs in a worker process (`coevolve.envs.mcp_worker`).
        `max_tools`: a server listing more tools is refused."""
        if split is not None and split not in ("train", "test"):
            raise ValueError(f"split must be train or test, got {split!r}")
        if not call_timeout_s > 0 or not max_result_chars > 0 or not start_timeout_s > 0:
            raise ValueError("call_timeout_s, start_timeout_s and max_result_chars must be positive")
        if max_sessions is not None and (isinstance(max_sessions, bool) or not isinstance(max_sessions, int)
                                         or max_sessions < 1):
            raise EnvDefinitionError(f"env.options.max_sessions: a whole number of at least 1, got {max_sessions!r}")
        if isinstance(max_tools, bool) or not isinstance(max_tools, int) or max_tools < 1:
            raise EnvDefinitionError(f"env.options.max_tools: a whole number of at least 1, got {max_tools!r}")
        if isinstance(state_calls, str) or not all(isinstance(call, str) for call in state_calls):
            raise EnvDefinitionError("env.options.state_calls: a list of call strings, e.g. [\"list_notes()\"]")
        route_logs()
        self.source = ServerSource(server, command, cwd)
        self.name = f"mcp:{self.source.label}"
        self.split, self.limits, self.reward_tool = split, limits, reward_tool
        self.call_timeout_s, self.max_result_chars = float(call_timeout_s), int(max_result_chars)
        self.start_timeout_s = float(start_timeout_s)
        kind = "stdio" if self.source.command else "in-process"
        self.slots = Slots(max_sessions or DEFAULT_MAX_SESSIONS[kind])
        self.max_tools = max_tools
        self.worker = None
        if isolate and isinstance(server, str):
            self.worker = mcp_worker(self.call_timeout_s)
        elif isolate and server is not None:
            warnings.warn(f"{self.name}: a server given as an object cannot be sent to a worker process (name it as "
                          "package.module:ATTR): its tools run in this process, where one that exits or blocks "
                          "ends or stalls the run", RuntimeWarning, stacklevel=2)
        no_reward = None if reward_tool else "env.options.reward_tool is not set"
        self._tasks = load_task_file(tasks, self.name, no_reward, checks=True) if tasks else []
        for task in self._tasks:
            problem = self.source.reset_problem(task.initial_state)
            if problem:
                raise EnvDefinitionError(f"task {task.name!r}: {problem}")
        self.docs, self._validators = self._list_tools(self._tasks[0].initial_state if self._tasks else {})
        self.state_calls = tuple(state_calls)
        for text in self.state_calls:
            self._refuse_bad_call(text, "env.options.state_calls")
        for task in self._tasks:
            for turn in task.ground_truth:
                for text in turn:
                    self._refuse_bad_call(text, f"task {task.name!r}: ground truth")
            for text in task.meta.get("checks", ()):
                self._refuse_bad_call(text, f"task {task.name!r}: checks")
        self._truth: collections.OrderedDict[str, tuple] = collections.OrderedDict()

    # -- tools and calls ---------------------------------------------------------------------------------------

    def _list_tools(self, reset: Mapping[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        import jsonschema

        try:
            session = self.open(reset)
        except SessionLost as error:
            raise EnvDefinitionError(f"{self.name}: {error}") from None
        try:
            listed = session.list_tools()
        except SessionLost as error:
            raise EnvDefinitionError(f"{self.name}: listing its tools failed: {error}") from None
        finally:
            session.close()
        if len(listed) > self.max_tools:
            raise EnvDefinitionError(f"{self.name} lists more than {self.max_tools} tools: every tool is in every "
                                     "prompt; offer fewer, or raise env.options.max_tools")
        docs, validators = [], {}
        for tool in listed:
            name, schema = tool["name"], tool["input_schema"]
            if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
                raise EnvDefinitionError(f"{self.name}: tool name {str(name)[:80]!r} is not a name the agent can call "
                                         "(MCP's rule: 1-128 of A-Z a-z 0-9 _ - .)")
            try:
                validator = jsonschema.validators.validator_for(schema)
                validator.check_schema(schema)
            except jsonschema.SchemaError as error:
                raise EnvDefinitionError(f"{self.name}: tool {name!r} has an invalid input schema: "
                                         f"{error.message[:200]}") from None
            except (jsonschema.exceptions.RefResolutionError, RecursionError, TypeError, ValueError) as error:
                raise EnvDefinitionError(f"{self.name}: tool {name!r}: its input schema cannot be checked "
                                         f"({type(error).__name__})") from None
            if name == self.reward_tool:
                continue
            docs.append(_tool_doc(name, tool["description"] or tool["title"] or name, schema))
            # An argument the schema does not name is the agent's invention (the SDK's servers would drop it in
            # silence): refused, unless the schema itself allows more.
            strict = {**schema, "additionalProperties": False} if "additionalProperties" not in schema else schema
            validators[name] = validator(strict)
        if self.reward_tool and self.reward_tool not in {tool["name"] for tool in listed}:
            raise EnvDefinitionError(f"env.options.reward_tool: {self.name} has no tool {self.reward_tool!r}")
        if not docs:
            raise EnvDefinitionError(f"{self.name} lists no tool to offer the agent")
        return docs, validators

    def checked_call(self, raw: Any) -> ToolCall | str:
        """The call, parsed and checked against its tool's input schema, or why it cannot be sent."""
        from jsonschema.exceptions import best_match

        parsed = parse_call(raw, self.limits)
        if isinstance(parsed, CallError):
            return parsed.reason
        validator = self._validators.get(parsed.name)
        if validator is None:
            return f"no tool named {parsed.name!r}; the tools are {', '.join(sorted(self._validators))}"
        if parsed.positional:
            return f"{parsed.name} takes named arguments only, e.g. {parsed.name}(name=value)"
        arguments = json.loads(json.dumps(dict(parsed.arguments)))  # tuples become lists, as on the wire
        error = best_match(validator.iter_errors(arguments))
        if error is not None:
            where = ".".join(str(part) for part in error.absolute_path)
            return f"{parsed.name}: {f'argument {where}: ' if where else ''}{error.message[:300]} (its input schema)"
        return ToolCall(parsed.name, arguments)

    def _refuse_bad_call(self, text: str, where: str) -> None:
        checked = self.checked_call(text)
        if isinstance(checked, str):
            raise EnvDefinitionError(f"{where} call {text[:120]!r}: {checked}")

    @property
    def max_sessions(self) -> int | None:  # type: ignore[override]
        """Sessions the server may hold at once (`env.options.max_sessions`): a rollout opens no more."""
        return self.slots.limit

    def exploration_problems(self) -> list[str]:
        """The required arguments the offline explorer cannot draw (`coevolve.schemas.unfillable_arguments`)."""
        from coevolve.schemas import unfillable_arguments

        return unfillable_arguments(self.docs)

    def open(self, reset: Mapping[str, Any]) -> "Session | WorkerSession":
        """A session on a server for `reset` (raises `SessionLost` with why when it cannot start): in the env's
        worker process when isolated, else in this one."""
        if self.worker is not None:
            return WorkerSession(self.worker, self.source.label, reset, self.call_timeout_s, self.slots.limit,
                                 self.start_timeout_s)
        started = time.monotonic()
        return Session(self.source.connect(reset, self.start_timeout_s), self.slots, self.call_timeout_s,
                       self.start_timeout_s, started_at=started)

    def run_call(self, session: "Session | WorkerSession", call: ToolCall) -> tuple[str, str | None]:
        """(observation, error) of a checked call; raises `SessionLost` when the server is gone."""
        return session.call(call.name, call.arguments, self.max_result_chars)

    def probes(self, task: Task) -> tuple[str, ...]:
        return self.state_calls + tuple(call for call in task.meta.get("checks", ()) if call not in self.state_calls)

    def probe_state(self, session: Session, task: Task) -> dict[str, str]:
        """The probe calls' results now (raises `SessionLost`)."""
        state = {}
        for text in self.probes(task):
            checked = self.checked_call(text)
            state[text] = checked if isinstance(checked, str) else self.run_call(session, checked)[0]
        return state

    def truth_trace(self, task: Task) -> tuple[list[list[str]], list[dict[str, str]], str | None]:
        """The ground truth played once on a fresh server: each turn's results and probe state after it, and why
        the server failed (None when it did not). Cached per task: a task's truth is a function of it."""
        if task.id in self._truth:
            self._truth.move_to_end(task.id)
            return self._truth[task.id]
        results: list[list[str]] = []
        states: list[dict[str, str]] = []
        try:
            session = self.open(task.initial_state)
        except SessionLost as error:
            return results, states, str(error)
        try:
            for calls in task.ground_truth:
                turn = []
                for text in calls:
                    checked = self.checked_call(text)
                    turn.append(checked if isinstance(checked, str) else self.run_call(session, checked)[0])
                results.append(turn)
                states.append(self.probe_state(session, task))
        except SessionLost as error:
            return results, states, str(error)
        finally:
            session.close()
        self._truth[task.id] = (results, states, None)
        while len(self._truth) > TRUTH_CACHE_SIZE:
            self._truth.popitem(last=False)
        return results, states, None

    def reward(self, session: Session) -> Any:
        """The reward tool's answer as a number (or its text when it is none); raises `SessionLost`."""
        text = self.run_call(session, ToolCall(self.reward_tool, {}))[0]
        try:
            value = json.loads(text)
        except ValueError:
            return text
        if isinstance(value, dict) and len(value) == 1:  # structured output: {"result": 0.8}
            value = next(iter(value.values()))
        return value

    # -- tasks and episodes --------------------------------------------------------------------------------------

    def tasks(self) -> list[Task]:
        return [task for task in self._tasks if self.split is None or task.meta.get("split") == self.split]

    def with_split(self, split: str | None) -> "MCPEnv":
        other = copy.copy(self)
        other.split = split
        return other

    def check_task(self, task: Task) -> str | None:
        """Why a task record from a file cannot run here (its reset, its calls), or None."""
        problem = self.source.reset_problem(task.initial_state)
        if problem:
            return problem
        for text in [call for turn in task.ground_truth for call in turn] + list(task.meta.get("checks", ())):
            checked = self.checked_call(text)
            if isinstance(checked, str):
                return f"call {text[:120]!r}: {checked}"
        return None

    def reset(self, task: Task) -> "MCPEpisode":
        return MCPEpisode(self, task)

    def close(self) -> None:
        """Ends the worker process and every session in it (a later request starts a fresh one)."""
        if self.worker is not None:
            self.worker.close()


class MCPEpisode(ToolEpisode):
    def __init__(self, env: MCPEnv, task: Task) -> None:
        self.env, self.task = env, task
        self.lost: str | None = None
        self.session: Session | None = None
        problem = env.source.reset_problem(task.initial_state)
        if problem:
            self.lost = problem
        else:
            try:
                self.session = env.open(task.initial_state)
            except SessionLost as error:
                self.lost = str(error)
            else:
                weakref.finalize(self, self.session.close)
        self._start()

    def user_messages(self) -> list[Message]:
        return [] if self.done else [dict(message) for message in self.task.turns[self._turn]]

    def _checked(self, raw: Any) -> ToolCall | str:
        return self.env.checked_call(raw)

    def _run(self, call: ToolCall) -> tuple[str, str | None]:
        if self.session is None or self.lost:
            reason = f"the MCP server is gone: {self.lost}"
            return f"Error: {reason}", reason
        try:
            return self.env.run_call(self.session, call)
        except SessionLost as error:
            self.lost = str(error)
            return f"Error: {self.lost}", self.lost

    def _truth_turn(self, turn: int) -> tuple[list[str], dict[str, str]] | None:
        results, states, failed = self.env.truth_trace(self.task)
        if failed:  # the server failed playing the ground truth: the env's failure, said as such
            self.lost = self.lost or f"ground truth: {failed}"
            return None
        return results[turn], states[turn]

    def state(self) -> dict[str, str]:
        if self.session is None or self.lost:
            return {"process": str(self.lost)}
        try:
            return self.env.probe_state(self.session, self.task)
        except SessionLost as error:
            self.lost = str(error)
            return {"process": self.lost}

    def score(self) -> Score:
        checks = list(self.checks)
        if not self.done:
            checks.append(Check(self._turn, "force_terminated", False,
                                f"episode ended at turn {self._turn} of {self.task.num_turns} (force_terminated)"))
        if not any(self.task.ground_truth):
            checks.append(self._reward_check())
        if self.lost:  # the server's failure, not the agent's (`rollout` counts it)
            checks.append(Check(self._turn, ENV_FAILURE, False, self.lost))
        return Score(1.0 if all(check.passed for check in checks) else 0.0, tuple(checks))

    def _reward_check(self) -> Check:
        if self.session is None or self.lost:
            return Check(self._turn, "reward", False, f"no reward: {self.lost}")
        try:
            value = self.env.reward(self.session)
        except SessionLost as error:
            self.lost = str(error)
            return Check(self._turn, "reward", False, f"no reward: {self.lost}")
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0.5
        return Check(self._turn, "reward", ok, f"{self.env.reward_tool}() = {str(value)[:200]!r}")

    def close(self) -> None:
        if self.session is not None:
            self.session.close()


# --------------------------------------------------------------------------------------------------------------
# `coevolve env check mcp:...`
# --------------------------------------------------------------------------------------------------------------


def check_mcp_env(tasks_path: str, state_calls: Sequence[str] = (), **source: Any) -> list[str]:
    """What is wrong with a server and a task file, one plain line each (empty: all is well): the spec, the task
    file, each task's reset and calls (refused when the env is made), then each ground truth played twice on
    fresh servers: it must run, do something, and end the same way both times."""
    from coevolve.envs.user_env import truth_problem

    try:
        env = MCPEnv(tasks=tasks_path, state_calls=state_calls, **source)
    except (EnvDefinitionError, ValueError) as error:
        return [str(error)]
    cause = ("one shared server: each run changes what the next one sees; name a factory that makes a fresh one"
             if env.source.shared is not None else "randomness or the clock without a seed?")
    problems = []
    for task in env.tasks():
        problem = truth_problem(env, task, cause)
        if problem:
            problems.append(f"task {task.name!r}: {problem}")
    if not env.state_calls and not any(task.meta.get("checks") for task in env.tasks()):
        problems.append("no state_calls and no task checks: only the results are compared, never the server's "
                        "state; name read-only probe calls (env.options.state_calls, --state-call)")
    return problems
