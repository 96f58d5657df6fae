"""Re-exploration steered by the feedback signals (CoEvolve, arXiv 2604.15840, §3 "signal-guided exploration").

Each signal event becomes an `ExplorationContext`: the flagged task, the signal kind and its evidence, reduced to
what can steer an explorer — the tools it points at (`focus_tools`) and the argument values the agent was
working on (`focus_values`):

    forgetting  the failed rollouts' failing calls (action, observation, reason) and the task's ground-truth
                tools: the skill that was lost;
    boundary    the unstable step: the first step at which a failed rollout of the group left the path of a
                successful one (step index, both calls): where the policy hesitates;
    rare        the rare action patterns and their frequencies: the tools the policy barely uses; for a tool no
                rollout called (`signals.unexplored`), that tool as the context's `focus_tool`: the explorer
                must call it (the offline one calls it at its last step if no earlier call of it ran), and the
                abstractor keeps the shortest solutions that end in a call of it (`coevolve.abstract`). For an
                order no rollout made (`signals.unexplored_orders`, focus `cd > ls`) the same with the order:
                the offline explorer makes its calls in turn in its last steps unless they ran one after the
                other before, and the solutions kept end in them. `ExploreConfig.focus_retries` lets it draw a
                refused focus call again (off by default, as in the tool-shift replication).

An explorer then plays episodes in a fresh environment from that task's initial state (`env.reset(task)`), with
a step budget, and records every (action, observation) pair (`ExplorationEpisode`). Two explorers:

- `OfflineExplorer` needs no LLM. Each step it samples a tool among those the env exposes — from the context's
  focus tools with probability `focus_weight`, else uniformly — and its arguments from the schema: strings from
  the last observation (what the env just showed, e.g. a folder listing), the context's focus values, the
  initial state's keys and strings, or a fresh variant of one of them (to create things); enums, booleans and
  small integers by type; optional arguments at `optional_argument_rate`.
- `LLMExplorer` drives any backend the rollout engine drives (the policy itself, a local HF model, an
  OpenAI-compatible endpoint) with an exploration prompt that states the task, the signal and its evidence, and
  asks for one call per reply. The rollout engine plays it (`rollout`), so tool parsing and safety are the same.

Random exploration (the paper's ablation) is the same explorer and budget with `random_contexts`: tasks drawn
uniformly, `signal=None`, no focus and no evidence.

Deviations: the paper's explorer is an LLM; the offline one is ours, so that the loop runs without any LLM. The
paper does not say which parts of a trajectory the explorer sees; we pass the evidence above, capped in size.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

from coevolve.envs.base import Env, step_failure
from coevolve.policy.backends import SamplingConfig
from coevolve.records import ExplorationContext, ExplorationEpisode, SignalEvent, Step, Task, ToolCall, Trajectory
from coevolve.schemas import schema_choice
from coevolve.signals import PATTERN_SEPARATOR, holds_order
from coevolve.states import STATE_SEPARATOR, Route, is_state_pattern, state_tool

MAX_EVIDENCE_STEPS = 8
"""Failing steps kept in a forgetting context (the prompt of an LLM explorer stays short)."""
MAX_VALUE_CHARS = 64
"""Longest string an explorer reuses as an argument value."""
STATE_RETRIES = 8
"""Redraws of a refused call on the route to an action state (`cd` into a listed name that is a file)."""


@dataclass(frozen=True)
class ExploreConfig:
    """The exploration budget and the offline explorer's sampling odds."""

    step_budget: int = 6
    """Calls per exploration episode."""
    episodes_per_context: int = 1
    """Episodes played from each context."""
    focus_weight: float = 0.7
    """Offline explorer: probability that a step's tool is drawn from the context's focus tools (when any)."""
    optional_argument_rate: float = 0.3
    """Offline explorer: probability of filling an optional argument."""
    fresh_value_rate: float = 0.25
    """Offline explorer: probability that a string argument is a fresh name (to create something new)."""
    focus_retries: int = 0
    """Offline explorer: how many times a call it must make for the context's focus (an unexplored tool or order)
    is drawn again, with new arguments, when the env refuses it (the error is what an explorer learns from)."""

    def __post_init__(self) -> None:
        if self.step_budget < 1 or self.episodes_per_context < 1 or self.focus_retries < 0:
            raise ValueError(f"step_budget and episodes_per_context must be >= 1, focus_retries >= 0: {self}")
        for name in ("focus_weight", "optional_argument_rate", "fresh_value_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], got {getattr(self, name)!r}")


