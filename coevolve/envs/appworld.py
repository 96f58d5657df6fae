"""AppWorld (Trivedi et al., 2024) behind our `Env` protocol; AppWorld itself runs in its own venv and processes.

The paper's first benchmark: 9 apps (spotify, venmo, gmail, ...) behind 457 APIs, tasks by split (`train`, `dev`,
`test_normal`, `test_challenge`), each task scored by AppWorld's evaluator, a set of pass/fail tests over the
databases' changes and the answer. We report its metrics: TGC (task goal completion, the share of tasks whose
tests all pass) and SGC (scenario goal completion: a scenario, the tasks sharing the id before `_`, counts only
when all its tasks pass) — `goal_completion`.

The boundary. `appworld==0.1.3.post1` pins pydantic 1, which clashes with our stack, so it lives in
`.venv-appworld` (`make appworld-venv`) and runs `appworld_worker.py` there, one process per open episode
(AppWorld's clock and database caches are per process). Requests and replies are JSON lines on the worker's
stdin/stdout. Every request has a deadline; a worker that crashes or misses one is killed, the episode scores 0
with the reason, and the next episode gets a fresh process.

Actions are AppWorld's own interface: Python code cells run by `AppWorld.execute` (its safety guard and per-cell
timeout, in its process, never in ours). To the agent this is one tool, `execute(code=...)`, so every reply format
we support carries it (hermes JSON `{"name": "execute", "arguments": {"code": ...}}`, Python-call strings, or a bare
code cell); outputs are capped at `max_output_chars`. A seed task's ground truth is AppWorld's compiled solution
(train/dev ship it) as one `execute(code=...)` call.

Scores. Seed tasks: AppWorld's evaluator — 1.0 when every test passes, else 0.0; with `dense_reward` the share of
passed tests (a training option; TGC stays binary). Tasks built on an AppWorld world
(synthesized by exploration and validated by `coevolve.validate`: another query from the same start) have no
AppWorld tests: like BFCL's state check, the episode passes when every app's database ends as it does after the
task's solution runs in a fresh world of the same starting task (`is_appworld_task` tells the two apart).

Missing pieces are named with their fix: no venv -> `make appworld-venv`; no data -> `appworld download data` with
the root to use (`AppWorldUnavailable`, the CLI exits 2).
"""

from __future__ import annotations

import ast
import json
from typing import Any, Mapping, Sequence

from coevolve.calls import CallError, parse_call
from coevolve.envs import ENVS
from coevolve.envs.appworld_process import (SPLITS, AppWorldConfig, AppWorldUnavailable, WorkerFailed, WorkerPool,
                                            WorkerProcess, download_hint)
from coevolve.envs.base import ENV_FAILURE, CallInput, Env, Episode
from coevolve.records import Check, Message, Score, Step, Task, ToolCall
from coevolve.states import ARGUMENT_STATES, StatePatterns

__all__ = ["SPLITS", "AppWorldConfig", "AppWorldEnv", "AppWorldEpisode", "AppWorldUnavailable", "WorkerFailed",
           "WorkerPool", "WorkerProcess", "as_call", "check_code", "code_of", "goal_completion", "scenario_of"]

TOOL_NAME = "execute"
EXECUTE_DOC = {
    "name": TOOL_NAME,
    "description": ("Run a Python code cell in AppWorld. `apis.<app>.<api>(...)` calls an app's API and returns its "
                    "response; `print` what you want to see. Variables persist between cells. Start from "
                    "`print(apis.api_docs.show_app_descriptions())` and `apis.api_docs.show_api_doc(app_name=..., "
                    "api_name=...)`; finish with `apis.supervisor.complete_task(answer=...)`."),
    "parameters": {"type": "dict", "properties": {"code": {"type": "string", "description": "Python code to run"}},
                   "required": ["code"]},
}
_FORBIDDEN_CALLS = frozenset({"eval", "exec", "compile", "open", "getattr", "setattr", "delattr", "globals",
                              "locals", "vars", "__import__", "input", "breakpoint", "exit", "quit"})



# ---------------------------------------------------------------------------------------------------------------
# Metrics: pure functions
# ---------------------------------------------------------------------------------------------------------------


def scenario_of(task_id: str) -> str:
    """AppWorld's scenario (its 'generator') of a task: `82e2fac_1` -> `82e2fac`."""
    return task_id.split(":")[0].rsplit("_", 1)[0]


