"""Feedback signals mined from one iteration's rollouts (CoEvolve, arXiv 2604.15840, §3 "feedback signals").

After iteration t every task has K rollouts with scores s in [0, 1]. Three detectors, each a pure function of
numbers (tested against hand-worked cases in tests/test_signals.py), mark where the agent is weak:

    forgetting   ∃ s_i ∈ H_recent : s_i ≥ τ  and  s_now < τ      H_recent = the task's last W success rates
    boundary     ∃ k : s_k ≥ τ  and  ∃ k' : s_k' < τ               over the K rollouts of one task (GRPO group)
    rare         0 < c_p / N < θ / 100                             c_p = occurrences of action pattern p

τ (`threshold`, the paper's 0.5), W (`window`) and θ (`theta_percent`) are `SignalConfig` fields. `extract_signals`
applies the detectors to one iteration, exactly as written: it groups the rollouts by task, counts the action
patterns with `action_patterns` and calls `forgetting`, `boundary` and `rare_patterns`; it returns a `SignalReport`
with typed `SignalEvent`s and their evidence, each task's success rate and the pattern counts.

Where this pins down or departs from the paper
1. s_now is the mean score of the task's rollouts in this iteration; the history holds the s_now of earlier
   iterations, oldest first (the pool stores it, see pool.py). A task with no rollout this iteration raises nothing.
2. Action patterns are n-grams of tool names (sizes `ngram_sizes`, unigrams and bigrams by default) in call order;
   calls that could not be parsed have no name and are skipped. c_p counts occurrences, and N is the number of
   n-gram occurrences *of the same size* in the iteration, so a bigram competes with bigrams, not with the always
   more numerous unigrams. `rare_patterns` itself takes one counts mapping, N = its sum, exactly as specified.
3. θ is compared exactly as the decimal it is written as (`Fraction(str(θ))`): a pattern at exactly θ% (1 in 1000
   at θ = 0.1) is never rare, whatever binary floating point would round 0.1 / 100 to.
   `theta_percent: auto` chooses θ from the iteration's own count, per n-gram size: θ_t = 100 · r / N_t with
   r = `rare_below`, so that c_p / N_t < θ_t / 100 reads c_p < r — a pattern is rare when it occurs fewer than r
   times in the iteration. Why: a fixed θ means a different thing at every scale. The paper's iterations see
   thousands of patterns; a CPU iteration of 16 tasks x 4 rollouts sees ~80 unigrams, where θ = 1% asks for
   c_p < 0.8, which no pattern that occurs at all can meet (rare never fired at that scale). The θ actually used
   is in the report (`SignalReport.theta_percent`) and in metrics.jsonl (`patterns`); it exceeds 100 when an
   iteration saw fewer than r patterns of a size, and then every pattern it saw is rare (c_p <= N_t < r).
4. Which trajectories an event names: forgetting — the task's failed rollouts (s < τ; there is at least one since
   their mean is < τ), with `history_window` and `now`; boundary — all K rollouts (the contrast is the signal),
   with the success and failure counts; both carry `scores`, aligned with `trajectory_ids`. rare — one event per
   task, naming the rollouts that contain a rare pattern, with `frequencies` (each rare pattern they contain ->
   c_p / N). Which of them a given rollout holds is `action_patterns(its tool names)` ∩ those patterns.

5. `unexplored` (off by default; not the paper's): rare as the formula has it needs 0 < c_p, so a tool the policy
   never calls is never flagged, though it is the most under-explored action of all (what the method's own
   description calls rare). With `SignalConfig.unexplored`, every tool that some task of the iteration exposes
   and that none of its rollouts called (c_p = 0, counted over unigrams whatever `ngram_sizes` says) raises one
   rare event (`unexplored_tools`), on a task of the iteration that exposes it, with no trajectory and the
   evidence `{"unexplored": tool, "frequencies": {tool: 0.0}}`: exploration from there must call the tool
   (`coevolve.explore`). `extract_signals` needs `exposed` (task id -> the tools it exposes) for it.
   `SignalConfig.unexplored_orders` extends it from tools to orders: every ordered pair `a > b` of two different
   tools that a task of the iteration exposes and that no rollout made one right after the other (the bigram's
   c_p = 0) raises one rare event too, after the tools' (`unexplored_orders`), with the same evidence shape
   (`{"unexplored": "a > b", ...}`): exploration from there must call a, then b (`coevolve.explore`). Why: a
   policy that has every tool can still lack an order (`cd`, then an action in the folder), which no tool-level
   signal names. The pairs are many (up to n(n-1) for n tools) and come in an order drawn per iteration.

6. `unexplored_states` (off by default; not the paper's): the patterns above name tools and their orders, while
   what a data set lacks may be a *state* an action acts on (D_0's file-system tasks all act at the root, say).
   Each env says which state a call that ran acts on (`tool@state`, `coevolve.states`: the working directory for
   BFCL's file system, the arguments given for other tools) and which patterns its exposed tools could reach.
   c_p is counted over D_{t-1}'s solutions *and* the iteration's rollouts (a state the pool holds is not missing,
   even when the policy never reached it), and every pattern of the space with c_p < `rare_below` raises one rare
   event (`unexplored_states`) with the evidence `{"unexplored_state": pattern, "reached": c_p}`: exploration from
   there must reach that state before acting (`coevolve.explore`). The letter "reached by neither" would be
   c_p = 0; `rare_below` asks for a few tasks of each state, since one task is one group of K rollouts.

Cost: O(n) in the number of rollouts, about 7 µs per trajectory: 0.7 s for bench/signals.py's synthetic iteration
of 100,000 trajectories (12,500 tasks, K = 8, 40 tools; 0.8 s for its dense variant) on a 2-core x86_64 VM with
Python 3.11, median of 5, with other processes busy on both cores. BENCHMARKS.md has the figures of the last run.
"""