# ---------------------------------------------------------------------------------------------------------------
# Contexts
# ---------------------------------------------------------------------------------------------------------------


def _call_text(step: Step) -> str:
    return step.call.to_python() if step.call is not None else step.action


def _string_values(calls: Iterable[ToolCall | None]) -> list[str]:
    values = []
    for call in calls:
        if call is None:
            continue
        for value in list(call.arguments.values()) + list(call.positional):
            if isinstance(value, str) and 0 < len(value) <= MAX_VALUE_CHARS and value not in values:
                values.append(value)
    return values


def _truth_calls(task: Task) -> list[ToolCall]:
    from coevolve.calls import parse_call

    parsed = (parse_call(text) for turn in task.ground_truth for text in turn)
    return [call for call in parsed if isinstance(call, ToolCall)]


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(item for item in items if item))


def unstable_step(successes: Sequence[Trajectory], failures: Sequence[Trajectory]) -> dict[str, Any] | None:
    """Where a boundary group splits: the first step at which a failed rollout leaves every successful one's path.

    For each failure, the successful rollout sharing the longest prefix of calls is its reference; the split is
    the step after that prefix. The earliest split over the failures is returned (None without both kinds)."""
    best: dict[str, Any] | None = None
    for failure in failures:
        failed_calls = [_call_text(step) for step in failure.steps]
        closest: dict[str, Any] | None = None
        for success in successes:
            good_calls = [_call_text(step) for step in success.steps]
            prefix = 0
            while prefix < min(len(failed_calls), len(good_calls)) and failed_calls[prefix] == good_calls[prefix]:
                prefix += 1
            if closest is None or prefix > closest["step_index"]:
                closest = {
                    "step_index": prefix,
                    "success_call": good_calls[prefix] if prefix < len(good_calls) else None,
                    "failure_call": failed_calls[prefix] if prefix < len(failed_calls) else None,
                    "success_id": success.id, "failure_id": failure.id,
                }
        if closest is not None and (best is None or closest["step_index"] < best["step_index"]):
            best = closest
    return best


def build_context(event: SignalEvent, task: Task, trajectories: Mapping[str, Trajectory]) -> ExplorationContext:
    """The exploration context of one signal event (see the module docstring for what each kind keeps)."""
    named = [trajectories[tid] for tid in event.trajectory_ids if tid in trajectories]
    truth = _truth_calls(task)
    evidence: dict[str, Any] = {}
    focus_tools: list[str] = []
    focus_calls: list[ToolCall | None] = []
    if event.kind == "forgetting":
        # The failed rollouts: every call they made (a wrong call often runs fine) and why each episode failed.
        failing = [step for t in named for step in t.steps]
        evidence = {
            "history": list(event.evidence.get("history_window", ())), "now": event.evidence.get("now"),
            "failed_steps": [
                {"action": step.action[:200], "observation": step.observation[:200],
                 "reason": step_failure(step) or "ran, but the task failed"}
                for step in failing[:MAX_EVIDENCE_STEPS]
            ],
            "failure_reasons": list(dict.fromkeys(r[:200] for t in named for r in t.reasons))[:4],
        }
        focus_tools = [call.name for call in truth] + [s.call.name for s in failing if s.call is not None]
        focus_calls = list(truth) + [step.call for step in failing]
    elif event.kind == "boundary":
        scores = dict(zip(event.trajectory_ids, event.evidence.get("scores", ())))
        threshold = 0.5
        successes = [t for t in named if scores.get(t.id, t.score) >= threshold]
        failures = [t for t in named if scores.get(t.id, t.score) < threshold]
        split = unstable_step(successes, failures)
        evidence = {"unstable_step": split, "successes": len(successes), "failures": len(failures)}
        if split is not None:
            steps_at = [t.steps[split["step_index"]] for t in named if split["step_index"] < len(t.steps)]
            focus_tools = [step.call.name for step in steps_at if step.call is not None]
            focus_calls = [step.call for step in steps_at]
        focus_tools += [call.name for call in truth]
        focus_calls += list(truth)
    elif event.kind == "rare" and event.evidence.get("unexplored_state"):
        pattern = str(event.evidence["unexplored_state"])  # `cat@folder`: reach the state, then act there
        return ExplorationContext(
            id=f"rare-state-{pattern.replace(STATE_SEPARATOR, '-at-')}-{task.id}-i{event.iteration}", task_id=task.id,
            signal="rare", iteration=event.iteration, focus_tools=(state_tool(pattern),),
            evidence={"patterns": {pattern: 0.0}, "unexplored_state": pattern,
                      "reached": event.evidence.get("reached", 0)})
    elif event.kind == "rare" and event.evidence.get("unexplored"):
        tool = str(event.evidence["unexplored"])  # a tool, or an order of tools (`cd > ls`)
        return ExplorationContext(
            id=f"rare-{tool.replace(PATTERN_SEPARATOR, '-then-')}-{task.id}-i{event.iteration}", task_id=task.id,
            signal="rare", iteration=event.iteration, focus_tools=_unique(tool.split(PATTERN_SEPARATOR)),
            evidence={"patterns": {tool: 0.0}, "unexplored": tool})
    elif event.kind == "rare":
        frequencies = dict(event.evidence.get("frequencies", {}))
        evidence = {"patterns": frequencies}
        focus_tools = [name for pattern in frequencies for name in pattern.split(PATTERN_SEPARATOR)]
        focus_calls = [step.call for t in named for step in t.steps if step.call is not None
                       and step.call.name in focus_tools]
    return ExplorationContext(
        id=f"{event.kind}-{task.id}-i{event.iteration}", task_id=task.id, signal=event.kind,
        iteration=event.iteration, focus_tools=_unique(focus_tools), focus_values=_unique(_string_values(focus_calls)),
        evidence=evidence, trajectory_ids=tuple(event.trajectory_ids),
    )