def goal_completion(per_task: Mapping[str, float]) -> dict[str, float]:
    """TGC = mean task success (per task: 0/1, or the success rate over K samples); SGC = share of scenarios whose
    every task is solved (success 1)."""
    if not per_task:
        return {"tgc": 0.0, "sgc": 0.0, "tasks": 0, "scenarios": 0}
    scenarios: dict[str, list[bool]] = {}
    for task_id, value in per_task.items():
        scenarios.setdefault(scenario_of(task_id), []).append(value >= 1.0)
    scenarios_solved = sum(all(solved) for solved in scenarios.values())
    return {"tgc": sum(per_task.values()) / len(per_task), "sgc": scenarios_solved / len(scenarios),
            "tasks": len(per_task), "scenarios": len(scenarios)}


# ---------------------------------------------------------------------------------------------------------------
# Actions: code cells, checked by syntax tree only (never run here)
# ---------------------------------------------------------------------------------------------------------------


def code_of(call: CallInput) -> str | CallError:
    """The code cell an agent's call carries: `execute(code=...)` as a ToolCall, a JSON object or a Python-call
    string, or a bare cell (a reply's code block)."""
    if isinstance(call, str):
        text = call.strip()
        if text.startswith("```"):
            text = text.strip("`")
            text = (text.split("\n", 1)[1] if "\n" in text else "").strip()
        if text.startswith("{") or text.startswith(f"{TOOL_NAME}(") or text.startswith(f"[{TOOL_NAME}("):
            call = parse_call(text[1:-1] if text.startswith("[") and text.endswith("]") else text)
            if isinstance(call, CallError):
                return call
        else:
            return text
    if isinstance(call, Mapping):
        call = parse_call(call)
        if isinstance(call, CallError):
            return call
    if call.name != TOOL_NAME:
        return CallError(f"unknown tool {call.name!r}: AppWorld has one tool, {TOOL_NAME}(code=...)")
    code = call.arguments.get("code", call.positional[0] if call.positional else None)
    if not isinstance(code, str):
        return CallError(f"{TOOL_NAME} needs a string argument `code`")
    return code


def as_call(code: str) -> str:
    """A code cell as a ground-truth call string: `execute(code='...')`."""
    return ToolCall(TOOL_NAME, {"code": code}).to_python()


def check_code(code: str, max_chars: int = 8000) -> tuple[str, str] | None:
    """Why a synthesized task's code cell may not be admitted, as (rejection code, detail), or None.

    AppWorld runs code behind its own safety guard, in its own process; this is the earlier, stricter gate for what
    a task may teach: parseable Python, no imports, no private or magic names, no introspection or file access."""
    if len(code) > max_chars:
        return "too_large", f"a code cell of {len(code)} characters, at most {max_chars}"
    try:
        tree = ast.parse(code)
    except SyntaxError as error:
        return "unparseable", f"not Python ({error.msg}, line {error.lineno})"
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            return "unsafe_argument", "imports a module (the cell's namespace already has what tasks need)"
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
        if name is not None and name.startswith("_"):
            return "private_function", f"uses the private or magic name {name!r}"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FORBIDDEN_CALLS:
            return "unsafe_argument", f"calls {node.func.id}()"
    return None


# ---------------------------------------------------------------------------------------------------------------
# Env and episode
# ---------------------------------------------------------------------------------------------------------------


def is_appworld_task(task: Task) -> bool:
    """True for AppWorld's own tasks (scored by its evaluator), False for tasks built on one of its worlds (a
    synthesized task asks something else from the same start: scored by the state check)."""
    return task.name == task.initial_state.get("appworld_task")


def _with_fix(error: AppWorldUnavailable, config: AppWorldConfig) -> AppWorldUnavailable:
    return AppWorldUnavailable(f"{error}: run `{download_hint(config.data_root(), config.interpreter())}`")


def opening_message(specs: Mapping[str, Any]) -> str:
    """The task as AppWorld's own prompts state it: the supervisor (whose accounts the agent uses), the request."""
    supervisor = specs.get("supervisor") or {}
    name = " ".join(str(supervisor.get(key) or "") for key in ("first_name", "last_name")).strip()
    who = (f"I am {name} (email {supervisor.get('email')}, phone {supervisor.get('phone_number')}). "
           if name else "")
    return f"{who}Task: {specs['instruction']}"


