"""BFCL-V3 multi-turn as an environment, scored exactly like the official `multi_turn_checker`.

Data, ground truth, function docs and the eight backend classes come from the `bfcl-eval` package (installed
`--no-deps`; the classes need only `mpmath`). We do not use its executor: `execute_multi_turn_func_call` `eval()`s
the call text and caches instances in module globals keyed by model name and entry id, which is unsafe on model
output and shares state between two episodes of one entry. Here every episode builds fresh instances of its
involved classes from the entry's `initial_config`, and calls are parsed with `coevolve.calls` (ast / JSON, no
evaluation) and dispatched by name to public methods.

Scoring (equal to `bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker`, checked entry by entry in
`tests/test_bfcl_official.py`). At the end of every turn i the ground truth of turn i runs on a shadow set of
instances, then, if the ground truth of turn i is non-empty:
  1. empty-turn rule: the agent must have made at least one call in turn i;
  2. state check: every public attribute of every ground-truth instance equals the agent's instance's;
  3. response check: every result of the ground truth's turn-i calls appears (as a multiset, order-free) among
     the results of all the agent's calls so far, turns 0..i.
An entry scores 1 when every check of every turn passes, else 0. An episode that is abandoned before its last
turn, or whose turn exceeds `max_replies_per_turn` (BFCL's 20-step force-quit), scores 0 (the checker's
`force_terminated`). Results are converted to strings as the official executor does (str as is, dict via
`json.dumps`, anything else via `str`; exceptions as "Error during execution: ...").

Deviations, on purpose:
- Calls whose arguments are not literals (e.g. `cd(folder=pwd())`) are refused; the official executor would
  evaluate the nested call. No ground-truth call in the four categories needs this.
- `scope="exposed"` (the default, for training) dispatches only to functions shown in the turn's tool list:
  the entry's function docs minus `excluded_function`, with miss_func's held-out functions appearing from the
  turn `missed_function` names. `scope="official"` dispatches to every public method of the involved instances,
  as the official executor does; `coevolve eval` uses it so replayed model outputs score as on the leaderboard.
- Per-tool argument guards refuse a few literal arguments that would make a tool compute for minutes
  (`MathAPI.power` with huge integer results, `precision` above 1000 digits); the official executor would hang.
- One library global remains shared: `VehicleControlAPI.get_outside_temperature_from_google` in long-context
  mode writes into and returns the module-level `LONG_WEATHER_EXTENSION` dict. We serialise the result at once,
  so no episode observes another's value.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
import math
import pickle
import zlib
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from collections import OrderedDict
from typing import Any, Callable, Sequence

from coevolve.calls import DEFAULT_LIMITS, CallError, CallLimits, fresh_arguments, parse_call
from coevolve.envs import ENVS
from coevolve.envs.base import Env, Episode
from coevolve.jsonl import jsonl_rows
from coevolve.records import Check, Message, Score, Step, Task, ToolCall, canonical_json
from coevolve.states import DIRECTORY_STATES, StatePatterns

CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
SCOPES = ("exposed", "official")

# The eight backend classes of the multi-turn categories. bfcl-eval's other classes (memory, web search) need
# network access or heavy dependencies and are not part of these categories.
MULTI_TURN_CLASSES = (
    "GorillaFileSystem", "MathAPI", "MessageAPI", "TwitterAPI", "TicketAPI", "TradingBot", "TravelAPI",
    "VehicleControlAPI",
)
HOLDOUT_TURN_MESSAGE = "I have updated some more functions you can choose from. What about now?"
"""BFCL's user message at a miss_func turn whose held-out functions become available."""
MAX_REPLIES_PER_TURN = 20
"""BFCL's MAXIMUM_STEP_LIMIT: more model replies than this in one turn force-quits the entry."""
MAX_PRECISION_DIGITS = 1000


def normalise_category(category: str) -> str:
    name = category if category.startswith("multi_turn_") else f"multi_turn_{category}"
    if name not in CATEGORIES:
        short = ", ".join(c.removeprefix("multi_turn_") for c in CATEGORIES)
        raise ValueError(f"unknown BFCL category {category!r}; choose one of: {short} (with or without multi_turn_)")
    return name


def _data_dir():
    try:
        return resources.files("bfcl_eval") / "data"
    except ModuleNotFoundError:
        raise RuntimeError(
            "bfcl-eval is not installed; run `make venv` (it installs bfcl-eval==2026.3.23 with --no-deps)"
        ) from None