def random_contexts(tasks: Sequence[Task], count: int, iteration: int, seed: int) -> list[ExplorationContext]:
    """`count` contexts without signal (random exploration): tasks drawn uniformly, without replacement while
    there are enough tasks."""
    rng = random.Random(f"random-exploration:{seed}:{iteration}")
    picked: list[Task] = []
    while len(picked) < count and tasks:
        picked.extend(rng.sample(list(tasks), min(len(tasks), count - len(picked))))
    return [ExplorationContext(id=f"random-{task.id}-i{iteration}-n{index}", task_id=task.id, signal=None,
                               iteration=iteration) for index, task in enumerate(picked)]


def describe(context: ExplorationContext, task: Task, step_budget: int) -> str:
    """The exploration prompt an LLM explorer gets: the starting task, the signal and its evidence."""
    query = " ".join(m.get("content", "") for turn in task.turns for m in turn if m.get("role", "user") == "user")
    lines = [
        "You are exploring a set of tools to learn what they can do from this starting point.",
        f"A user once asked here: \"{query[:500]}\"",
    ]
    evidence = context.evidence
    if context.signal == "forgetting":
        lines.append("An agent used to solve tasks like this and now fails them.")
        failed = evidence.get("failed_steps", [])
        if failed:
            lines.append("Its failing calls were: " + "; ".join(
                f"{s['action']} -> {s['reason']}" for s in failed[:4]))
    elif context.signal == "boundary":
        split = evidence.get("unstable_step") or {}
        lines.append("An agent solves tasks like this only sometimes.")
        if split:
            lines.append(f"Its successful and failed attempts part at step {split['step_index'] + 1}: "
                         f"{split.get('success_call')} (worked) versus {split.get('failure_call')} (failed).")
    elif context.signal == "rare" and is_state_pattern(context.focus_tool):
        tool, _, state = str(context.focus_tool).partition(STATE_SEPARATOR)
        lines.append(f"Hardly any task or agent has called {tool} in this state: {state or 'no arguments'}. Reach "
                     f"that state first, with names you have just seen, then call {tool} there.")
    elif context.signal == "rare" and context.focus_tool and PATTERN_SEPARATOR in context.focus_tool:
        first, *rest = context.focus_tool.split(PATTERN_SEPARATOR)
        lines.append(f"No agent has called {first} and then {' then '.join(rest)} right after it yet. Do that at "
                     "least once, on something that is there, as the last calls if nothing else.")
    elif context.signal == "rare" and context.focus_tool:
        lines.append(f"No agent has called {context.focus_tool} yet. Call it at least once, on something that is "
                     "there, as the last call if nothing else.")
    elif context.signal == "rare":
        lines.append("Agents rarely use these tools or tool sequences: "
                     + ", ".join(sorted(evidence.get("patterns", {}))) + ".")
    if context.focus_tools:
        lines.append("Explore around these tools: " + ", ".join(context.focus_tools) + ".")
    lines.append(f"Make one tool call per reply, about {step_budget} calls in all: look around first, then try "
                 "calls that change or reveal something. Reply without a call when you are done.")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# The offline explorer
