"""Validation by execution: which candidates may join D_{t+1} (CoEvolve, arXiv 2604.15840, §3 "task validation").

The paper executes each abstracted task in the environment and keeps only the valid ones; its ablation shows that
skipping this hurts. A candidate is untrusted input (an LLM, or a file, wrote it). It is accepted only when every
check below passes; otherwise its `Verdict` lists a reason `code: detail` for each failed check of the first
stage that failed (later stages do not run).

Stage 1, shape and safety (nothing runs):
    malformed          not JSON / not a candidate object / wrong env / empty query or solution
    too_large          more than `max_solution_calls` calls, or a query, intent, call or initial state over its limit
    private_function   a call to a name starting with `_` (private or magic methods)
    unparseable        a call that is not one call of a name with literal arguments (`coevolve.calls`: ast, never
                       evaluated), e.g. code injected as an argument expression
    unknown_function   a name the env does not expose for this task
    path_escape        a string argument that is an absolute or home path, has a `..` segment, a backslash or NUL
    unsafe_argument    a string argument with code or shell in it (`__import__`, `$(`, backticks, `; rm`, ...):
                       harmless to our dispatch, but a task that teaches it is not one we want
    An env whose tool arguments are not plain values checks them itself (`env.check_call(call) -> (code, detail)
    | None`, replacing the two argument checks above): AppWorld's `execute(code=...)` cells are parsed with `ast`
    and refused for imports, private names or introspection (`coevolve.envs.appworld.check_code`). An env may also
    name its own phrasings of an empty result (`env.empty_observations`, AppWorld's "Execution successful.").
Stage 2, duplicates:
    duplicate          a known task (the pool, and what this validator accepted before) with the same starting
                       point has `task_similarity` >= `dedup_threshold`; or, after execution, one of them gives
                       the same results and final state (an equivalent solution: `ls(a=False)` and `ls()`)
Stage 3, execution (a fresh episode from the candidate's initial state, one call per reply, state after each):
    execution_error    a call failed (env refusal, tool exception, or the tool's own error answer); names the call
    no_effect          the final state equals the initial one and either no call returned anything, or the
                       solution changed the state and undid it (touch then rm): nothing to ask for
    redundant          a call that changes nothing repeats an earlier call's answer (`ls(a=True)` then `ls()`)
    not_reproducible   a second fresh execution gives other results or another final state
    order_free         a task made for an order of tools (`cd > ls`, focus of `signals.unexplored_orders`) whose
                       last call gives the same answer and makes the same change without the order's earlier
                       calls (`touch(file_name='a')` then `touch(file_name='b')`): it teaches no order; or made
                       for an action state (`cat@folder`, `signals.unexplored_states`) whose last call does the
                       same alone, from the start: it does not need the state
    unsolvable         the env's own score of the solution (its checks, with the solution as ground truth) < 1
    held_out           the same task as one of the held-out set (its id, or its start and first query): D_t never
                       holds a held-out task (an equality test only; nothing is learnt from the held-out set)

`task_similarity` = (query_similarity + solution_similarity) / 2, where query_similarity is the Jaccard index of
the normalised queries' word sets and solution_similarity is difflib's ratio 2M/T over the sequences of
normalised calls (`pool.normalise_call`); the starting point is (env, initial state, metadata without per-task
size notes). `check_execution=False` is the paper's "no validation" ablation: stages 1 and 2 still run (a hostile
candidate is never admitted), stage 3 does not.

The accepted candidate becomes a `Task` whose ground truth is its solution, so the env scores it with the same
state and response checks as BFCL's own tasks.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import time
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, Sequence

from coevolve.calls import CallError, CallLimits, parse_call
from coevolve.envs.base import EMPTY_RESULTS, Env, step_failure
from coevolve.pool import normalise_call, normalise_query
from coevolve.records import Candidate, Provenance, Task, ToolCall, Verdict, canonical_json, content_hash
from coevolve.signals import PATTERN_SEPARATOR
from coevolve.states import is_state_pattern

REJECTION_CODES = ("malformed", "too_large", "private_function", "unparseable", "unknown_function", "path_escape",
                   "unsafe_argument", "duplicate", "execution_error", "no_effect", "redundant", "not_reproducible",
                   "order_free", "unsolvable", "held_out")
PER_TASK_META_KEYS = ("num_calls",)
"""Metadata that describes a task's solution rather than its starting point (BFCL-lite's size note)."""

DEFAULT_UNSAFE_PATTERNS = (
    r"__\w+__", r"\b(?:import|exec|eval|compile|getattr|setattr|globals|locals|open)\s*\(",
    r"\bos\.(?:system|popen|remove|unlink|rmdir|environ|exec\w*|spawn\w*)\b",
    r"\bsubprocess\b", r"\$\(", r"`", r"<\s*script", r"[;&|]\s*(?:rm|curl|wget|sh|bash|python)\b",
    r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]",
)
_PATH_ESCAPE = re.compile(r"^(?:/|~|[A-Za-z]:)|(?:^|/)\.\.(?:/|$)|\\|\x00")
_CALL_HEAD = re.compile(r"^\s*\[?\s*([A-Za-z_][A-Za-z0-9_]*)\s*\(")
_WORD = re.compile(r"[a-z0-9]+(?:['._-][a-z0-9]+)*")


@dataclass(frozen=True)
class ValidationConfig:
    dedup_threshold: float = 0.9
    """A candidate whose `task_similarity` to a known task from the same start reaches this is a duplicate."""
    max_solution_calls: int = 3
    """Longest solution accepted (the abstractors write none longer)."""
    max_query_chars: int = 1000
    max_intent_chars: int = 300
    max_call_chars: int = 512
    max_state_bytes: int = 262_144
    check_execution: bool = True
    """False: the paper's no-validation ablation (shape, safety and duplicate checks only)."""
    unsafe_patterns: tuple[str, ...] = DEFAULT_UNSAFE_PATTERNS

    def __post_init__(self) -> None:
        if not 0.0 < self.dedup_threshold <= 1.0:
            raise ValueError(f"dedup_threshold must lie in (0, 1], got {self.dedup_threshold!r}")
        if min(self.max_solution_calls, self.max_query_chars, self.max_call_chars, self.max_state_bytes) < 1:
            raise ValueError(f"validation limits must be positive: {self}")