@ENVS.register("appworld")
class AppWorldEnv(Env):
    name = "appworld"
    states: StatePatterns = ARGUMENT_STATES
    """Which state a call acts on: its tool and the arguments it gave (`coevolve.states`)."""
    empty_observations = ("Execution successful.",)
    plain_arguments = False  # the one tool's argument is code: `check_call` is validation's gate for it
    """AppWorld's answer to a cell that printed nothing: for validation, no result (`no_effect` if nothing changed)."""

    def __init__(self, split: str = "train", scope: str | None = None, **options: Any) -> None:
        del scope  # the CLI passes BFCL's dispatch scope to every env; AppWorld dispatches code, not tool names
        self.config = AppWorldConfig(split=split, **options)
        self.pool = WorkerPool(self.config)
        self._tasks: list[Task] | None = None
        self._reference: dict[str, Any] = {}  # synthetic task id -> final state of its solution

    def tasks(self) -> list[Task]:
        if self._tasks is None:
            worker = self.pool.acquire()
            try:
                specs = worker.request("tasks", timeout_s=self.config.open_timeout_s, split=self.config.split,
                                       limit=self.config.limit)
            except AppWorldUnavailable as error:
                raise _with_fix(error, self.config) from None
            finally:
                self.pool.release(worker)
            self._tasks = [self._task(item) for item in specs]
        return list(self._tasks)

    def _task(self, specs: Mapping[str, Any]) -> Task:
        truth = [as_call(specs["solution"])] if specs.get("solution") else []
        return Task.create(self.name, specs["task_id"], [[{"role": "user", "content": opening_message(specs)}]],
                           {"appworld_task": specs["task_id"]}, [truth],
                           {"split": self.config.split, "scenario": scenario_of(specs["task_id"])})

    def reset(self, task: Task) -> "AppWorldEpisode":
        return AppWorldEpisode(self, task)

    def check_call(self, call: ToolCall) -> tuple[str, str] | None:
        """The validator's argument gate for this env's one tool (its argument is code, not a value)."""
        code = code_of(call)
        if isinstance(code, CallError):
            return "unparseable", code.reason
        return check_code(code)

    def reference_state(self, task: Task) -> Any:
        """A synthesized task's target: the final state of its solution in a fresh world (computed once)."""
        if task.id not in self._reference:
            episode = AppWorldEpisode(self, task)
            for turn in task.ground_truth:
                episode.act(list(turn))
            failure = episode.failure
            state = episode.state()
            episode.close()
            if failure is not None:
                raise RuntimeError(f"the solution of task {task.id} could not run: {failure}")
            self._reference[task.id] = state
        return self._reference[task.id]

    def metrics(self, per_task: Mapping[str, float]) -> dict[str, float]:
        """AppWorld's own metrics over an evaluation's per-task successes (keyed by AppWorld task id)."""
        return goal_completion(per_task)

    def close(self) -> None:
        self.pool.shutdown()