from __future__ import annotations

import gc
import math
import random
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Iterable, Iterator, Literal, Mapping, Sequence

from coevolve.records import SIGNAL_KINDS, SignalEvent, Trajectory

PATTERN_SEPARATOR = " > "
"""Joins the tool names of an n-gram into its pattern string: `cd > mkdir`."""


# ---------------------------------------------------------------------------------------------------------------
# The three detectors: pure functions, exactly as in the module docstring
# ---------------------------------------------------------------------------------------------------------------


def forgetting(history: Sequence[float], now: float, window: int, threshold: float = 0.5) -> bool:
    """True when a rate among the last `window` of `history` (oldest first) is ≥ threshold and `now` < threshold."""
    recent = _recent(history, _checked_window(window))
    return now < threshold and any(rate >= threshold for rate in recent)


def _checked_window(window: int) -> int:
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(f"window must be a non-negative int, got {window!r}")
    return window


def _recent(history: Sequence[float], window: int) -> list[float]:
    """H_recent: the last `window` rates (history[-0:] would be all of them, hence the guard)."""
    return list(history)[-window:] if window > 0 else []


def boundary(scores: Iterable[float], threshold: float = 0.5) -> bool:
    """True when the group holds a success (score ≥ threshold) and a failure (score < threshold)."""
    scores = list(scores)
    return any(score >= threshold for score in scores) and any(score < threshold for score in scores)


def auto_theta(total: int, rare_below: int) -> Fraction:
    """θ (in percent, exact) for an iteration that saw `total` patterns of one size: 100 · rare_below / total, so a
    pattern is rare exactly when it occurs fewer than `rare_below` times (note 3). 100 when nothing was seen."""
    if isinstance(rare_below, bool) or not isinstance(rare_below, int) or rare_below < 1:
        raise ValueError(f"rare_below must be a positive int, got {rare_below!r}")
    return Fraction(100 * rare_below, total) if total > 0 else Fraction(100)