# ---------------------------------------------------------------------------------------------------------------
# Similarity: pure functions
# ---------------------------------------------------------------------------------------------------------------


def query_words(query: str) -> frozenset[str]:
    return frozenset(_WORD.findall(normalise_query(query)))


def query_similarity(a: str, b: str) -> float:
    """Jaccard index |A ∩ B| / |A ∪ B| of the normalised queries' word sets (1.0 when both are empty)."""
    words_a, words_b = query_words(a), query_words(b)
    union = words_a | words_b
    return len(words_a & words_b) / len(union) if union else 1.0


def solution_similarity(a: Sequence[str], b: Sequence[str]) -> float:
    """difflib's ratio 2M / T over the sequences of normalised calls (M matched calls, T calls in both)."""
    calls_a, calls_b = [normalise_call(c) for c in a], [normalise_call(c) for c in b]
    if not calls_a and not calls_b:
        return 1.0
    return difflib.SequenceMatcher(None, calls_a, calls_b, autojunk=False).ratio()


def task_similarity(query_a: str, solution_a: Sequence[str], query_b: str, solution_b: Sequence[str]) -> float:
    return (query_similarity(query_a, query_b) + solution_similarity(solution_a, solution_b)) / 2


def start_key(env: str, initial_state: Mapping[str, Any], meta: Mapping[str, Any]) -> str:
    """The starting point two tasks must share to be compared (metadata without per-task size notes)."""
    start_meta = {key: value for key, value in meta.items() if key not in PER_TASK_META_KEYS}
    return content_hash({"env": env, "initial_state": initial_state, "meta": start_meta}, length=32)


def _task_query(task: Task) -> str:
    return " ".join(m.get("content", "") for turn in task.turns for m in turn if m.get("role", "user") == "user")


def is_informative(observation: str, empty: Iterable[str] = ()) -> bool:
    """False for an empty result; `empty` adds an env's own phrasings of one (`env.empty_observations`)."""
    text = observation.strip()
    return text not in EMPTY_RESULTS and text not in empty