# ---------------------------------------------------------------------------------------------------------------


def _strings(value: Any, out: list[str], depth: int = 0) -> None:
    """Every dict key and string leaf of a JSON-like value (bounded depth), in order of appearance."""
    if depth > 12:
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            out.append(str(key))
            _strings(item, out, depth + 1)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _strings(item, out, depth + 1)
    elif isinstance(value, str):
        out.append(value)


def _usable(values: Iterable[str]) -> list[str]:
    """Plausible argument values: short, one line, no path separator (a path would be refused by validation)."""
    return list(dict.fromkeys(v for v in values if 0 < len(v) <= MAX_VALUE_CHARS and "/" not in v
                              and "\n" not in v and v.strip() == v and ".." not in v))


_TEXT_PARAMETERS = ("content", "text", "message", "query", "pattern", "body", "title", "description")


def _fits(parameter: str, value: str) -> bool:
    """Values with spaces (a file's content, a sentence) go only to parameters that take text, not names."""
    return " " not in value or any(word in parameter.lower() for word in _TEXT_PARAMETERS)


def state_values(initial_state: Mapping[str, Any]) -> list[str]:
    """Candidate argument strings from an initial state: keys and string leaves, minus the per-class top level
    and keys repeated so often that they are structure (`type`, `contents`), not content."""
    found: list[str] = []
    for item in initial_state.values():  # the top level names the env's classes (BFCL), never an argument
        _strings(item, found)
    counts: dict[str, int] = {}
    for value in found:
        counts[value] = counts.get(value, 0) + 1
    structural = {value for value, count in counts.items() if count >= 3}
    return _usable(value for value in found if value not in structural)


def observation_values(observation: str) -> list[str]:
    """Strings in a tool's JSON answer (a listing's names, a file's content); nothing from a non-JSON answer."""
    try:
        value = json.loads(observation)
    except ValueError:
        return []
    found: list[str] = []
    if isinstance(value, Mapping):
        for item in value.values():  # keys of an answer name its fields (`current_directory_content`)
            _strings(item, found)
    else:
        _strings(value, found)
    return _usable(found)


def _made_prefix(names: Sequence[str], order: Sequence[str]) -> int:
    """The length of the longest proper prefix of `order` that `names` ends with (0 when none)."""
    return next((size for size in range(len(order) - 1, 0, -1) if list(names[-size:]) == list(order[:size])), 0)


def _fresh(rng: random.Random, base: str) -> str:
    stem, dot, extension = base.partition(".")
    return f"{stem}_{rng.randint(2, 9)}{dot}{extension}"


