"""Typed records that pass between the phases of CoEvolve.

Every phase of the loop (rollout -> signals -> explore -> abstract -> validate -> pool) is a function over these
frozen dataclasses, never over loose dicts. Each record round-trips through JSON (`to_dict` / `from_dict`,
`to_json` / `from_json`) so the pool, the signal history and the run directory can store them verbatim.

Conventions
- Sequences are tuples (records are frozen); mappings that carry environment payloads (`initial_state`, `meta`,
  `arguments`, `evidence`) are plain dicts by type but are treated as read-only: environments deep-copy them
  before use.
- `Task.id` is a content hash of what defines the task for the agent (env, user turns, initial state, ground
  truth, env metadata); the human-readable `name` (e.g. BFCL's `multi_turn_base_0`) and the provenance are left
  out, so the same task synthesized twice gets the same id.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

Message = Mapping[str, str]  # {"role": "user", "content": "..."}

SIGNAL_KINDS = ("forgetting", "boundary", "rare")
TASK_SOURCES = ("seed", "synthetic")


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: the input of every content hash."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def content_hash(value: Any, length: int = 16) -> str:
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()[:length]


def _turns(value: Sequence[Sequence[Any]]) -> tuple[tuple[Any, ...], ...]:
    """Per turn, its call strings; a string where a list belongs is refused (it would read as one turn per
    character)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise ValueError(f"ground_truth must be a list of turns, each a list of call strings; got {type(value).__name__}")
    for turn in value:
        if isinstance(turn, (str, bytes)) or not isinstance(turn, (list, tuple)) or not all(
                isinstance(call, str) for call in turn):
            raise ValueError("ground_truth must be a list of turns, each a list of call strings; a turn is "
                             f"{type(turn).__name__}")
    return tuple(tuple(turn) for turn in value)