def _string_values(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _string_values(key)
            yield from _string_values(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _string_values(item)


# ---------------------------------------------------------------------------------------------------------------
# The validator
# ---------------------------------------------------------------------------------------------------------------


def candidate_task(candidate: Candidate, provenance: Provenance | None = None) -> Task:
    """The task a candidate defines: one user turn (the query), its solution as the ground truth."""
    return Task.create(candidate.env, f"syn_{candidate.id[:12]}", [[{"role": "user", "content": candidate.query}]],
                       candidate.initial_state, [list(candidate.solution)], candidate.meta, provenance)


@dataclass(frozen=True)
class Validation:
    """One candidate's outcome: the candidate (None when the payload was not one), the verdict, the task."""

    candidate: Candidate | None
    verdict: Verdict
    task: Task | None = None
    seconds: float = 0.0


class Validator:
    """Validates candidates for one env against the known tasks (see the module docstring)."""

    def __init__(self, env: Env, config: ValidationConfig = ValidationConfig(), known: Iterable[Task] = (),
                 heldout: Sequence[Task] = ()) -> None:
        """`heldout`: tasks a candidate must not be (the same id, or the same start and first query): D_t never
        holds a held-out task, so `loop.d0: explored` cannot end in the overlap refusal after its pass wrote."""
        self.env = env
        self._heldout = list(heldout)
        self.config = config
        self._unsafe = [re.compile(pattern, re.IGNORECASE) for pattern in config.unsafe_patterns]
        self._limits = CallLimits(max_chars=config.max_call_chars)
        self._known: dict[str, list[tuple[str, tuple[str, ...], str]]] = {}  # start -> (query, solution, task id)
        self._known_tasks: dict[str, list[Task]] = {}  # start -> tasks whose outcome is not computed yet
        self._outcomes: dict[str, dict[str, str]] = {}  # start -> outcome hash -> task id
        self.remember(known)

    def remember(self, tasks: Iterable[Task], executed: bool = False) -> None:
        """Known tasks (the pool): later candidates that near-duplicate one of them are refused. `executed`: their
        outcomes are recorded already (tasks this validator accepted)."""
        for task in tasks:
            key = start_key(task.env, task.initial_state, task.meta)
            solution = tuple(call for turn in task.ground_truth for call in turn)
            self._known.setdefault(key, []).append((_task_query(task), solution, task.id))
            if not executed:
                self._known_tasks.setdefault(key, []).append(task)

    def _outcome_of(self, key: str, observations: Sequence[str], final_state: Any) -> str | None:
        """The id of a known task from the same start whose solution gives the same results and final state
        (`ls(a=False)` and `ls()`: different calls, one task). Known tasks are executed once, when a candidate
        first needs them."""
        outcomes = self._outcomes.setdefault(key, {})
        for task in self._known_tasks.pop(key, []):
            solution = tuple(call for turn in task.ground_truth for call in turn)
            probe = Candidate.create(task.env, "", "known", solution, task.initial_state, task.meta)
            _, known_observations, states, _, failure = self._run(probe)
            if failure is None and states:
                outcomes.setdefault(_outcome_hash(known_observations, states[-1]), task.id)
        return outcomes.get(_outcome_hash(observations, final_state))

    def validate(self, item: Candidate | str | Mapping[str, Any], iteration: int | None = None) -> Validation:
        """One candidate (a record, or untrusted JSON text / object) -> its validation; accepted ones are
        remembered, so a later duplicate in the same batch is refused."""
        started = time.perf_counter()
        candidate = item if isinstance(item, Candidate) else None
        if candidate is None:
            candidate, reason = self._read(item)
            if candidate is None:
                raw = item if isinstance(item, str) else _safe_json(item)
                verdict = Verdict(content_hash(raw), False, (f"malformed: {reason}",))
                return Validation(None, verdict, None, time.perf_counter() - started)
        reasons = self._shape(candidate)
        if not reasons:
            reasons = self._calls(candidate)
        if not reasons:
            reasons = self._duplicate(candidate)
        if not reasons and self.config.check_execution:
            reasons = self._execute(candidate)
        if reasons:
            return Validation(candidate, Verdict(candidate.id, False, tuple(reasons)), None,
                              time.perf_counter() - started)
        provenance = Provenance("synthetic", candidate.parent_task_id, candidate.signal, candidate.episode_id,
                                iteration, "accepted", candidate.focus_tool)
        task = candidate_task(candidate, provenance)
        if self._heldout:
            from coevolve.run_setup import heldout_overlap

            shared = heldout_overlap([task], self._heldout)
            if shared:
                reason = f"held_out: the same task as held-out task {shared[0].name[:60]!r}"
                return Validation(candidate, Verdict(candidate.id, False, (reason,)), None,
                                  time.perf_counter() - started)
        self.remember([task], executed=self.config.check_execution)
        return Validation(candidate, Verdict(candidate.id, True, (), task.id), task, time.perf_counter() - started)

    # -- stage 1 ----------------------------------------------------------------------------------------------
    def _read(self, item: str | Mapping[str, Any]) -> tuple[Candidate | None, str]:
        if isinstance(item, str):
            if len(item) > 4 * self.config.max_state_bytes:
                return None, f"payload of {len(item)} characters"
            try:
                item = json.loads(item)
            except ValueError as error:
                return None, f"not JSON ({error.msg})"
        if not isinstance(item, Mapping):
            return None, f"expected a candidate object, got {type(item).__name__}"
        if not isinstance(item.get("solution"), list):
            return None, '"solution" must be a list of call strings'
        try:
            candidate = Candidate.from_dict(item)
        except (TypeError, KeyError) as error:
            return None, f"not a candidate ({str(error)[:160]})"
        return candidate, ""

    def _shape(self, c: Candidate) -> list[str]:
        limits = self.config
        if c.env != self.env.name:
            return [f"malformed: candidate for env {str(c.env)[:40]!r}, validator for {self.env.name!r}"]
        if not isinstance(c.query, str) or not c.query.strip() or not isinstance(c.intent, str):
            return ["malformed: the query must be a non-empty string and the intent a string"]
        if not c.solution or not all(isinstance(call, str) and call.strip() for call in c.solution):
            return ["malformed: the solution must be a non-empty list of call strings"]
        if not isinstance(c.initial_state, Mapping) or not isinstance(c.meta, Mapping):
            return ["malformed: initial_state and meta must be objects"]
        reasons = []
        if len(c.solution) > limits.max_solution_calls:
            reasons.append(f"too_large: {len(c.solution)} calls, at most {limits.max_solution_calls}")
        if len(c.query) > limits.max_query_chars:
            reasons.append(f"too_large: query of {len(c.query)} characters, at most {limits.max_query_chars}")
        if len(c.intent) > limits.max_intent_chars:
            reasons.append(f"too_large: intent of {len(c.intent)} characters, at most {limits.max_intent_chars}")
        for index, call in enumerate(c.solution, start=1):
            if len(call) > limits.max_call_chars:
                reasons.append(f"too_large: call {index} has {len(call)} characters, at most {limits.max_call_chars}")
        try:
            state_bytes = len(canonical_json(c.initial_state).encode("utf-8"))
        except (TypeError, ValueError):
            return reasons + ["malformed: initial_state is not JSON"]
        if state_bytes > limits.max_state_bytes:
            reasons.append(f"too_large: initial state of {state_bytes} bytes, at most {limits.max_state_bytes}")
        return reasons

    def _calls(self, c: Candidate) -> list[str]:
        reasons: list[str] = []
        parsed: list[ToolCall] = []
        for index, text in enumerate(c.solution, start=1):
            head = _CALL_HEAD.match(text)
            if head and head.group(1).startswith("_"):
                reasons.append(f"private_function: call {index} calls {head.group(1)!r}")
                continue
            call = parse_call(text, self._limits)
            if isinstance(call, CallError):
                reasons.append(f"unparseable: call {index} ({text[:80]!r}): {call.reason}")
            else:
                parsed.append(call)
        if reasons:
            return reasons
        try:
            exposed = {doc["name"] for doc in self._reset(c).tools()}
        except Exception as error:  # noqa: BLE001 - an initial state the env cannot load is the candidate's fault
            return [f"malformed: the env cannot start from this initial state ({type(error).__name__}: "
                    f"{str(error)[:160]})"]
        for index, call in enumerate(parsed, start=1):
            if call.name not in exposed:
                reasons.append(f"unknown_function: call {index} calls {call.name!r}, not a tool of this task")
            refusal = self.env.check_call(call) if call.name in exposed else None
            if refusal is not None:
                reasons.append(f"{refusal[0]}: call {index} ({call.name}): {refusal[1]}")
            if not self.env.plain_arguments:  # an env whose arguments are not plain values (AppWorld's code cells)
                continue
            for value in _string_values([dict(call.arguments), list(call.positional)]):
                if _PATH_ESCAPE.search(value):
                    reasons.append(f"path_escape: call {index} ({call.name}) has the path {value[:60]!r}")
                unsafe = next((p.pattern for p in self._unsafe if p.search(value)), None)
                if unsafe is not None:
                    reasons.append(f"unsafe_argument: call {index} ({call.name}) has {value[:60]!r} "
                                   f"(matches {unsafe!r})")
        return reasons

    # -- stage 2 ----------------------------------------------------------------------------------------------
    def _duplicate(self, c: Candidate) -> list[str]:
        known = self._known.get(start_key(c.env, c.initial_state, c.meta), [])
        best, best_id = 0.0, ""
        for query, solution, task_id in known:
            score = task_similarity(c.query, c.solution, query, solution)
            if score > best:
                best, best_id = score, task_id
        if best >= self.config.dedup_threshold:
            return [f"duplicate: similarity {best:.3f} to task {best_id} (threshold {self.config.dedup_threshold})"]
        return []

    # -- stage 3 ----------------------------------------------------------------------------------------------
    def _reset(self, c: Candidate):
        return self.env.reset(candidate_task(c))

    def _run(self, c: Candidate) -> tuple[Any, list[str], list[Any], Any, str | None]:
        """One fresh execution: (episode, observations, states after each call, initial state, failure)."""
        episode = self._reset(c)
        initial = episode.state()
        observations, states = [], []
        for index, text in enumerate(c.solution, start=1):
            steps = episode.act([text])
            failure = next((step_failure(step) for step in steps if step_failure(step) is not None), None)
            observations.extend(step.observation for step in steps)
            states.append(episode.state())
            if failure is not None:
                return episode, observations, states, initial, (
                    f"execution_error: call {index} of {len(c.solution)} ({text[:80]!r}) failed: {failure[:200]}")
        return episode, observations, states, initial, None

    def _order_free(self, c: Candidate, observations: Sequence[str], states: Sequence[Any], initial: Any) -> bool:
        """Whether the solution's last call answers and changes the state the same with the order's earlier calls
        left out (run from the same start): then the order is not what the task needs."""
        if is_state_pattern(c.focus_tool):  # a state's task needs the calls before its last one: drop them all
            order = list(c.solution)
        else:
            order = c.focus_tool.split(PATTERN_SEPARATOR) if c.focus_tool else []
        if len(order) < 2 or len(c.solution) < len(order) or len(observations) != len(c.solution):
            return False
        kept = list(c.solution[:-len(order)]) + [c.solution[-1]]
        _, alone, alone_states, alone_initial, failure = self._run(replace(c, solution=tuple(kept)))
        if failure is not None:
            return False  # without the order the last call fails: it needs the order
        before = states[-2] if len(states) > 1 else initial
        before_alone = alone_states[-2] if len(alone_states) > 1 else alone_initial
        return (alone[-1] == observations[-1]
                and _change(before_alone, alone_states[-1]) == _change(before, states[-1]))

    def _execute(self, c: Candidate) -> list[str]:
        episode, observations, states, initial, failure = self._run(c)
        if failure is not None:
            return [failure]
        if states[-1] == initial:
            if any(state != initial for state in states[:-1]):
                return ["no_effect: the solution changes the state and undoes the change; nothing is left to ask for"]
            empty = self.env.empty_observations
            if not any(is_informative(observation, empty) for observation in observations):
                return ["no_effect: the solution neither changes the state nor returns anything"]
        for index, observation in enumerate(observations):
            before = states[index - 1] if index else initial
            if states[index] == before and observation in observations[:index]:
                earlier = observations.index(observation) + 1
                return [f"redundant: call {index + 1} changes nothing and repeats the answer of call {earlier}"]
        _, again, again_states, _, again_failure = self._run(c)
        if again_failure is not None or again != observations or again_states[-1] != states[-1]:
            what = "results" if again != observations else "final state"
            return [f"not_reproducible: a second execution from the same initial state gave other {what}"]
        if (c.focus_tool and (PATTERN_SEPARATOR in c.focus_tool or is_state_pattern(c.focus_tool))
                and self._order_free(c, observations, states, initial)):
            return [f"order_free: {c.solution[-1][:80]!r} answers and acts the same without the calls before it in "
                    f"the order {c.focus_tool!r}"]
        key = start_key(c.env, c.initial_state, c.meta)
        same = self._outcome_of(key, observations, states[-1])
        if same is not None:
            return [f"duplicate: the same results and final state as task {same} (an equivalent solution)"]
        episode.end_turn()
        score = episode.score()
        if score.value < 1.0:
            return [f"unsolvable: the env scores the solution {score.value} ({'; '.join(score.reasons)[:200]})"]
        self._outcomes.setdefault(key, {})[_outcome_hash(observations, states[-1])] = candidate_task(c).id
        return []


def _change(before: Any, after: Any) -> dict[str, tuple[str | None, str | None]]:
    """What a call changed: every leaf path of the state whose value differs, with its value before and after."""
    old, new = _leaves(before), _leaves(after)
    return {path: (old.get(path), new.get(path)) for path in set(old) | set(new) if old.get(path) != new.get(path)}


def _leaves(value: Any, at: str = "", path: frozenset[int] = frozenset(), depth: int = 0) -> dict[str, str]:
    """Every leaf of a state by its path, walked as `_canonical` walks it (objects by their public attributes,
    back-references cut)."""
    if depth > 64 or id(value) in path:
        return {at: f"<{type(value).__name__}>"}
    inner = path | {id(value)}
    if isinstance(value, Mapping):
        items = [(f"{at}/{key!r}", item) for key, item in value.items()]
    elif isinstance(value, (list, tuple)):
        items = [(f"{at}[{index}]", item) for index, item in enumerate(value)]
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        items = [(f"{at}.{key}", item) for key, item in vars(value).items() if not key.startswith("_")]
    else:
        return {at: repr(_canonical(value))}
    leaves = {at: type(value).__name__} if not items else {}
    for where, item in items:
        leaves.update(_leaves(item, where, inner, depth + 1))
    return leaves


def _canonical(value: Any, path: frozenset[int] = frozenset(), depth: int = 0) -> Any:
    """A state in a form whose repr does not depend on dict insertion order (two equal file systems loaded from
    differently ordered JSON compare equal but print differently) and that walks objects by their public
    attributes (BFCL's Directory/File instances), cutting back-references such as a folder's `parent`."""
    if depth > 64 or id(value) in path:
        return f"<{type(value).__name__}>"
    inner = path | {id(value)}
    if isinstance(value, Mapping):
        return sorted((repr(key), _canonical(item, inner, depth + 1)) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return [_canonical(item, inner, depth + 1) for item in value]
    if isinstance(value, (set, frozenset)):
        return sorted(repr(_canonical(item, inner, depth + 1)) for item in value)
    if hasattr(value, "__dict__") and not isinstance(value, type):
        public = {key: item for key, item in vars(value).items() if not key.startswith("_")}
        return (type(value).__name__, _canonical(public, inner, depth + 1))
    return repr(value)


def _outcome_hash(observations: Sequence[str], final_state: Any) -> str:
    text = repr((list(observations), _canonical(final_state)))
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:32]


def _safe_json(value: Any) -> str:
    try:
        return canonical_json(value)
    except (TypeError, ValueError):
        return repr(value)[:10_000]