def _backend_config():
    # bfcl-eval's own tables (class -> module, class -> function-doc file, stateless classes): a module of
    # constants, cheap to import.
    from bfcl_eval.constants import executable_backend_config

    return executable_backend_config


@lru_cache(maxsize=None)
def _function_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    doc_file = _backend_config().MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]
    return tuple(row for _, row in jsonl_rows(_data_dir() / "multi_turn_func_doc" / doc_file))


@lru_cache(maxsize=None)
def _backend_class(class_name: str) -> type:
    if class_name not in MULTI_TURN_CLASSES:
        raise ValueError(f"BFCL class {class_name!r} is not one of the multi-turn backends {list(MULTI_TURN_CLASSES)}")
    module = importlib.import_module(_backend_config().CLASS_FILE_PATH_MAPPING[class_name])
    return getattr(module, class_name)


@lru_cache(maxsize=None)
def _public_method_names(class_name: str) -> tuple[str, ...]:
    """Public bound methods of a fresh instance: exactly the names the official executor maps to the class."""
    instance = _backend_class(class_name)()
    return tuple(name for name, _ in inspect.getmembers(instance, predicate=inspect.ismethod) if not name.startswith("_"))


def load_tasks(category: str) -> list[Task]:
    """All entries of one multi-turn category as Tasks (ground truth attached), in the shipped order."""
    category = normalise_category(category)
    data = _data_dir()
    entries = [row for _, row in jsonl_rows(data / f"BFCL_v4_{category}.json")]
    truths = {row["id"]: row["ground_truth"]
              for _, row in jsonl_rows(data / "possible_answer" / f"BFCL_v4_{category}.json")}
    tasks = []
    for entry in entries:
        meta = {
            "category": category,
            "involved_classes": list(entry["involved_classes"]),
            "missed_function": dict(entry.get("missed_function", {})),
            "excluded_function": list(entry.get("excluded_function", [])),
            "long_context": "long_context" in category,
        }
        tasks.append(
            Task.create("bfcl", entry["id"], entry["question"], entry.get("initial_config", {}), truths[entry["id"]], meta)
        )
    return tasks


# --------------------------------------------------------------------------------------------------------------
# Execution: fresh instances, name -> method dispatch, official result strings
# --------------------------------------------------------------------------------------------------------------


def _result_text(result: Any) -> str:
    """The official executor's conversion of a tool's return value into the string the model sees."""
    if type(result) is str:
        return result
    if type(result) is dict:
        try:
            return json.dumps(result)
        except Exception:  # non-serialisable values (e.g. mpmath numbers): the executor falls back to str
            return str(result)
    return str(result)


_GUARDED_PARAMETERS = ("precision", "decimal_places")


@lru_cache(maxsize=None)
def _guarded_signature(class_name: str, method_name: str) -> inspect.Signature | None:
    """The signature of a tool that needs an argument guard, or None for the (many) tools that need none."""
    signature = inspect.signature(getattr(_backend_class(class_name), method_name))
    needs_guard = method_name == "power" or any(name in signature.parameters for name in _GUARDED_PARAMETERS)
    return signature if needs_guard else None


def _guard_arguments(class_name: str, call: ToolCall) -> str | None:
    """Refuse literal arguments that would make a backend tool run for minutes. Returns a reason or None.

    Arguments are bound to parameter names first, so positional and keyword spellings are guarded alike; a call
    that does not bind is left to the tool, which raises the TypeError the official executor would report.
    """
    signature = _guarded_signature(class_name, call.name)
    if signature is None:
        return None
    try:
        bound = signature.bind(None, *call.positional, **dict(call.arguments))
    except TypeError:
        return None
    values = bound.arguments
    for name in _GUARDED_PARAMETERS:
        value = values.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_PRECISION_DIGITS:
            return f"{name} {value} is above the limit of {MAX_PRECISION_DIGITS} digits"
    if call.name == "power":
        base, exponent = values.get("base"), values.get("exponent")
        if isinstance(base, int) and isinstance(exponent, int) and abs(base) > 1 and exponent > 0:
            if exponent * math.log2(abs(base)) > 65_536:  # results past 64 Ki bits only burn CPU and memory
                return "power result would exceed 65536 bits"
    return None


