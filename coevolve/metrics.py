"""One line of metrics.jsonl (`IterationMetrics`: what iteration t did) and what a whole run returns (`RunResult`).

The loop (`coevolve.loop.record_iteration`) writes one `IterationMetrics` per iteration, its commit point; the
report, bench/replicate.py's records and the README's figures read these fields by name.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping


@dataclass(frozen=True)
class IterationMetrics:
    """One line of metrics.jsonl: what iteration t did (iteration 0: the policy before training)."""

    iteration: int
    steps: tuple[int, int] | None
    """First and last optimizer step of the iteration (None for iteration 0)."""
    train_success: float | None
    """Success rate of the iteration's training rollouts."""
    heldout_success: float | None
    """Greedy success on the held-out set (None when not evaluated this iteration)."""
    signals: Mapping[str, int]
    synthesis: Mapping[str, Any]
    """`SynthesisResult.summary()`: contexts, candidates, accepted, rejected by code, skipped, seconds per stage."""
    pool: Mapping[str, int]
    """D_t's size by source after the iteration."""
    failures: Mapping[str, int]
    """The iteration's training rollouts that failed outside the agent, by cause: `backend` (generation backend or
    endpoint) and `environment` (the env's worker crashed or hung; AppWorld then starts a fresh worker, so this
    also counts restarts)."""
    seconds: Mapping[str, float]
    """Wall seconds per phase: train, signals, synthesis, eval."""
    feedback_share: float
    """(signals + synthesis) / (train + signals + synthesis + eval) seconds: the paper's "feedback" cost."""
    heldout_by_calls: Mapping[str, float] = field(default_factory=dict)
    """Held-out success by the number of calls in the task's ground truth ("1", "2", ...): the coverage-shift
    setting's shifted part (tasks longer than any in D_0) and the rest, apart."""
    heldout_by_tools: Mapping[str, float] = field(default_factory=dict)
    """Held-out success on tasks whose ground truth calls only tools some task of D_0 calls (`seen`) and on those
    calling at least one tool D_0 never calls (`unseen`): the tool-shift setting's shifted part and the rest."""
    patterns: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """`SignalReport.pattern_summary()`: per n-gram size, the action patterns seen (total, distinct), the rare ones
    and the θ that decided it."""
    train_seconds: Mapping[str, float] = field(default_factory=dict)
    """The train phase's seconds by part, summed over the iteration's steps (`coevolve.train.calls`): rollout, loss,
    optimizer, logging, save, resume."""
    guided: int = 0
    """Guided rollouts trained on in the iteration (`grpo.guidance`): all-failure groups given their solution."""
    new_tool_tasks: Mapping[str, int] = field(default_factory=dict)
    """Synthesized tasks in D_t whose solution calls a tool no task of D_0 calls (`admitted`), and how many of
    those are one call long (`one_call`): what exploration found of the part D_0 lacks."""
    draw: Mapping[str, int] = field(default_factory=dict)
    """What the iteration's sample of D_{t-1} held (`coevolve.curriculum.DrawSummary`, either sampler): its tasks
    by standing (never tried / learnable / mastered / failing), the synthesized ones, those admitted after the
    previous iteration, and the own rollouts those got."""
    state_tasks: Mapping[str, int] = field(default_factory=dict)
    """Synthesized tasks in D_t whose solution reaches an action state no task of D_0 reaches (`admitted`; the
    env's `state_patterns`), and how many of them were made for such a state (`steered`)."""

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(self)))


@dataclass(frozen=True)
class RunResult:
    output_dir: Path
    start_step: int
    final_step: int
    seconds: float
    first_success: float | None
    last_success: float | None
