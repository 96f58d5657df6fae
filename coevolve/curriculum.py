"""A curriculum over D_t from each task's own history (`loop.sampler: history`; `uniform` is the paper's draw).

The paper does not say how D_t is sampled. Drawn uniformly, a task admitted after iteration t competes with hundreds
of seed tasks and with tasks the policy has mastered, so what the loop admits barely reaches training (the
replication's "exposure" stage). The samplers the field uses weigh a task by its own record instead: prime-rl's
difficulty pool (unseen tasks first, too easy and too hard ones down-weighted), learnability sampling (p(1-p),
Foster et al. 2025, arXiv 2502.12272), prioritized replay for post-training (solved and unsolved tasks retested so
they neither starve nor are forgotten, arXiv 2601.02648). This module is that rule, one weight per task, the same
for seed and synthesized tasks, from the task's tries: the iterations in which it had rollouts, each with its
success rate s (the mean of its K own rollouts; `TaskPool.tries`). With p = the mean of its last `window` rates:

    standing       when                         weight
    never_tried    no try yet                   1 + (never_tried - 1) * 2^-(age - 1)    age = t - admitted
    learnable      0 < p < 1                    learnable * 4 p (1 - p)                 (= learnable at p = 1/2)
    mastered       p = 1                        min(1, mastered * gap)                   gap = t - its last try
    failing        p = 0                        max(floor, failing^n)  or 1 if teachable n = failed tries in a row

- never_tried: a task admitted after iteration t - 1 (age 1) weighs `never_tried`; the boost halves with every
  iteration it waits, down to 1. At t = 1 every seed task is new, so the first draw is uniform.
- learnable: strictly mixed outcomes, where a GRPO group has a gradient (DAPO keeps only such groups); the
  learnability weight p(1-p), scaled so that p = 1/2 weighs `learnable`.
- mastered: solved in every recent try. Its weight is small just after the try and grows back with the
  iterations since, so it is retested now and then: forgetting keeps a history to compare with (what
  `loop.recur_fraction` does for the uniform draw; the two are not combined, `coevolve.config` refuses it).
- failing: failed in every recent try. It decays with each failed try in a row (`failing` ** n, not below
  `floor`), unless guidance can teach it (`grpo.guidance: solution`: an all-failure group trains on the task's
  verified solution), then it keeps weight 1.
The weights multiply the pool's own (`loop.signal_weights`, `loop.synthetic_fraction` still split the draw); the
draw itself stays `coevolve.pool.draw`, seeded by the run's seed and t, so a resume draws the same tasks.

What the draw held is counted the same way for both samplers (`DrawSummary`, metrics.jsonl's `draw`): its tasks by
standing, the synthesized ones, those admitted after the previous iteration, and how many of the iteration's own
rollouts those got, so a sampler that changes nothing shows it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Iterable, Literal, Mapping, Sequence

if TYPE_CHECKING:
    from coevolve.pool import TaskPool

Standing = Literal["never_tried", "learnable", "mastered", "failing"]
STANDINGS: tuple[Standing, ...] = ("never_tried", "learnable", "mastered", "failing")
SAMPLERS = ("uniform", "history")
"""`loop.sampler` choices."""

Try = tuple[int, float]
"""(iteration, success rate): one iteration in which the task had rollouts."""


@dataclass(frozen=True)
class CurriculumConfig:
    """The history sampler's weights (`loop.curriculum`, key by key; the defaults are ours, set once)."""

    window: int = 3
    """Recent tries that decide a task's standing (its last `window` success rates)."""
    never_tried: float = 8.0
    """Weight of a task never tried, admitted after the previous iteration; halves toward 1 each iteration after."""
    learnable: float = 2.0
    """Weight of a learnable task at p = 1/2 (scaled by 4 p (1 - p))."""
    mastered: float = 0.2
    """Weight of a mastered task one iteration after its last try; it grows by this much each iteration, up to 1."""
    failing: float = 0.5
    """A failing task's weight is failing ** (failed tries in a row), not below `floor`."""
    floor: float = 0.05
    """The least a failing task weighs (never 0: it is retested now and then)."""

    def __post_init__(self) -> None:
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"curriculum window must be a positive int, got {self.window!r}")
        for item in fields(self):
            value = getattr(self, item.name)
            if item.name != "window" and (isinstance(value, bool) or not isinstance(value, (int, float))
                                          or not math.isfinite(value) or value <= 0):
                raise ValueError(f"curriculum {item.name} must be a positive number, got {value!r}")
        if self.failing > 1 or self.mastered > 1:
            raise ValueError("curriculum failing and mastered are decays: at most 1")

    @classmethod
    def of(cls, values: Mapping[str, float]) -> "CurriculumConfig":
        known = {item.name for item in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown loop.curriculum keys {unknown}; known: {', '.join(sorted(known))}")
        values = dict(values)
        window = values.get("window")
        if isinstance(window, float) and window.is_integer():  # YAML and overrides may give 3.0 for 3
            values["window"] = int(window)
        return cls(**values)


# ---------------------------------------------------------------------------------------------------------------
# The rule: pure functions of a task's tries
# ---------------------------------------------------------------------------------------------------------------


def standing(rates: Sequence[float], window: int) -> Standing:
    """A task's standing from its success rates (oldest first): its last `window` rates decide."""
    if not rates:
        return "never_tried"
    recent = list(rates)[-window:]
    mean = math.fsum(recent) / len(recent)
    if mean >= 1.0:
        return "mastered"
    if mean <= 0.0:
        return "failing"
    return "learnable"


def failed_in_a_row(rates: Sequence[float]) -> int:
    """How many of the last tries failed completely (rate 0), counted back from the last."""
    count = 0
    for rate in reversed(list(rates)):
        if rate > 0.0:
            break
        count += 1
    return count


def task_weight(tries: Sequence[Try], admitted: int, iteration: int, teachable: bool,
                config: CurriculumConfig = CurriculumConfig()) -> float:
    """The draw weight of one task in iteration `iteration`'s sample (the table of the module docstring).

    `tries`: its (iteration, success rate) pairs before `iteration`, oldest first; `admitted`: the first iteration
    whose D_t held it (0 for seed tasks); `teachable`: guidance can give it a solution."""
    rates = [rate for _, rate in tries]
    kind = standing(rates, config.window)
    if kind == "never_tried":
        age = max(1, iteration - admitted)
        return 1.0 + (config.never_tried - 1.0) * 0.5 ** (age - 1)
    if kind == "learnable":
        recent = rates[-config.window:]
        p = math.fsum(recent) / len(recent)
        return config.learnable * 4.0 * p * (1.0 - p)
    if kind == "mastered":
        gap = max(1, iteration - tries[-1][0])
        return min(1.0, config.mastered * gap)
    if teachable:
        return 1.0
    return max(config.floor, config.failing ** failed_in_a_row(rates))


def history_weights(tries: Mapping[str, Sequence[Try]], admitted: Mapping[str, int], iteration: int,
                    teachable: bool, config: CurriculumConfig = CurriculumConfig()) -> dict[str, float]:
    """Task id -> draw weight for every task of `admitted` (D_{iteration-1}: task id -> its admission)."""
    return {task_id: task_weight(tries.get(task_id, ()), first, iteration, teachable, config)
            for task_id, first in admitted.items()}


def pool_weights(pool: "TaskPool", iteration: int, config: CurriculumConfig, teachable: bool) -> dict[str, float]:
    """The history sampler's weight of every task of D_{iteration-1}, from the pool's record of tries."""
    return history_weights(pool.tries(before=iteration), pool.admissions(iteration - 1), iteration, teachable, config)


# ---------------------------------------------------------------------------------------------------------------
# What a draw held (both samplers)
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DrawSummary:
    """One iteration's sample of D_{t-1}, counted: metrics.jsonl's `draw`."""

    tasks: int
    never_tried: int
    learnable: int
    mastered: int
    failing: int
    """The sample's tasks by standing (window `CurriculumConfig.window`) before the iteration."""
    synthetic: int
    """Synthesized tasks in the sample."""
    admitted_last: int
    """Tasks in the sample admitted after the previous iteration (D_{t-1} \\ D_{t-2})."""
    admitted_last_rollouts: int
    """The iteration's own rollouts (guided ones left out) on tasks admitted after the previous iteration."""
    admitted_last_pool: int
    """How many tasks were admitted after the previous iteration (what `admitted_last` could have been)."""

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def draw_summary(task_ids: Sequence[str], tries: Mapping[str, Sequence[Try]], admitted: Mapping[str, int],
                 synthetic: Iterable[str], iteration: int, rollout_task_ids: Iterable[str], window: int
                 ) -> DrawSummary:
    """Count a sample: `task_ids` drawn for `iteration` from D_{iteration-1} (`admitted`: id -> admission),
    `synthetic` the synthesized ids, `rollout_task_ids` the task of each own rollout of the iteration."""
    kinds = {kind: 0 for kind in STANDINGS}
    for task_id in task_ids:
        kinds[standing([rate for _, rate in tries.get(task_id, ())], window)] += 1
    synthetic = set(synthetic)
    fresh = {task_id for task_id, first in admitted.items() if first == iteration - 1 and task_id in synthetic}
    return DrawSummary(len(task_ids), kinds["never_tried"], kinds["learnable"], kinds["mastered"], kinds["failing"],
                       sum(1 for task_id in task_ids if task_id in synthetic),
                       sum(1 for task_id in task_ids if task_id in fresh),
                       sum(1 for task_id in rollout_task_ids if task_id in fresh), len(fresh))


def pool_draw_summary(pool: "TaskPool", iteration: int, task_ids: Sequence[str], rollout_task_ids: Iterable[str],
                      window: int) -> DrawSummary:
    """`draw_summary` of iteration `iteration`'s sample, read from the pool (tries before the iteration)."""
    if iteration < 1:
        return draw_summary((), {}, {}, (), iteration, (), window)
    return draw_summary(task_ids, pool.tries(before=iteration), pool.admissions(iteration - 1),
                        pool.admissions(iteration - 1, source="synthetic"), iteration, rollout_task_ids, window)