def _load_instances(task: Task) -> dict[str, Any]:
    instances = {}
    long_context = bool(task.meta.get("long_context", False))
    for class_name in task.meta["involved_classes"]:
        instance = _backend_class(class_name)()
        if class_name not in _backend_config().STATELESS_CLASSES:
            # Deep copy: scenario loaders keep references into the config they are given.
            instance._load_scenario(copy.deepcopy(task.initial_state.get(class_name, {})), long_context=long_context)
        instances[class_name] = instance
    return instances


_INSTANCE_BLOBS: dict[str, bytes] = {}
_INSTANCE_BLOBS_MAX = 1024


def _new_instances(task: Task) -> dict[str, Any]:
    """Fresh instances of the task's classes, loaded from its initial state.

    Loading a scenario is the costliest part of a reset, so the first episode of a task pickles its freshly
    loaded instances and later ones unpickle that snapshot: an exact, independent copy (the loaders are
    deterministic; their RNGs are seeded from the config and pickled with it). Only bytes this process made from
    its own objects are ever unpickled; nothing an agent writes reaches pickle.
    """
    # The task id hashes the initial state with sorted keys, but the instances keep the config's key order (a
    # folder lists its entries in that order): the same task read from the data file and from the pool's JSON
    # must not share instances, or `ls()` would answer in an order that depends on what this process saw first.
    key = f"{task.id}:{zlib.crc32(json.dumps(task.initial_state, default=str).encode())}"
    blob = _INSTANCE_BLOBS.get(key)
    if blob is None:
        instances = _load_instances(task)
        if len(_INSTANCE_BLOBS) >= _INSTANCE_BLOBS_MAX:  # bound memory when a run synthesises many tasks
            _INSTANCE_BLOBS.clear()
        _INSTANCE_BLOBS[key] = pickle.dumps(instances, protocol=pickle.HIGHEST_PROTOCOL)
        return instances
    return pickle.loads(blob)


def _method_owner(task: Task) -> dict[str, str]:
    """Method name -> class, later classes overriding earlier ones, as the official executor maps them."""
    owner: dict[str, str] = {}
    for class_name in task.meta["involved_classes"]:
        for method_name in _public_method_names(class_name):
            owner[method_name] = class_name
    return owner


class _Backend:
    """The instances of one episode (or of its shadow ground-truth run) and the dispatch into them."""

    def __init__(self, task: Task) -> None:
        self.instances = _new_instances(task)
        self.owner = _method_owner(task)

    def run(self, call: ToolCall, allowed: frozenset[str] | None) -> tuple[str, str | None]:
        """Execute one parsed call. Returns (observation, error reason or None)."""
        if call.name not in self.owner:
            reason = f"unknown function {call.name!r}"
            return f"Error during execution: {reason}", reason
        if allowed is not None and call.name not in allowed:
            reason = f"function {call.name!r} is not available in this turn"
            return f"Error during execution: {reason}", reason
        guard = _guard_arguments(self.owner[call.name], call)
        if guard is not None:
            return f"Error during execution: {guard}", guard
        method = getattr(self.instances[self.owner[call.name]], call.name)
        positional, arguments = fresh_arguments(call)
        try:
            return _result_text(method(*positional, **arguments)), None
        except Exception as error:  # a tool raising is data for the agent, never a crash of the rollout
            return f"Error during execution: {error}", f"{call.name} raised {type(error).__name__}: {error}"

    def state(self) -> dict[str, dict[str, Any]]:
        """A deep-copied snapshot of every instance's public attributes (what the state check compares)."""
        return copy.deepcopy({
            name: {key: value for key, value in vars(instance).items() if not key.startswith("_")}
            for name, instance in self.instances.items()
        })