def rare_patterns(counts: Mapping[str, int], theta_percent: float | Fraction) -> set[str]:
    """Patterns p with 0 < c_p / N < θ/100, N = sum of counts; compared exactly (see note 3 of the module)."""
    theta = _exact_fraction(theta_percent) / 100
    total = 0
    for pattern, count in counts.items():
        if count < 0:
            raise ValueError(f"negative count {count!r} for pattern {pattern!r}")
        total += count
    # c/N < num/den  <=>  c*den < num*N  (integers, no rounding)
    return {
        pattern for pattern, count in counts.items()
        if count > 0 and count * theta.denominator < theta.numerator * total
    }


def unexplored_tools(exposed: Mapping[str, Sequence[str]], called: Iterable[str]) -> list[tuple[str, str]]:
    """(tool, task id) for each tool some task exposes that was never called (c_p = 0), tools in order of first
    exposure; the k-th such tool goes to the k-th task that exposes it (cyclically), so that several unexplored
    tools start their explorations from several tasks."""
    called = set(called)
    tasks_of: dict[str, list[str]] = {}
    for task_id, tools in exposed.items():
        for tool in tools:
            if tool not in called:
                tasks_of.setdefault(tool, []).append(task_id)
    return [(tool, task_ids[index % len(task_ids)]) for index, (tool, task_ids) in enumerate(tasks_of.items())]


def unexplored_orders(exposed: Mapping[str, Sequence[str]], made: Iterable[str], iteration: int
                      ) -> list[tuple[str, str]]:
    """(pattern `a > b`, task id) for each ordered pair of two different tools that some task exposes and that no
    rollout made one right after the other (the bigram's c_p = 0), each on a task that exposes both. The pairs come
    in an order drawn from `iteration` (every iteration a different one, the same for the same arguments), so that
    a cap on explored contexts does not give the same few pairs every time; the k-th pair goes to the k-th task
    that exposes it (cyclically)."""
    made = set(made)
    tasks_of: dict[str, list[str]] = {}
    for task_id, tools in exposed.items():
        names = list(dict.fromkeys(tools))
        for first in names:
            for second in names:
                pattern = f"{first}{PATTERN_SEPARATOR}{second}"
                if first != second and pattern not in made:
                    tasks_of.setdefault(pattern, []).append(task_id)
    pairs = list(tasks_of.items())
    random.Random(f"unexplored-orders:{iteration}").shuffle(pairs)
    return [(pattern, task_ids[index % len(task_ids)]) for index, (pattern, task_ids) in enumerate(pairs)]


def unexplored_states(space: Mapping[str, Sequence[str]], counts: Mapping[str, int], below: int, iteration: int
                      ) -> list[tuple[str, str]]:
    """(state pattern `tool@state`, task id) for each pattern of some task's state space (`coevolve.states`) that D_t
    and the iteration's rollouts reached fewer than `below` times (`counts`: c_p over both), each on a task whose
    space holds it. The patterns come in an order drawn from `iteration`, the k-th to the k-th task that can reach
    it (cyclically), as for `unexplored_orders`."""
    tasks_of: dict[str, list[str]] = {}
    for task_id, patterns in space.items():
        for pattern in dict.fromkeys(patterns):
            if counts.get(pattern, 0) < below:
                tasks_of.setdefault(pattern, []).append(task_id)
    pairs = list(tasks_of.items())
    random.Random(f"unexplored-states:{iteration}").shuffle(pairs)
    return [(pattern, task_ids[index % len(task_ids)]) for index, (pattern, task_ids) in enumerate(pairs)]


def holds_order(tool_names: Sequence[str | None], order: Sequence[str]) -> bool:
    """Whether `order` occurs in `tool_names` as consecutive entries (a one-tool order: whether the tool occurs)."""
    names, wanted = list(tool_names), list(order)
    return any(names[start:start + len(wanted)] == wanted for start in range(len(names) - len(wanted) + 1))


def action_patterns(tool_names: Sequence[str], ngram_sizes: Sequence[int] = (1, 2)) -> list[str]:
    """Every n-gram of `tool_names` for each size, as pattern strings, with repeats: the definition of c_p."""
    names = tuple(tool_names)
    return [
        PATTERN_SEPARATOR.join(names[start:start + size])
        for size in ngram_sizes if size > 0 for start in range(len(names) - size + 1)
    ]