class _JsonRecord:
    """JSON round-trip shared by every record; subclasses override `from_dict` where fields nest."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    def to_json(self) -> str:
        return canonical_json(self.to_dict())

    @classmethod
    def from_json(cls, text: str):
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]):
        return cls(**data)  # type: ignore[call-arg]


# ---------------------------------------------------------------------------------------------------------------
# Tasks
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Provenance(_JsonRecord):
    """Where a task came from. Seed tasks carry only `source="seed"`."""

    source: str = "seed"
    """`seed` (shipped with the env) or `synthetic` (admitted by validation)."""
    parent_id: str | None = None
    """Id of the task whose signal started the exploration that produced this one."""
    signal: str | None = None
    """Signal kind that flagged the parent (`forgetting` / `boundary` / `rare`), or None for random exploration."""
    episode_id: str | None = None
    """Exploration episode whose (action, observation) pairs were abstracted into this task."""
    iteration: int | None = None
    """Training iteration after which the task was admitted."""
    verdict: str | None = None
    """Validation verdict summary (`accepted`, or the rejection reason)."""
    focus_tool: str | None = None
    """The tool the exploration was sent to call because no rollout had called it (a rare event for an unexplored
    tool, `signals.unexplored`), or the order of tools no rollout made (`cd > ls`, `signals.unexplored_orders`);
    None otherwise. `loop.signal_weights.unexplored` weighs these tasks in the draw."""


def call_name(call: str) -> str:
    """The tool name of a Python-call string: `cd` for `cd(folder='a')`."""
    return call.split("(", 1)[0].strip()


@dataclass(frozen=True)
class Task(_JsonRecord):
    """One task of an environment: the user turns, the initial state and a ground-truth call sequence."""

    id: str
    env: str
    name: str
    turns: tuple[tuple[Message, ...], ...]
    """User messages per turn; a turn may be empty (BFCL's miss_func / miss_param turns)."""
    initial_state: Mapping[str, Any]
    ground_truth: tuple[tuple[str, ...], ...]
    """Per turn, the calls that solve it, as Python-call strings (`cd(folder='x')`)."""
    meta: Mapping[str, Any] = field(default_factory=dict)
    """Env-specific fields (BFCL: category, involved_classes, missed_function, excluded_function)."""
    provenance: Provenance = field(default_factory=Provenance)

    @classmethod
    def create(
        cls,
        env: str,
        name: str,
        turns: Sequence[Sequence[Message]],
        initial_state: Mapping[str, Any],
        ground_truth: Sequence[Sequence[str]],
        meta: Mapping[str, Any] | None = None,
        provenance: Provenance | None = None,
    ) -> "Task":
        turns_t = tuple(tuple(dict(m) for m in turn) for turn in turns)
        truth_t = _turns(ground_truth)
        meta_d = dict(meta or {})
        task_id = content_hash(
            {
                "env": env,
                "turns": turns_t,
                "initial_state": initial_state,
                "ground_truth": truth_t,
                "meta": meta_d,
            }
        )
        return cls(task_id, env, name, turns_t, dict(initial_state), truth_t, meta_d, provenance or Provenance())

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def truth_tools(self) -> tuple[str, ...]:
        """The tool names of the ground-truth calls, in order: `("cd", "mkdir")` for [[cd(folder='a'), mkdir(...)]]."""
        return tuple(call_name(call) for turn in self.ground_truth for call in turn)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Task":
        if not isinstance(data.get("turns"), (list, tuple)) or not all(
                isinstance(turn, (list, tuple)) and all(isinstance(m, Mapping) for m in turn) for turn in data["turns"]):
            raise ValueError("turns must be a list of turns, each a list of message objects")
        if not isinstance(data.get("initial_state"), Mapping) or not isinstance(data.get("meta", {}), Mapping):
            raise ValueError("initial_state and meta must be objects")
        return cls(
            id=data["id"],
            env=data["env"],
            name=data["name"],
            turns=tuple(tuple(dict(m) for m in turn) for turn in data["turns"]),
            initial_state=dict(data["initial_state"]),
            ground_truth=_turns(data["ground_truth"]),
            meta=dict(data.get("meta", {})),
            provenance=Provenance.from_dict(data.get("provenance", {})),
        )



def task_record(row: Any, env_name: str) -> Task:
    """A task record read from a file (`Task.to_dict`'s form), for env `env_name`; ValueError says why it is not one:
    "not a task record (...)" or "a task of env X, not Y"."""
    try:
        task = Task.from_dict(row)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise ValueError(f"not a task record ({type(error).__name__}: {error})") from None
    if task.env != env_name:
        raise ValueError(f"a task of env {task.env!r}, not {env_name!r}")
    return task

# ---------------------------------------------------------------------------------------------------------------
# Acting in an environment
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolCall(_JsonRecord):
    """A parsed tool call. Arguments hold only JSON-like literals (str, int, float, bool, None, list, dict)."""

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    positional: tuple[Any, ...] = ()

    def to_python(self) -> str:
        """The call as a Python-call string, e.g. `cd(folder='x')` (BFCL's ground-truth notation)."""
        parts = [repr(value) for value in self.positional]
        parts += [f"{key}={value!r}" for key, value in self.arguments.items()]
        return f"{self.name}({', '.join(parts)})"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ToolCall":
        return cls(data["name"], dict(data.get("arguments", {})), tuple(data.get("positional", ())))


@dataclass(frozen=True)
class Step(_JsonRecord):
    """One (action, observation) pair: a single call the agent made and what the environment answered."""

    turn_index: int
    reply_index: int
    """Index of the model reply (within the episode) that contained this call; one reply may hold several calls."""
    action: str
    """The call as the agent wrote it (raw text, or canonical JSON for structured calls)."""
    call: ToolCall | None
    """The parsed call, or None when it could not be parsed."""
    observation: str
    """What the environment returned: the tool's result, or an error text."""
    error: str | None = None
    """Why the call was refused or failed (None when it ran and returned normally)."""

    @property
    def ok(self) -> bool:
        return self.error is None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Step":
        call = data.get("call")
        return cls(
            turn_index=data["turn_index"],
            reply_index=data["reply_index"],
            action=data["action"],
            call=ToolCall.from_dict(call) if call is not None else None,
            observation=data["observation"],
            error=data.get("error"),
        )


@dataclass(frozen=True)
class Check(_JsonRecord):
    """One check of an episode's outcome (BFCL: a per-turn state, response or empty-turn check). Kind `process`
    marks a failure of the env's machinery, not of the agent (AppWorld: a worker that crashed or hung)."""

    turn_index: int
    kind: str
    passed: bool
    reason: str = ""


@dataclass(frozen=True)
class Score(_JsonRecord):
    """The environment's verdict on an episode: `value` in [0, 1], and every check with its reason."""

    value: float
    checks: tuple[Check, ...] = ()

    @property
    def success(self) -> bool:
        return self.value >= 1.0

    @property
    def reasons(self) -> tuple[str, ...]:
        return tuple(check.reason for check in self.checks if not check.passed)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Score":
        return cls(float(data["value"]), tuple(Check.from_dict(c) for c in data.get("checks", ())))


@dataclass(frozen=True)
class Trajectory(_JsonRecord):
    """One episode of one task: the steps, the env score and (for training) the token-level record."""

    id: str
    task_id: str
    iteration: int
    sample_index: int
    """Index k of this rollout among the K rollouts of its task in the iteration (its GRPO group)."""
    steps: tuple[Step, ...]
    score: float
    reasons: tuple[str, ...] = ()
    truncated: bool = False
    """True when a turn, step or token limit cut the episode short."""
    prompt_ids: tuple[int, ...] = ()
    completion_ids: tuple[int, ...] = ()
    completion_mask: tuple[int, ...] = ()
    """1 for tokens the model generated, 0 for env observations, user turns and template tokens."""
    logprobs: tuple[float, ...] = ()
    """Sampling logprobs of the completion tokens (0.0 where the mask is 0)."""
    seconds: float = 0.0
    failure: str | None = None
    """Why the episode could not be played, when that was not the agent's doing: `backend: ...` (the generation
    backend or endpoint failed) or `environment: ...` (the env's worker crashed or hung). None otherwise."""
    guided: bool = False
    """True for a guided rollout (`coevolve.guidance`): the task's verified solution played in the policy's reply
    format, put in place of one rollout of a group that never succeeded. Trained on; never read by the signals."""

    @property
    def tool_names(self) -> tuple[str, ...]:
        return tuple(step.call.name for step in self.steps if step.call is not None)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Trajectory":
        return cls(
            id=data["id"],
            task_id=data["task_id"],
            iteration=data["iteration"],
            sample_index=data["sample_index"],
            steps=tuple(Step.from_dict(s) for s in data.get("steps", ())),
            score=float(data["score"]),
            reasons=tuple(data.get("reasons", ())),
            truncated=bool(data.get("truncated", False)),
            prompt_ids=tuple(data.get("prompt_ids", ())),
            completion_ids=tuple(data.get("completion_ids", ())),
            completion_mask=tuple(data.get("completion_mask", ())),
            logprobs=tuple(data.get("logprobs", ())),
            seconds=float(data.get("seconds", 0.0)),
            failure=data.get("failure"),
            guided=bool(data.get("guided", False)),
        )


# ---------------------------------------------------------------------------------------------------------------
# Signals and synthesis
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SignalEvent(_JsonRecord):
    """A feedback signal raised on one task in one iteration, with the evidence that raised it."""

    kind: str
    """`forgetting`, `boundary` or `rare`."""
    task_id: str
    iteration: int
    trajectory_ids: tuple[str, ...]
    evidence: Mapping[str, Any] = field(default_factory=dict)
    """forgetting: history window and current rate; boundary: the group's scores; rare: patterns -> frequency."""

    def __post_init__(self) -> None:
        if self.kind not in SIGNAL_KINDS:
            raise ValueError(f"unknown signal kind {self.kind!r}; expected one of {SIGNAL_KINDS}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SignalEvent":
        return cls(
            data["kind"], data["task_id"], data["iteration"], tuple(data["trajectory_ids"]),
            dict(data.get("evidence", {})),
        )


@dataclass(frozen=True)
class ExplorationContext(_JsonRecord):
    """What steers one exploration: the flagged task, the signal and its evidence (explore.py builds it).

    A context with `signal=None` is random exploration (the paper's ablation): same budget, nothing to steer by."""

    id: str
    task_id: str
    signal: str | None
    iteration: int
    focus_tools: tuple[str, ...] = ()
    """Tools the evidence points at (the failure's calls, the unstable step's calls, the rare patterns' tools)."""
    focus_values: tuple[str, ...] = ()
    """String argument values seen in the evidence's calls (what the failing agent was working on)."""
    evidence: Mapping[str, Any] = field(default_factory=dict)
    trajectory_ids: tuple[str, ...] = ()

    @property
    def focus_tool(self) -> str | None:
        """The tool no rollout of the iteration called, for a rare event on an unexplored tool
        (`signals.unexplored`), the order no rollout made (`cd > ls`), or the action state D_t and the rollouts
        barely reached (`cat@folder`, `signals.unexplored_states`): the explorer must make it."""
        tool = self.evidence.get("unexplored") or self.evidence.get("unexplored_state")
        return tool if isinstance(tool, str) and tool else None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ExplorationContext":
        return cls(
            data["id"], data["task_id"], data.get("signal"), data["iteration"], tuple(data.get("focus_tools", ())),
            tuple(data.get("focus_values", ())), dict(data.get("evidence", {})), tuple(data.get("trajectory_ids", ())),
        )


@dataclass(frozen=True)
class ExplorationEpisode(_JsonRecord):
    """One explorer episode in a fresh environment from the flagged task's initial state."""

    id: str
    context_id: str
    task_id: str
    signal: str | None
    explorer: str
    """Which explorer ran it (`offline`, `llm`, ...)."""
    steps: tuple[Step, ...]
    """The (action, observation) pairs, in order."""
    seconds: float = 0.0
    error: str | None = None
    """Why the episode produced nothing (endpoint failure, time budget), or None."""
    focus: str | None = None
    """The tool (or order of tools) the episode had to call (the context's `ExplorationContext.focus_tool`): the
    abstractor then keeps the shortest solutions that end in it."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ExplorationEpisode":
        return cls(
            data["id"], data["context_id"], data["task_id"], data.get("signal"), data["explorer"],
            tuple(Step.from_dict(step) for step in data.get("steps", ())), float(data.get("seconds", 0.0)),
            data.get("error"), data.get("focus"),
        )


@dataclass(frozen=True)
class Candidate(_JsonRecord):
    """A task abstracted from an exploration episode, not yet validated."""

    id: str
    env: str
    intent: str
    query: str
    solution: tuple[str, ...]
    """The call sequence that should solve `query`, as Python-call strings."""
    initial_state: Mapping[str, Any]
    meta: Mapping[str, Any] = field(default_factory=dict)
    parent_task_id: str | None = None
    signal: str | None = None
    episode_id: str | None = None

    abstractor: str | None = None
    """Which abstractor wrote it (`template`, `llm`), or None for a candidate from elsewhere."""
    focus_tool: str | None = None
    """The episode's focus tool or order (`ExplorationEpisode.focus`), carried into the task's provenance."""

    @classmethod
    def create(cls, env: str, intent: str, query: str, solution: Sequence[str], initial_state: Mapping[str, Any],
               meta: Mapping[str, Any] | None = None, parent_task_id: str | None = None, signal: str | None = None,
               episode_id: str | None = None, abstractor: str | None = None,
               focus_tool: str | None = None) -> "Candidate":
        """A candidate whose id is the hash of what it asks and does (env, query, solution, starting point)."""
        solution_t = tuple(solution)
        meta_d = dict(meta or {})
        candidate_id = content_hash({"env": env, "query": query, "solution": solution_t,
                                     "initial_state": initial_state, "meta": meta_d})
        return cls(candidate_id, env, intent, query, solution_t, dict(initial_state), meta_d, parent_task_id, signal,
                   episode_id, abstractor, focus_tool)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Candidate":
        fields = dict(data)
        fields["solution"] = tuple(fields["solution"])
        return cls(**fields)


@dataclass(frozen=True)
class Verdict(_JsonRecord):
    """The validator's decision on a candidate; every rejection keeps its reasons."""

    candidate_id: str
    accepted: bool
    reasons: tuple[str, ...] = ()
    """Each `code: detail` (validate.py lists the codes); empty when accepted."""
    task_id: str | None = None
    """The id of the task the accepted candidate became."""

    @property
    def codes(self) -> tuple[str, ...]:
        """The rejection codes (`execution_error`, `duplicate`, ...), in the order they were found."""
        return tuple(reason.split(":", 1)[0] for reason in self.reasons)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Verdict":
        return cls(data["candidate_id"], bool(data["accepted"]), tuple(data.get("reasons", ())), data.get("task_id"))
