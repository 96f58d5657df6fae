"""Synthesis: contexts -> explore -> abstract -> validate -> admitted tasks (the paper's signal-driven task synthesis).

    contexts = signal_contexts(events, tasks, trajectories, max_contexts=16)    # or random_contexts(...) (ablation)
    deadline = Deadline.after(time_budget_seconds)
    explored = explore(env, contexts, tasks, explorer, seed, deadline)          # ExplorationEpisodes
    abstracted = abstract(env, explored.items, tasks, abstractor, deadline)     # Abstractions (candidates)
    validated = validate(abstracted.items, validator, iteration, deadline)      # Validations (verdicts)
    result = synthesis_result(iteration, contexts, explored, abstracted, validated)
    pool.add_tasks(result.admitted, iteration=t)                                # D_t = D_{t-1} ∪ admitted

(`synthesis_phase` is those lines in one call.) Each stage is timed (`SynthesisResult.seconds`). Trouble never stops training: an explorer or abstractor that
raises, an LLM endpoint that keeps failing or answers garbage, or a phase past its `time_budget_seconds`, makes
the phase produce less, and every skipped item is counted by reason in `SynthesisResult.skipped`.

Which events are explored when there are more than `max_contexts`: the kinds take turns (forgetting, boundary,
rare, forgetting, ...), each kind's events in the order they came (the paper does not say how it caps; strict
priority let the always-numerous boundary events crowd rare out, so that "without rare" explored the same).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from coevolve.abstract import Abstraction, LLMAbstractor, TemplateAbstractor
from coevolve.envs.base import Abstractor, Env, Explorer
from coevolve.explore import LLMExplorer, OfflineExplorer, build_context, random_contexts
from coevolve.records import (SIGNAL_KINDS, Candidate, ExplorationContext, ExplorationEpisode, SignalEvent, Task,
                              Trajectory, Verdict)
from coevolve.validate import Validation, Validator


@dataclass(frozen=True)
class SynthesisResult:
    """Everything one synthesis phase did, for the pool, metrics.jsonl and the report's lineage table."""

    iteration: int
    contexts: tuple[ExplorationContext, ...]
    episodes: tuple[ExplorationEpisode, ...]
    abstractions: tuple[Abstraction, ...]
    validations: tuple[Validation, ...]
    skipped: Mapping[str, int] = field(default_factory=dict)
    """Reason -> how many contexts (explorer), episodes (abstractor) or candidates (time budget) were dropped."""
    seconds: Mapping[str, float] = field(default_factory=dict)
    """Stage -> wall seconds."""

    @property
    def candidates(self) -> tuple[Candidate, ...]:
        return tuple(candidate for abstraction in self.abstractions for candidate in abstraction.candidates)

    @property
    def verdicts(self) -> tuple[Verdict, ...]:
        return tuple(validation.verdict for validation in self.validations)

    @property
    def admitted(self) -> tuple[Task, ...]:
        return tuple(v.task for v in self.validations if v.task is not None)

    def rejected_by_code(self) -> dict[str, int]:
        """Rejection code -> candidates rejected with it (a candidate counts once per distinct code)."""
        counts: Counter[str] = Counter()
        for verdict in self.verdicts:
            counts.update(set(verdict.codes))
        return dict(sorted(counts.items()))

    def lineage(self) -> list[dict[str, Any]]:
        """One row per validated candidate: signal -> flagged trajectories -> exploration episode -> candidate ->
        verdict (what the run report's table of synthesized tasks shows)."""
        contexts = {context.id: context for context in self.contexts}
        episodes = {episode.id: episode for episode in self.episodes}
        rows = []
        for validation in self.validations:
            candidate, verdict = validation.candidate, validation.verdict
            if candidate is None:
                continue
            episode = episodes.get(candidate.episode_id or "")
            context = contexts.get(episode.context_id) if episode is not None else None
            rows.append({
                "iteration": self.iteration, "signal": candidate.signal or "random",
                "parent_task_id": candidate.parent_task_id,
                "trajectory_ids": list(context.trajectory_ids) if context is not None else [],
                "context_id": context.id if context is not None else None, "episode_id": candidate.episode_id,
                "explorer": episode.explorer if episode is not None else None, "abstractor": candidate.abstractor,
                "candidate_id": candidate.id, "intent": candidate.intent, "query": candidate.query,
                "solution": list(candidate.solution), "accepted": verdict.accepted, "reasons": list(verdict.reasons),
                "task_id": verdict.task_id,
            })
        return rows

    def summary(self) -> dict[str, Any]:
        """The phase in numbers (what metrics.jsonl records per iteration)."""
        signals = Counter(context.signal or "random" for context in self.contexts)
        return {
            "contexts": len(self.contexts), "contexts_by_signal": dict(sorted(signals.items())),
            "episodes": len(self.episodes), "steps": sum(len(e.steps) for e in self.episodes),
            "candidates": len(self.candidates), "accepted": len(self.admitted),
            "rejected": sum(1 for v in self.verdicts if not v.accepted), "rejected_by_code": self.rejected_by_code(),
            "skipped": dict(self.skipped), "seconds": dict(self.seconds),
        }