def _exact_fraction(value: float | Fraction) -> Fraction:
    if isinstance(value, Fraction):
        return value
    try:
        fraction = Fraction(str(value))  # the decimal as written: Fraction("0.1") == 1/10, Fraction(0.1) is not
    except (ValueError, ZeroDivisionError, OverflowError) as error:
        raise ValueError(f"theta_percent must be a finite number, got {value!r}") from error
    return fraction


# ---------------------------------------------------------------------------------------------------------------
# Configuration and the report
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SignalConfig:
    """How signals are mined. The paper gives τ = 0.5 but not W or θ; their defaults here are ours."""

    window: int = 3
    """W: how many of the task's most recent earlier success rates form H_recent (0 disables forgetting)."""
    threshold: float = 0.5
    """τ: a score (or success rate) ≥ τ is a success, < τ a failure; the paper uses 0.5."""
    theta_percent: float | Literal["auto"] = 1.0
    """θ: a pattern is rare when 0 < c_p / N < θ/100, i.e. under θ percent of its size's n-gram occurrences.
    `auto`: θ_t = 100 · rare_below / N_t, from the iteration's own count (note 3 of the module)."""
    rare_below: int = 3
    """With θ `auto`: a pattern is rare when it occurs fewer than this many times in the iteration."""
    ngram_sizes: tuple[int, ...] = (1, 2)
    """Action patterns are tool-name n-grams of these sizes (1 = single tools, 2 = consecutive pairs)."""
    enabled: tuple[str, ...] = SIGNAL_KINDS
    """Which detectors run (the paper's signal ablations switch one off)."""
    unexplored: bool = False
    """Rare also fires on the tools no rollout of the iteration called (note 5; not the paper's formula)."""
    unexplored_orders: bool = False
    """With `unexplored`: rare also fires on the ordered pairs of exposed tools that no rollout made one right
    after the other (note 5)."""
    unexplored_states: bool = False
    """Rare also fires on the action states (`tool@state`, the env's `states`) that D_t's solutions and the
    iteration's rollouts reached fewer than `rare_below` times (note 6; not the paper's formula)."""

    def __post_init__(self) -> None:
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 0:
            raise ValueError(f"window must be a non-negative int, got {self.window!r}")
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold must lie in [0, 1], got {self.threshold!r}")
        if self.theta_percent != "auto" and not 0.0 <= float(_exact_fraction(self.theta_percent)) <= 100.0:
            raise ValueError(f"theta_percent must lie in [0, 100] or be 'auto', got {self.theta_percent!r}")
        auto_theta(0, self.rare_below)  # checks rare_below
        sizes = tuple(self.ngram_sizes)
        if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
            raise ValueError(f"ngram_sizes must be positive ints, got {self.ngram_sizes!r}")
        if len(set(sizes)) != len(sizes):
            raise ValueError(f"ngram_sizes repeats a size: {self.ngram_sizes!r}")
        if self.unexplored_orders and not self.unexplored:
            raise ValueError("unexplored_orders extends the unexplored rare: set unexplored too")
        unknown = set(self.enabled) - set(SIGNAL_KINDS)
        if unknown:
            raise ValueError(f"unknown signal kinds {sorted(unknown)}; expected some of {SIGNAL_KINDS}")
        object.__setattr__(self, "ngram_sizes", sizes)
        object.__setattr__(self, "enabled", tuple(self.enabled))
        object.__setattr__(self, "threshold", float(self.threshold))  # so comparisons never mix int and float