def _state_differences(agent: _Backend, truth_state: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """Per class, the public attributes whose values differ from the ground truth's (the official state check:
    every public attribute of the ground-truth instance, compared with `!=` against the agent's)."""
    differences = {}
    for class_name, truth_attributes in truth_state.items():
        agent_instance = agent.instances[class_name]
        differing = [attr for attr, value in truth_attributes.items() if getattr(agent_instance, attr) != value]
        if differing:
            differences[class_name] = differing
    return differences


@dataclass(frozen=True)
class TruthTrace:
    """The ground truth played once on fresh instances: per turn, its results and the public state after it.

    The backends are deterministic (their randomness is seeded from the initial config), so one trace per task
    serves every episode of it; the state snapshots are deep copies and are only ever read.
    """

    results: tuple[tuple[str, ...], ...]
    states: tuple[dict[str, dict[str, Any]], ...]

    @classmethod
    def of(cls, task: Task, limits: CallLimits) -> "TruthTrace":
        backend = _Backend(task)
        results, states = [], []
        for calls in task.ground_truth:
            turn_results = []
            for text in calls:
                parsed = parse_call(text, limits)
                # Ground truth is trusted data but goes through the same parser (every shipped call parses: tested).
                turn_results.append(backend.run(parsed, None)[0] if isinstance(parsed, ToolCall) else parsed.reason)
            results.append(tuple(turn_results))
            states.append(backend.state())
        return cls(tuple(results), tuple(states))


def _missing_results(expected: Sequence[str], produced: Sequence[str]) -> list[str]:
    """Items of `expected` not found in `produced`, each occurrence matched once (official response check)."""
    remaining = list(produced)
    missing = []
    for item in expected:
        try:
            remaining.remove(item)
        except ValueError:
            missing.append(item)
    return missing


# --------------------------------------------------------------------------------------------------------------
# The episode
# --------------------------------------------------------------------------------------------------------------


@dataclass
class _TurnRecord:
    calls: int = 0
    replies: int = 0


class BFCLEpisode(Episode):
    """One multi-turn dialogue over fresh instances. See `coevolve.envs.base` for the protocol."""

    def __init__(self, task: Task, scope: str, max_replies_per_turn: int, limits: CallLimits,
                 truth: Callable[[Task], TruthTrace] | None = None) -> None:
        self.task = task
        self.scope = scope
        self.max_replies_per_turn = max_replies_per_turn
        self.limits = limits
        self.steps: list[Step] = []
        self.checks: list[Check] = []
        self._agent = _Backend(task)
        self._truth_of = truth or (lambda t: TruthTrace.of(t, limits))
        self._truth: TruthTrace | None = None  # fetched at the first turn end: acting alone never pays for it
        self._all_results: list[str] = []  # every result of the agent's calls, all turns (response check)
        self._turn = 0
        self._turn_record = _TurnRecord()
        self._replies = 0
        self._terminated: str | None = None
        missed = task.meta.get("missed_function", {})
        self._released_at = {name: int(turn) for turn, names in missed.items() for name in names}
        self._excluded = frozenset(task.meta.get("excluded_function", ()))
        self._exposed_cache: tuple[int, frozenset[str]] = (-1, frozenset())

    # -- protocol -------------------------------------------------------------------------------------------
    @property
    def turn_index(self) -> int:
        return self._turn

    @property
    def done(self) -> bool:
        return self._terminated is not None or self._turn >= self.task.num_turns

    def user_messages(self) -> list[Message]:
        if self.done:
            return []
        messages = [dict(m) for m in self.task.turns[self._turn]]
        if not messages and self._turn in self._released_at.values():
            messages = [{"role": "user", "content": HOLDOUT_TURN_MESSAGE}]
        return messages

    def tools(self) -> list[dict[str, Any]]:
        """The function docs shown in this turn, in BFCL's order: base docs, then held-out ones as released."""
        return [copy.deepcopy(doc) for doc in self._visible_docs()]

    def new_tools(self) -> list[dict[str, Any]]:
        """Tools released at the start of this turn (miss_func)."""
        return [copy.deepcopy(doc) for doc in self._visible_docs() if self._released_at.get(doc["name"]) == self._turn]

    def exposed_names(self) -> frozenset[str]:
        if self._exposed_cache[0] != self._turn:
            self._exposed_cache = (self._turn, frozenset(doc["name"] for doc in self._visible_docs()))
        return self._exposed_cache[1]

    def act(self, calls: Sequence[Any]) -> tuple[Step, ...]:
        """Run one agent reply's calls in order. Never raises on agent input."""
        if isinstance(calls, (str, bytes)) or not isinstance(calls, Sequence):
            calls = [calls]
        if self.done:
            return tuple(self._refuse(call, "the episode is over") for call in calls)
        if not calls:
            return ()
        record = self._turn_record
        if record.replies >= self.max_replies_per_turn:
            self._terminated = f"turn {self._turn}: more than {self.max_replies_per_turn} replies with calls (force-quit)"
            return tuple(self._refuse(call, self._terminated) for call in calls)
        record.replies += 1
        record.calls += len(calls)
        allowed = self.exposed_names() if self.scope == "exposed" else None
        steps = []
        for raw in calls:
            parsed = parse_call(raw, self.limits)
            if isinstance(parsed, CallError):
                observation, error, call = f"Error during execution: {parsed.reason}", parsed.reason, None
            else:
                call = parsed
                observation, error = self._agent.run(parsed, allowed)
            self._all_results.append(observation)
            steps.append(Step(self._turn, self._replies, _action_text(raw), call, observation, error))
        self._replies += 1
        self.steps.extend(steps)
        return tuple(steps)

    def end_turn(self) -> None:
        """Close the current turn: run its ground truth on the shadow instances and apply the official checks."""
        if self.done:
            return
        turn = self._turn
        truth_calls = self.task.ground_truth[turn]
        if truth_calls:
            if self._truth is None:
                self._truth = self._truth_of(self.task)
            self.checks.extend(self._turn_checks(turn, truth_calls, self._truth))
        self._turn += 1
        self._turn_record = _TurnRecord()

    def score(self) -> Score:
        checks = list(self.checks)
        if self._terminated is not None:
            checks.append(Check(self._turn, "force_terminated", False, self._terminated))
        elif not self.done:
            reason = f"episode ended at turn {self._turn} of {self.task.num_turns} (force_terminated)"
            checks.append(Check(self._turn, "force_terminated", False, reason))
        value = 1.0 if all(check.passed for check in checks) else 0.0
        return Score(value, tuple(checks))

    # -- inspection -------------------------------------------------------------------------------------------
    def state(self) -> dict[str, dict[str, Any]]:
        """Public attributes of the agent's instances (what the state check compares)."""
        return self._agent.state()

    # -- internals --------------------------------------------------------------------------------------------
    def _visible_docs(self) -> list[dict[str, Any]]:
        classes = self.task.meta["involved_classes"]
        docs = [
            doc for class_name in classes for doc in _function_docs(class_name)
            if doc["name"] not in self._excluded and doc["name"] not in self._released_at
        ]
        # BFCL appends a held-out function's doc at the turn it is released, in release order.
        by_name = {doc["name"]: doc for class_name in classes for doc in _function_docs(class_name)}
        released = sorted((turn, name) for name, turn in self._released_at.items() if turn <= self._turn)
        return docs + [by_name[name] for _, name in released if name in by_name]

    def _turn_checks(self, turn: int, truth_calls: Sequence[str], truth: TruthTrace) -> list[Check]:
        if self._turn_record.calls == 0:
            reason = f"turn {turn}: no function call, but the ground truth makes {len(truth_calls)}"
            return [Check(turn, "empty_turn", False, reason)]
        differences = _state_differences(self._agent, truth.states[turn])
        state_reason = "; ".join(f"{cls}: {', '.join(attrs)}" for cls, attrs in differences.items())
        state_check = Check(
            turn, "state", not differences,
            f"turn {turn}: state differs from the ground truth in {state_reason}" if differences else "",
        )
        missing = _missing_results(truth.results[turn], self._all_results)
        response_check = Check(
            turn, "response", not missing,
            f"turn {turn}: {len(missing)} ground-truth result(s) missing from the agent's results, "
            f"e.g. {missing[0][:200]!r}" if missing else "",
        )
        return [state_check, response_check]

    def _refuse(self, raw: Any, reason: str) -> Step:
        return Step(self._turn, self._replies, _action_text(raw), None, f"Error during execution: {reason}", reason)


def _action_text(raw: Any) -> str:
    if isinstance(raw, str):
        return raw[:4096]
    if isinstance(raw, ToolCall):
        return raw.to_python()[:4096]
    try:
        return canonical_json(raw)[:4096]
    except (TypeError, ValueError):
        return repr(raw)[:4096]


# --------------------------------------------------------------------------------------------------------------
# The env
# --------------------------------------------------------------------------------------------------------------


BFCL_SPLITS = ("train", "test")
TEST_SHARE, SPLIT_SEED = 0.5, 42
"""BFCL has no train/test split of its own; ours is AgentEvolver's: half of a category's entries, drawn with seed 42."""


def bfcl_split(tasks: Sequence[Task], split: str, test_share: float = TEST_SHARE, seed: int = SPLIT_SEED
               ) -> list[Task]:
    """The `split` part of a category's tasks: the entries, ordered by name, shuffled by `random.Random(seed)`;
    the first round(test_share x n) form `test`, the rest `train` (each kept in the shipped order)."""
    import random

    if split not in BFCL_SPLITS:
        raise ValueError(f"unknown BFCL split {split!r}; choose one of {BFCL_SPLITS} (or none: every entry)")
    if not 0.0 < test_share < 1.0:
        raise ValueError(f"test_share must lie in (0, 1), got {test_share!r}")
    names = sorted(task.name for task in tasks)
    random.Random(seed).shuffle(names)
    test = set(names[:round(test_share * len(names))])
    return [task for task in tasks if (task.name in test) == (split == "test")]


def _depth(value: Any, limit: int = 65) -> int:
    """Nesting depth of a JSON-like value, counted up to `limit` (deeper values stop there)."""
    if limit <= 0 or not isinstance(value, (dict, list)):
        return 0
    items = value.values() if isinstance(value, dict) else value
    return 1 + max((_depth(item, limit - 1) for item in items), default=0)


@ENVS.register("bfcl")
class BFCLEnv(Env):
    """BFCL-V3 multi-turn: `BFCLEnv(category="multi_turn_base")`; tasks in the shipped order, all of them, or one
    half of them with `split="train"` / `split="test"` (`bfcl_split`: seeded, disjoint)."""

    name = "bfcl"
    states: StatePatterns = DIRECTORY_STATES
    """Which state a call acts on: the working directory, the start or a folder below it (`coevolve.states`)."""

    def __init__(
        self,
        category: str = "multi_turn_base",
        scope: str = "exposed",
        max_replies_per_turn: int = MAX_REPLIES_PER_TURN,
        limits: CallLimits = DEFAULT_LIMITS,
        truth_cache_size: int = 512,
        split: str | None = None,
        test_share: float = TEST_SHARE,
        split_seed: int = SPLIT_SEED,
    ) -> None:
        if scope not in SCOPES:
            raise ValueError(f"unknown dispatch scope {scope!r}; choose one of {SCOPES}")
        if split is not None:
            bfcl_split([], split, test_share, split_seed)  # checks the split's name and share now
        self.split, self.test_share, self.split_seed = split, test_share, split_seed
        self.category = normalise_category(category)
        self.scope = scope
        self.max_replies_per_turn = max_replies_per_turn
        self.limits = limits
        self._tasks: list[Task] | None = None
        self.truth_cache_size = truth_cache_size
        self._truth_cache: OrderedDict[str, TruthTrace] = OrderedDict()  # task id -> trace, least recent first

    def tasks(self) -> list[Task]:
        if self._tasks is None:
            tasks = load_tasks(self.category)
            self._tasks = bfcl_split(tasks, self.split, self.test_share, self.split_seed) if self.split else tasks
        return list(self._tasks)

    def check_task(self, task: Task) -> str | None:
        """Why a task record from a file (`env.tasks_file`, `eval --tasks`) cannot run here, or None: its classes
        must be BFCL's multi-turn backends and its initial state an object of objects, at most 64 levels deep."""
        classes = task.meta.get("involved_classes")
        if not isinstance(classes, list) or not classes or not all(isinstance(name, str) for name in classes):
            return "meta.involved_classes must list the BFCL classes the task uses"
        unknown = [name for name in classes if name not in MULTI_TURN_CLASSES]
        if unknown:
            return f"meta.involved_classes names {unknown[:3]}, not BFCL multi-turn classes ({', '.join(MULTI_TURN_CLASSES)})"
        wrong = [name for name, value in task.initial_state.items() if not isinstance(value, dict)]
        if wrong:
            return f"initial_state[{wrong[0]!r}] must be an object (the class's scenario)"
        if _depth(task.initial_state) > 64:
            return "initial_state is nested deeper than 64 levels"
        return None

    def reset(self, task: Task) -> BFCLEpisode:
        if task.env != self.name:
            raise ValueError(f"task {task.name!r} belongs to env {task.env!r}, not {self.name!r}")
        return BFCLEpisode(task, self.scope, self.max_replies_per_turn, self.limits, self.truth_trace)

    def truth_trace(self, task: Task) -> TruthTrace:
        """The task's ground-truth trace, computed once and kept for the next `truth_cache_size` tasks."""
        trace = self._truth_cache.get(task.id)
        if trace is None:
            trace = self._truth_cache[task.id] = TruthTrace.of(task, self.limits)
            while len(self._truth_cache) > self.truth_cache_size:
                self._truth_cache.popitem(last=False)
        else:
            self._truth_cache.move_to_end(task.id)
        return trace