def signal_contexts(events: Sequence[SignalEvent], tasks: Mapping[str, Task], trajectories: Mapping[str, Trajectory],
                    max_contexts: int, rest: str = "signal", iteration: int = 0, seed: int = 0
                    ) -> list[ExplorationContext]:
    """One context per event whose task is known, at most `max_contexts`: the kinds take turns (forgetting,
    boundary, rare, forgetting, ...), each kind's events in their order, so that a cap never leaves a kind that
    fired unexplored (boundary events alone would fill it at every iteration: most groups of a learning policy
    are mixed) and a signal ablation changes what is explored. Rare events on the action states D_t lacks come
    first, before the turns (their comment says why). With `rest="random"` (`synthesis.rest_contexts`) the contexts
    after those are random tasks of D_{t-1} instead (`random_contexts`), as many as the signal contexts they replace,
    so exploration costs the same."""
    # A state D_t lacks (`signals.unexplored_states`) is explored before the kinds take turns: bench/state_yield.py
    # measured, with no training, that boundary-like contexts yield fewer tasks of what D_0 lacks than random ones
    # (they steer toward the tasks' own tools), its contexts many more. The events stop once D_t holds the state.
    states = [e for e in events if e.kind == "rare" and e.evidence.get("unexplored_state") and e.task_id in tasks]
    by_kind = {kind: [e for e in events if e.kind == kind and e.task_id in tasks
               and not e.evidence.get("unexplored_state")]
               for kind in SIGNAL_KINDS}
    # Rare events on unexplored tools (`signals.unexplored`: what the policy never did at all) lead the rare turn.
    by_kind["rare"].sort(key=lambda event: not event.evidence.get("unexplored"))
    ordered = states + [queue[turn] for turn in range(max((len(q) for q in by_kind.values()), default=0))
                        for queue in by_kind.values() if turn < len(queue)]
    contexts = [build_context(event, tasks[event.task_id], trajectories) for event in ordered[:max_contexts]]
    if rest == "random":  # bench/state_yield.py, no training: a random context yields more of a held-back tool's
        # tasks than a signal one (the latter steer toward the tasks' own tools); the state contexts stay first
        kept = [context for context in contexts if context.evidence.get("unexplored_state")]
        contexts = kept + random_contexts(list(tasks.values()), len(contexts) - len(kept), iteration, seed)
    return contexts


@dataclass(frozen=True)
class Deadline:
    """The synthesis phase's wall-clock budget (`synthesis.time_budget_seconds`), shared by its three stages."""

    at: float | None = None

    @classmethod
    def after(cls, seconds: float | None) -> "Deadline":
        return cls(time.monotonic() + seconds if seconds is not None else None)

    def passed(self) -> bool:
        return self.at is not None and time.monotonic() >= self.at


@dataclass(frozen=True)
class Stage:
    """What one stage (explore, abstract or validate) produced, what it dropped by reason, and its wall seconds."""

    items: tuple[Any, ...]
    skipped: Mapping[str, int]
    seconds: float


def explore(env: Env, contexts: Sequence[ExplorationContext], tasks: Mapping[str, Task], explorer: Explorer,
            seed: int, deadline: Deadline = Deadline()) -> Stage:
    """Fresh episodes from every context's task (`ExplorationEpisode`s); a failing explorer loses its episodes."""
    started, skipped = time.perf_counter(), Counter()
    episodes: list[ExplorationEpisode] = []
    if contexts and deadline.passed():
        skipped["time_budget"] += len(contexts)
    elif contexts:
        try:
            episodes = list(explorer.explore(env, list(contexts), tasks, seed=seed))
        except Exception:  # noqa: BLE001 - a broken explorer costs this phase its episodes, never the run
            skipped["explorer_error"] += len(contexts)
    skipped["explorer_error"] += sum(1 for episode in episodes if episode.error is not None)
    return Stage(tuple(episodes), +skipped, time.perf_counter() - started)