@dataclass(frozen=True)
class SignalReport:
    """What one iteration's signals found."""

    iteration: int
    events: tuple[SignalEvent, ...]
    """In the order tasks first appear in the input; per task: forgetting, boundary, rare."""
    success_rates: Mapping[str, float]
    """Task id -> s_now (mean score this iteration): what the pool appends to each task's history."""
    pattern_counts: Mapping[int, Mapping[str, int]] = field(default_factory=dict)
    """n-gram size -> pattern -> occurrences this iteration (empty when `rare` is disabled)."""
    theta_percent: Mapping[int, float] = field(default_factory=dict)
    """n-gram size -> the θ used this iteration (the configured one, or `auto`'s choice); empty without `rare`."""
    rare: Mapping[int, frozenset[str]] = field(default_factory=dict)
    """n-gram size -> the patterns found rare this iteration."""

    def count(self, kind: str) -> int:
        return sum(1 for event in self.events if event.kind == kind)

    def pattern_summary(self) -> dict[str, dict[str, float | int]]:
        """Per n-gram size: patterns seen (N, with repeats), distinct patterns, rare ones, and θ: what decided rare."""
        return {str(size): {"total": sum(counts.values()), "distinct": len(counts),
                            "rare": len(self.rare.get(size, ())),
                            "theta_percent": self.theta_percent[size]}
                for size, counts in self.pattern_counts.items()}


# ---------------------------------------------------------------------------------------------------------------
# One iteration
# ---------------------------------------------------------------------------------------------------------------


def extract_signals(
    trajectories: Iterable[Trajectory],
    history: Mapping[str, Sequence[float]],
    config: SignalConfig,
    iteration: int,
    exposed: Mapping[str, Sequence[str]] | None = None,
    state_space: Mapping[str, Sequence[str]] | None = None,
    state_counts: Mapping[str, int] | None = None,
) -> SignalReport:
    """The signal events of one iteration, with each task's success rate and the action-pattern counts.

    `history` maps task id -> its success rates (in [0, 1], a list or tuple, oldest first) of *earlier* iterations,
    e.g. `TaskPool.histories(before=iteration, window=config.window)`; a task without one has never been solved.
    Rollouts of a task may come in any order; events follow the order in which tasks first appear, and the
    unexplored tools' events (note 5; with `config.unexplored` and `exposed`: task id -> its tools) come last, then
    the unexplored states' (note 6; with `config.unexplored_states`, `state_space`: task id -> the state patterns it
    can reach, and `state_counts`: c_p over D_t's solutions and these rollouts), then the unexplored orders'.
    """
    with _gc_paused():
        return _extract(trajectories, history, config, iteration, exposed or {}, state_space or {},
                        state_counts or {})


