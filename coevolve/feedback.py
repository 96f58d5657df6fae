"""The feedback phase: signal events -> contexts -> exploration -> abstraction -> validation -> admitted tasks.

    contexts = signal_contexts(events, tasks, trajectories, max_contexts=16)    # or random_contexts(...) (ablation)
    result = feedback_phase(env, contexts, tasks, explorer, abstractor, validator, iteration=t)
    pool.add_tasks(result.admitted, iteration=t + 1)                             # D_{t+1} = D_t ∪ admitted

Each stage is timed (`FeedbackResult.seconds`). Trouble never stops training: an explorer or abstractor that
raises, an LLM endpoint that keeps failing or answers garbage, or a phase past its `time_budget_seconds`, makes
the phase produce less, and every skipped item is counted by reason in `FeedbackResult.skipped`.

Which events are explored when there are more than `max_contexts`: forgetting first, then boundary, then rare, each
in the order the events came (the paper finds forgetting the most valuable signal; it does not say how it caps).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from coevolve.abstract import Abstraction, LLMAbstractor, TemplateAbstractor
from coevolve.envs.base import Env
from coevolve.explore import ExploreConfig, LLMExplorer, OfflineExplorer, build_context
from coevolve.records import (SIGNAL_KINDS, Candidate, ExplorationContext, ExplorationEpisode, SignalEvent, Task,
                              Trajectory, Verdict)
from coevolve.validate import Validation, ValidationConfig, Validator

STAGES = ("explore", "abstract", "validate")
SKIP_REASONS = ("explorer_error", "malformed_reply", "endpoint_error", "abstractor_error", "time_budget")


@dataclass(frozen=True)
class FeedbackResult:
    """Everything one feedback phase did, for the pool, metrics.jsonl and the report's lineage table."""

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
                    max_contexts: int) -> list[ExplorationContext]:
    """One context per event whose task is known, forgetting first, then boundary, then rare, at most `max_contexts`."""
    rank = {kind: index for index, kind in enumerate(SIGNAL_KINDS)}
    ordered = sorted((e for e in events if e.task_id in tasks), key=lambda e: rank[e.kind])  # stable: keeps order
    return [build_context(event, tasks[event.task_id], trajectories) for event in ordered[:max_contexts]]


def feedback_phase(env: Env, contexts: Sequence[ExplorationContext], tasks: Mapping[str, Task], explorer: Any,
                   abstractor: Any, validator: Validator, iteration: int, seed: int = 0,
                   time_budget_seconds: float | None = None) -> FeedbackResult:
    """Explore from every context, abstract the episodes, validate the candidates (see the module docstring)."""
    deadline = time.monotonic() + time_budget_seconds if time_budget_seconds is not None else None
    skipped: Counter[str] = Counter()
    seconds: dict[str, float] = {}

    def out_of_time() -> bool:
        return deadline is not None and time.monotonic() >= deadline

    started = time.perf_counter()
    episodes: list[ExplorationEpisode] = []
    if contexts and out_of_time():
        skipped["time_budget"] += len(contexts)
    elif contexts:
        try:
            episodes = list(explorer.explore(env, list(contexts), tasks, seed=seed + iteration))
        except Exception:  # noqa: BLE001 - a broken explorer costs this phase its episodes, never the run
            skipped["explorer_error"] += len(contexts)
    skipped["explorer_error"] += sum(1 for episode in episodes if episode.error is not None)
    seconds["explore"] = time.perf_counter() - started

    started = time.perf_counter()
    usable = [episode for episode in episodes if episode.error is None]
    abstractions: list[Abstraction] = []
    if usable and out_of_time():
        skipped["time_budget"] += len(usable)
    elif usable:
        try:
            abstractions = list(abstractor.abstract(env, usable, tasks, deadline=deadline))
        except Exception:  # noqa: BLE001 - as above
            skipped["abstractor_error"] += len(usable)
    for abstraction in abstractions:
        if abstraction.failure_code is not None:
            skipped[abstraction.failure_code] += 1
    seconds["abstract"] = time.perf_counter() - started

    started = time.perf_counter()
    validations: list[Validation] = []
    for abstraction in abstractions:
        for candidate in abstraction.candidates:
            if out_of_time():
                skipped["time_budget"] += 1
                continue
            try:
                validations.append(validator.validate(candidate, iteration=iteration))
            except Exception as error:  # noqa: BLE001 - an env that raises on a candidate rejects that candidate
                reason = f"execution_error: the environment raised {type(error).__name__}: {str(error)[:160]}"
                validations.append(Validation(candidate, Verdict(candidate.id, False, (reason,))))
    seconds["validate"] = time.perf_counter() - started
    return FeedbackResult(iteration, tuple(contexts), tuple(episodes), tuple(abstractions), tuple(validations),
                          {key: value for key, value in sorted(skipped.items()) if value}, seconds)


# ---------------------------------------------------------------------------------------------------------------
# From the config's `feedback` section
# ---------------------------------------------------------------------------------------------------------------


def _endpoint(section: Any) -> Any:
    from coevolve.policy.openai_backend import OpenAIBackend

    return OpenAIBackend(section.llm_model, base_url=section.llm_base_url,
                         api_key=os.environ.get(section.llm_api_key_env), timeout=section.llm_timeout_seconds,
                         max_retries=section.llm_max_retries)


def build_feedback(section: Any, env: Env, known: Sequence[Task] = (), policy_backend: Any = None,
                   policy_renderer: Any = None) -> tuple[Any, Any, Validator]:
    """(explorer, abstractor, validator) from a `FeedbackSection`. The `llm` explorer uses the endpoint when
    `llm_base_url` is set, else the policy's own backend and renderer (which the caller passes)."""
    from coevolve.policy.chat import ChatRenderer

    explore_config = ExploreConfig(step_budget=section.step_budget, episodes_per_context=section.episodes_per_context,
                                   focus_weight=section.focus_weight)
    if section.explorer == "offline":
        explorer: Any = OfflineExplorer(explore_config)
    elif section.llm_base_url is not None:
        explorer = LLMExplorer(_endpoint(section), ChatRenderer(None, "hermes"), explore_config)
    elif policy_backend is not None and policy_renderer is not None:
        explorer = LLMExplorer(policy_backend, policy_renderer, explore_config)
    else:
        raise ValueError("feedback.explorer=llm needs feedback.llm_base_url or the policy's backend")
    if section.abstractor == "template":
        abstractor: Any = TemplateAbstractor(max_solution_calls=section.max_solution_calls)
    else:
        abstractor = LLMAbstractor(_endpoint(section), max_solution_calls=section.max_solution_calls,
                                   max_format_retries=section.llm_max_format_retries)
    return explorer, abstractor, Validator(env, validation_config(section), known)


def validation_config(section: Any) -> ValidationConfig:
    """The validator's settings from a `FeedbackSection`."""
    return ValidationConfig(dedup_threshold=section.dedup_threshold, check_execution=section.check_execution,
                            max_solution_calls=max(section.max_solution_calls, 1),
                            max_call_chars=section.max_call_chars)