def abstract(env: Env, episodes: Sequence[ExplorationEpisode], tasks: Mapping[str, Task], abstractor: Abstractor,
             deadline: Deadline = Deadline()) -> Stage:
    """Candidate tasks (intent, query, solution) from the episodes that ran (`Abstraction`s)."""
    started, skipped = time.perf_counter(), Counter()
    usable = [episode for episode in episodes if episode.error is None]
    abstractions: list[Abstraction] = []
    if usable and deadline.passed():
        skipped["time_budget"] += len(usable)
    elif usable:
        try:
            abstractions = list(abstractor.abstract(env, usable, tasks, deadline=deadline.at))
        except Exception:  # noqa: BLE001 - as above
            skipped["abstractor_error"] += len(usable)
    skipped.update(a.failure_code for a in abstractions if a.failure_code is not None)
    return Stage(tuple(abstractions), +skipped, time.perf_counter() - started)


def validate(abstractions: Sequence[Abstraction], validator: Validator, iteration: int,
             deadline: Deadline = Deadline()) -> Stage:
    """Every candidate executed and checked (`Validation`s: the candidate, its verdict, the task if accepted)."""
    started, skipped = time.perf_counter(), Counter()
    validations: list[Validation] = []
    solved: set[tuple[str, str]] = set()  # (episode, last call) a shorter alternative already covers
    for abstraction, candidate in ((a, c) for a in abstractions for c in a.candidates):
        alternative = (abstraction.episode_id, candidate.solution[-1] if candidate.solution else "")
        if abstraction.shortest_only and alternative in solved:
            skipped["shorter_solution_accepted"] += 1  # the same call is already taught with fewer calls
            continue
        if deadline.passed():
            skipped["time_budget"] += 1
            continue
        try:
            validations.append(validator.validate(candidate, iteration=iteration))
            if validations[-1].verdict.accepted:
                solved.add(alternative)
        except Exception as error:  # noqa: BLE001 - an env that raises on a candidate rejects that candidate
            reason = f"execution_error: the environment raised {type(error).__name__}: {str(error)[:160]}"
            validations.append(Validation(candidate, Verdict(candidate.id, False, (reason,))))
    return Stage(tuple(validations), +skipped, time.perf_counter() - started)


def synthesis_result(iteration: int, contexts: Sequence[ExplorationContext], explored: Stage, abstracted: Stage,
                     validated: Stage) -> SynthesisResult:
    skipped: Counter[str] = Counter()
    for stage in (explored, abstracted, validated):
        skipped.update(stage.skipped)
    return SynthesisResult(iteration, tuple(contexts), explored.items, abstracted.items, validated.items,
                           dict(sorted(skipped.items())),
                           {"explore": explored.seconds, "abstract": abstracted.seconds,
                            "validate": validated.seconds})


def synthesis_phase(env: Env, contexts: Sequence[ExplorationContext], tasks: Mapping[str, Task], explorer: Explorer,
                    abstractor: Abstractor, validator: Validator, iteration: int, seed: int = 0,
                    time_budget_seconds: float | None = None) -> SynthesisResult:
    """Explore from every context, abstract the episodes, validate the candidates, within one time budget (the
    loop calls the three stages itself, one line each; this is the same for callers that want them together)."""
    deadline = Deadline.after(time_budget_seconds)
    explored = explore(env, contexts, tasks, explorer, seed + iteration, deadline)
    abstracted = abstract(env, explored.items, tasks, abstractor, deadline)
    validated = validate(abstracted.items, validator, iteration, deadline)
    return synthesis_result(iteration, contexts, explored, abstracted, validated)


# ---------------------------------------------------------------------------------------------------------------
# From the config's `synthesis` section
# ---------------------------------------------------------------------------------------------------------------


def _endpoint(section: Any) -> Any:
    from coevolve.policy.openai_backend import OpenAIBackend

    return OpenAIBackend(section.llm_model, base_url=section.llm_base_url,
                         api_key=os.environ.get(section.llm_api_key_env), timeout=section.llm_timeout_seconds,
                         max_retries=section.llm_max_retries)


def build_explorer(section: Any, policy_backend: Any = None, policy_renderer: Any = None) -> Explorer:
    """The explorer a `SynthesisSection` names: `offline`, `policy` (the backend and renderer of the model being
    trained, which the caller passes) or `llm` (the endpoint)."""
    from coevolve.policy.chat import ChatRenderer

    if section.explorer == "offline":
        return OfflineExplorer(section.exploration())
    if section.explorer == "llm":
        return LLMExplorer(_endpoint(section), ChatRenderer(None, "hermes"), section.exploration())
    if policy_backend is None or policy_renderer is None:
        raise ValueError("synthesis.explorer=policy explores with the model being trained: pass its backend")
    return LLMExplorer(policy_backend, policy_renderer, section.exploration(), name="policy")


def build_abstractor(section: Any) -> Abstractor:
    if section.abstractor == "template":
        return TemplateAbstractor(max_solution_calls=section.max_solution_calls)
    return LLMAbstractor(_endpoint(section), max_solution_calls=section.max_solution_calls,
                         max_format_retries=section.llm_max_format_retries)