@contextmanager
def _gc_paused() -> Iterator[None]:
    # Extraction allocates many small containers and no reference cycles, but enough of them that the collector
    # may run a full collection of the caller's whole heap in the middle: with bench/signals.py's 100,000
    # trajectories alive (~0.6M objects), leaving it on took the median from 0.7 s to 1.0 s.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _extract(trajectories: Iterable[Trajectory], history: Mapping[str, Sequence[float]], config: SignalConfig,
             iteration: int, exposed: Mapping[str, Sequence[str]], state_space: Mapping[str, Sequence[str]],
             state_counts: Mapping[str, int]) -> SignalReport:
    threshold, window, enabled = config.threshold, config.window, config.enabled

    # Each task's rollouts (with their tool names, read once), tasks in order of first appearance.
    groups: dict[str, list[tuple[Trajectory, tuple[str, ...]]]] = {}
    for trajectory in trajectories:
        if not 0.0 <= trajectory.score <= 1.0:
            raise ValueError(f"scores must lie in [0, 1], got {trajectory.score!r}")
        groups.setdefault(trajectory.task_id, []).append((trajectory, trajectory.tool_names))

    # rare: c_p and N are counted over the whole iteration, separately for each n-gram size (note 2).
    pattern_counts: dict[int, dict[str, int]] = {}
    rare_by_size: dict[int, set[str]] = {}
    theta_by_size: dict[int, float] = {}
    frequency: dict[str, float] = {}
    if "rare" in enabled:
        for size in config.ngram_sizes:
            counts: Counter[str] = Counter()
            for group in groups.values():
                for _, names in group:
                    counts.update(action_patterns(names, (size,)))
            pattern_counts[size] = dict(counts)
            total = sum(counts.values())
            theta = (auto_theta(total, config.rare_below) if config.theta_percent == "auto"
                     else _exact_fraction(config.theta_percent))
            theta_by_size[size] = float(theta)
            rare_by_size[size] = rare_patterns(counts, theta)
            frequency.update((pattern, counts[pattern] / total) for pattern in rare_by_size[size])

    events: list[SignalEvent] = []
    success_rates: dict[str, float] = {}
    for task_id, group in groups.items():
        ids = tuple(trajectory.id for trajectory, _ in group)
        scores = [trajectory.score for trajectory, _ in group]
        # fsum is exactly rounded, so the rate does not depend on the order of the K rollouts.
        now = success_rates[task_id] = math.fsum(scores) / len(scores)

        if "forgetting" in enabled and forgetting(history.get(task_id, ()), now, window, threshold):
            failed = [index for index, score in enumerate(scores) if score < threshold]
            events.append(SignalEvent("forgetting", task_id, iteration, tuple(ids[i] for i in failed), {
                "threshold": threshold, "window": window, "history_window": _recent(history[task_id], window),
                "now": now, "scores": [scores[i] for i in failed],
            }))

        if "boundary" in enabled and boundary(scores, threshold):
            successes = sum(1 for score in scores if score >= threshold)
            events.append(SignalEvent("boundary", task_id, iteration, ids, {
                "threshold": threshold, "successes": successes, "failures": len(scores) - successes,
                "scores": scores,
            }))

        if "rare" in enabled:
            flagged: list[str] = []
            held: dict[str, None] = {}  # the rare patterns of the flagged rollouts, in order of first appearance
            for trajectory, names in group:
                patterns = _rare_patterns_in(names, rare_by_size)
                if patterns:
                    flagged.append(trajectory.id)
                    held.update(dict.fromkeys(patterns))
            if flagged:
                events.append(SignalEvent("rare", task_id, iteration, tuple(flagged), {
                    "theta_percent": config.theta_percent if config.theta_percent != "auto" else {
                        str(size): theta_by_size[size] for size in rare_by_size},
                    "frequencies": {pattern: frequency[pattern] for pattern in held},
                }))

    if "rare" in enabled and config.unexplored:
        called = {name for group in groups.values() for _, names in group for name in names}
        for tool, task_id in unexplored_tools({task: exposed[task] for task in groups if task in exposed}, called):
            events.append(SignalEvent("rare", task_id, iteration, (), {
                "unexplored": tool, "frequencies": {tool: 0.0}}))
    if "rare" in enabled and config.unexplored_states:
        for pattern, task_id in unexplored_states({task: state_space[task] for task in groups if task in state_space},
                                                  state_counts, config.rare_below, iteration):
            events.append(SignalEvent("rare", task_id, iteration, (), {
                "unexplored_state": pattern, "reached": state_counts.get(pattern, 0), "frequencies": {pattern: 0.0}}))
    if "rare" in enabled and config.unexplored:
        if config.unexplored_orders:
            made = {pattern for group in groups.values() for _, names in group
                    for pattern in action_patterns(names, (2,))}
            for pattern, task_id in unexplored_orders({task: exposed[task] for task in groups if task in exposed},
                                                      made, iteration):
                events.append(SignalEvent("rare", task_id, iteration, (), {
                    "unexplored": pattern, "frequencies": {pattern: 0.0}}))

    return SignalReport(iteration, tuple(events), success_rates, pattern_counts, theta_by_size,
                        {size: frozenset(rare) for size, rare in rare_by_size.items()})


def _rare_patterns_in(tool_names: tuple[str, ...], rare_by_size: Mapping[int, set[str]]) -> list[str]:
    """The rare patterns one rollout holds, by n-gram size then position, with repeats."""
    return [
        pattern for size, rare in rare_by_size.items() if rare
        for pattern in action_patterns(tool_names, (size,)) if pattern in rare
    ]