class AppWorldEpisode(Episode):
    """One world of one task in its own worker; single-turn (AppWorld tasks are one request)."""

    def __init__(self, env: AppWorldEnv, task: Task) -> None:
        self.env, self.task = env, task
        self.config = env.config
        self.failure: str | None = None
        self._done = False
        self._ended = False
        self._score: Score | None = None
        self._replies = 0
        self._worker: WorkerProcess | None = env.pool.acquire()
        world = str(task.initial_state.get("appworld_task", ""))
        try:
            self._call("open", self.config.open_timeout_s, task_id=world, timeout_seconds=self.config.step_timeout_s)
        except AppWorldUnavailable as error:
            self.close()
            raise _with_fix(error, self.config) from None
        except (WorkerFailed, RuntimeError) as error:  # a crashed start or an unknown world: scored 0, run goes on
            self.failure = self.failure or f"AppWorld could not open world {world!r}: {error}"
            self.close()

    # -- protocol -------------------------------------------------------------------------------------------
    def _call(self, op: str, timeout_s: float, **arguments: Any) -> Any:
        if self._worker is None:
            raise WorkerFailed(self.failure or "the episode is closed")
        try:
            return self._worker.request(op, timeout_s, **arguments)
        except WorkerFailed as error:
            self.failure = str(error)
            self.close()
            raise

    @property
    def turn_index(self) -> int:
        return 1 if self._ended else 0

    @property
    def done(self) -> bool:
        return self._done or self._ended or self.failure is not None

    def user_messages(self) -> list[Message]:
        return [dict(message) for message in self.task.turns[0]] if not self._ended else []

    def tools(self) -> list[dict[str, Any]]:
        return [dict(EXECUTE_DOC)]

    def act(self, calls: Sequence[CallInput]) -> tuple[Step, ...]:
        steps, reply = [], self._replies
        self._replies += 1  # one act = one reply of the agent
        for call in calls:
            action = call if isinstance(call, str) else json.dumps(
                call.to_dict() if isinstance(call, ToolCall) else dict(call), ensure_ascii=False, default=str)
            code = code_of(call)
            if isinstance(code, CallError):
                steps.append(Step(self.turn_index, reply, action, None, f"Error: {code.reason}", code.reason))
                continue
            parsed = ToolCall(TOOL_NAME, {"code": code})
            if self.done:
                reason = self.failure or "the task is already completed"
                steps.append(Step(self.turn_index, reply, action, parsed, f"Error: {reason}", reason))
                continue
            try:
                result = self._call("execute", self.config.step_timeout_s + self.config.grace_s, code=code)
            except (WorkerFailed, RuntimeError) as error:
                steps.append(Step(self.turn_index, reply, action, parsed, f"Error: {error}", str(error)))
                continue
            output = _capped(result["output"], self.config.max_output_chars)
            error = _last_line(output) if result["failed"] else None
            steps.append(Step(self.turn_index, reply, action, parsed, output, error))
            try:
                self._done = bool(self._call("completed", self.config.open_timeout_s))
            except (WorkerFailed, RuntimeError):
                pass
        return tuple(steps)

    def end_turn(self) -> None:
        self._ended = True

    def state(self) -> Any:
        if self.failure is not None:
            return {"failure": self.failure}
        return {"appworld_task": self.task.initial_state.get("appworld_task"),
                "databases": self._call("state", self.config.open_timeout_s)["digest"]}

    def score(self) -> Score:
        if self._score is None:
            self._score = self._compute_score()
            self.close()
        return self._score

    def _compute_score(self) -> Score:
        if self.failure is not None:
            return Score(0.0, (Check(0, ENV_FAILURE, False, self.failure),))
        try:
            if not is_appworld_task(self.task):
                if not any(self.task.ground_truth):
                    return Score(0.0, (Check(0, "state", False, "no solution to compare with (an exploration "
                                                                "prompt, or a task without ground truth)"),))
                final = self.state()
                target = self.env.reference_state(self.task)
                same = final == target
                return Score(1.0 if same else 0.0, (Check(0, "state", same, "" if same else
                             "the databases differ from those the task's solution leaves"),))
            result = self._call("evaluate", self.config.open_timeout_s)
        except (WorkerFailed, RuntimeError) as error:
            return Score(0.0, (Check(0, ENV_FAILURE, False, str(error)),))
        checks = [Check(0, "appworld_test", True, test["requirement"][:200]) for test in result["passes"]]
        checks += [Check(0, "appworld_test", False, f"{test['requirement'][:200]}: {_failure_of(test['trace'])}")
                   for test in result["failures"]]
        total = max(1, result["num_tests"])
        value = (len(result["passes"]) / total if self.config.dense_reward and not result["success"]
                 else float(result["success"]))
        return Score(value, tuple(checks))

    def close(self) -> None:
        worker, self._worker = self._worker, None
        if worker is None:
            return
        if worker.alive:
            try:
                worker.request("close", self.config.open_timeout_s)
            except (WorkerFailed, RuntimeError):
                pass
        self.env.pool.release(worker)

    def __del__(self) -> None:  # an episode dropped unscored must not pin a process
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def _capped(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}\n[... {len(text) - limit} more characters cut]"


def _failure_of(trace: str) -> str:
    """The assertion of a failed AppWorld test (its trace repeats the test's code first)."""
    lines = [line for line in trace.rsplit("----------", 1)[-1].splitlines() if line.strip()]
    return lines[0].strip()[:300] if lines else "failed"


def _last_line(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "execution failed"