class OfflineExplorer:
    """Samples tools and arguments from the env's schemas and state, biased by the context (module docstring)."""

    name = "offline"

    def __init__(self, config: ExploreConfig = ExploreConfig()) -> None:
        self.config = config

    def explore(self, env: Env, contexts: Sequence[ExplorationContext], tasks: Mapping[str, Task],
                seed: int = 0) -> list[ExplorationEpisode]:
        episodes = []
        for context in contexts:
            for index in range(self.config.episodes_per_context):
                rng = random.Random(f"{seed}:{context.id}:{index}")  # independent of the order of contexts
                episodes.append(self._episode(env, context, tasks[context.task_id], index, rng))
        return episodes

    def _episode(self, env: Env, context: ExplorationContext, task: Task, index: int,
                 rng: random.Random) -> ExplorationEpisode:
        if is_state_pattern(context.focus_tool):
            return self._state_episode(env, context, task, index, rng)
        started = time.perf_counter()
        episode = env.reset(task)
        from_state = state_values(task.initial_state)
        recent: list[str] = []
        steps: list[Step] = []
        focus = context.focus_tool
        order = focus.split(PATTERN_SEPARATOR) if focus else []  # one tool, or an order of tools to call in turn
        ran: list[str] = []  # the names of the calls that ran, in order
        refused: set[str] = set()  # the calls the env refused (a retry draws others)
        for step_number in range(self.config.step_budget):
            docs = episode.tools()
            if episode.done or not docs:
                break
            doc = self._pick_tool(docs, context, rng)
            # A focus episode makes its calls, whatever the draws: in its last len(order) steps, unless the order
            # has run, the next tool of the order after the part of it the last calls made.
            forcing = (bool(order) and self.config.step_budget - step_number <= len(order)
                       and not holds_order(ran, order))
            if forcing:
                doc = next((d for d in docs if d["name"] == order[_made_prefix(ran, order)]), doc)
            for attempt in range(1 + (self.config.focus_retries if forcing else 0)):
                call = ToolCall(doc["name"], self._arguments(doc, context, recent, from_state, rng))
                for _ in range(8 if attempt else 0):  # a retry does not repeat a call the env refused
                    if call.to_python() not in refused:
                        break
                    call = ToolCall(doc["name"], self._arguments(doc, context, recent, from_state, rng))
                made = episode.act([call])
                if any(step_failure(step) is not None for step in made):
                    refused.add(call.to_python())
                steps.extend(made)
                for step in made:
                    if step_failure(step) is None:
                        ran.append(step.call.name if step.call is not None else "")
                        seen = observation_values(step.observation)
                        if seen:
                            recent = seen
                if episode.done or all(step_failure(step) is None for step in made):
                    break
        return ExplorationEpisode(f"{context.id}-{self.name}-e{index}", context.id, task.id, context.signal,
                                  self.name, tuple(steps), time.perf_counter() - started, focus=focus)

    def _state_episode(self, env: Env, context: ExplorationContext, task: Task, index: int,
                       rng: random.Random) -> ExplorationEpisode:
        """An episode sent to an action state (`cat@folder`): the env's route to it, each call on values the episode
        has just observed and drawn again when refused, then the state's tool as often as the budget allows."""
        started, focus = time.perf_counter(), str(context.focus_tool)
        route = env.states.route(focus)
        episode, from_state = env.reset(task), state_values(task.initial_state)
        recent: list[str] = []
        steps: list[Step] = []
        tried: set[str] = set()  # the calls made so far, refused or not: a redraw gives another when it can
        attempts = 1 + max(self.config.focus_retries, STATE_RETRIES)
        plan = [*route.before, *[route.tool] * max(1, self.config.step_budget - len(route.before))]
        for position, tool in enumerate(plan):
            doc = next((d for d in episode.tools() if d["name"] == tool), None)
            if episode.done or doc is None:
                break
            reached = False
            for _ in range(attempts):
                call = ToolCall(tool, self._arguments(doc, context, recent, from_state, rng, route))
                for _redraw in range(8):  # not a call made before (`ls()` has no other: it repeats)
                    if call.to_python() not in tried:
                        break
                    call = ToolCall(tool, self._arguments(doc, context, recent, from_state, rng, route))
                made = episode.act([call])
                steps.extend(made)
                tried.add(call.to_python())
                if any(step_failure(step) is not None for step in made):
                    continue
                recent = next((seen for step in reversed(made) if (seen := observation_values(step.observation))),
                              recent)
                reached = True
                break
            if not reached and position < len(route.before):
                break  # the state was not reached: a call now would act elsewhere
        return ExplorationEpisode(f"{context.id}-{self.name}-e{index}", context.id, task.id, context.signal,
                                  self.name, tuple(steps), time.perf_counter() - started, focus=focus)

    def _pick_tool(self, docs: Sequence[Mapping[str, Any]], context: ExplorationContext,
                   rng: random.Random) -> Mapping[str, Any]:
        focused = [doc for doc in docs if doc["name"] in context.focus_tools]
        if focused and rng.random() < self.config.focus_weight:
            return rng.choice(focused)
        return rng.choice(list(docs))

    def _arguments(self, doc: Mapping[str, Any], context: ExplorationContext, recent: list[str],
                   from_state: list[str], rng: random.Random, route: Route | None = None) -> dict[str, Any]:
        parameters = doc.get("parameters") or {}
        defs = {**(parameters.get("definitions") or {}), **(parameters.get("$defs") or {})}
        exact = route.arguments if route is not None and route.exact and doc.get("name") == route.tool else None
        return self._object(parameters, defs, context, recent, from_state, rng, exact)

    def _object(self, schema: Mapping[str, Any], defs: Mapping[str, Any], context: ExplorationContext,
                recent: list[str], from_state: list[str], rng: random.Random,
                exact: Sequence[str] | None = None) -> dict[str, Any]:
        """An object's properties: the required ones and optional ones at `optional_argument_rate`, or, when
        `exact` names them (a state's acting call, `states.Route.exact`), those properties and no others."""
        properties = schema.get("properties") or {}
        required = set(schema.get("required") or ()) if exact is None else set(exact)
        arguments: dict[str, Any] = {}
        for name, value_schema in properties.items():
            if name not in required and (exact is not None or rng.random() >= self.config.optional_argument_rate):
                continue
            value = self._value(name, value_schema if isinstance(value_schema, Mapping) else {}, context, recent,
                                from_state, rng, defs)
            if value is not None:
                arguments[name] = value
        return arguments

    def _value(self, parameter: str, schema: Mapping[str, Any], context: ExplorationContext, recent: list[str],
               from_state: list[str], rng: random.Random, defs: Mapping[str, Any] | None = None,
               depth: int = 0) -> Any:
        defs = defs or {}
        schema = schema_choice(schema, defs, rng)
        if schema is None or depth > 8:
            return None
        if "const" in schema:
            return schema["const"]
        if schema.get("enum"):
            return rng.choice(list(schema["enum"]))
        kind = schema.get("type", "string")
        if kind == "boolean":
            return rng.random() < 0.5
        if kind == "integer":
            low, high = schema.get("minimum", 1), schema.get("maximum", 5)
            low = low if isinstance(low, int) else 1
            high = high if isinstance(high, int) and high >= low else low + 4
            return rng.randint(low, min(high, low + 4))
        if kind in ("number", "float"):
            return rng.choice((0.5, 1.0, 2.0, 2.5))
        if kind == "array":
            item = self._value(parameter, schema.get("items") or {}, context, recent, from_state, rng, defs, depth + 1)
            return [item] if item is not None else []
        if kind == "object":  # JSON Schema's objects (BFCL's "dict" arguments stay undrawn, as before)
            return self._object(schema, defs, context, recent, from_state, rng)
        if kind != "string":
            return None
        # Weighted pools: what the env just showed, then what the evidence was about, then the initial state.
        pools = [(recent, 3.0), (list(context.focus_values), 2.0), (from_state, 1.0)]
        pools = [([v for v in values if _fits(parameter, v)], weight) for values, weight in pools]
        pools = [(values, weight) for values, weight in pools if values]
        if not pools:
            return f"item_{rng.randint(1, 9)}"
        values = rng.choices([values for values, _ in pools], weights=[weight for _, weight in pools])[0]
        base = rng.choice(values)
        fresh = rng.random() < self.config.fresh_value_rate and " " not in base
        return _fresh(rng, base) if fresh else base


# ---------------------------------------------------------------------------------------------------------------
# The LLM explorer
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LLMExplorer:
    """An LLM explores through the rollout engine: `backend` and `renderer` as for `rollout` (token backend with
    the policy's renderer, or a chat backend such as `OpenAIBackend` with `ChatRenderer(None, "hermes")`)."""

    backend: Any
    renderer: Any
    config: ExploreConfig = ExploreConfig()
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(temperature=1.0))
    max_new_tokens: int = 128
    max_episode_tokens: int = 2048
    name: str = "llm"

    def explore(self, env: Env, contexts: Sequence[ExplorationContext], tasks: Mapping[str, Task],
                seed: int = 0) -> list[ExplorationEpisode]:
        from coevolve.rollout import RolloutConfig, rollout

        if not contexts:
            return []
        prompts = []
        for context in contexts:
            task = tasks[context.task_id]
            # The exploration "task": the flagged task's starting point, the exploration prompt as the user turn,
            # and no ground truth (nothing is scored; the steps are what we keep).
            prompts.append(Task.create(task.env, f"explore:{task.name}",
                                       [[{"role": "user", "content": describe(context, task, self.config.step_budget)}]],
                                       task.initial_state, [[]], {**task.meta, "exploration_context": context.id}))
        config = RolloutConfig(group_size=self.config.episodes_per_context, max_new_tokens=self.max_new_tokens,
                               max_replies_per_turn=self.config.step_budget, max_turns=1,
                               max_episode_tokens=self.max_episode_tokens, sampling=replace(self.sampling, seed=seed))
        started = time.perf_counter()
        batch = rollout(env, prompts, self.backend, self.renderer, config)
        seconds = (time.perf_counter() - started) / max(1, len(batch.trajectories))
        by_prompt = {prompt.id: context for prompt, context in zip(prompts, contexts)}
        episodes = []
        for trajectory in batch.trajectories:
            context = by_prompt[trajectory.task_id]
            steps = trajectory.steps[: self.config.step_budget]
            failed = [reason for reason in trajectory.reasons if "backend failed" in reason]
            error = failed[0] if failed and not steps else None
            episodes.append(ExplorationEpisode(f"{context.id}-{self.name}-e{trajectory.sample_index}", context.id,
                                               context.task_id, context.signal, self.name, steps, seconds, error,
                                               context.focus_tool))
        return episodes
