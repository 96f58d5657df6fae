"""Feedback signals mined from one iteration's rollouts (CoEvolve, arXiv 2604.15840, §3 "feedback signals").

After iteration t every task has K rollouts with scores s in [0, 1]. Three detectors, each a pure function of
numbers (tested against hand-worked cases in tests/test_signals.py), mark where the agent is weak:

    forgetting   ∃ s_i ∈ H_recent : s_i ≥ τ  and  s_now < τ      H_recent = the task's last W success rates
    boundary     ∃ k : s_k ≥ τ  and  ∃ k' : s_k' < τ               over the K rollouts of one task (GRPO group)
    rare         0 < c_p / N < θ / 100                             c_p = occurrences of action pattern p

τ (`threshold`, the paper's 0.5), W (`window`) and θ (`theta_percent`) are `SignalConfig` fields. `extract_signals`
applies the detectors to one iteration and returns typed `SignalEvent`s with their evidence; `mine_signals` is the
same over columns (parallel lists), which is what the hot path and the benchmark use — `extract_signals` converts
its `Trajectory`s to columns and calls it, so there is one implementation.

Where this pins down or departs from the paper
1. s_now is the mean score of the task's rollouts in this iteration; the history holds the s_now of earlier
   iterations, oldest first (the pool stores it, see pool.py). A task with no rollout this iteration raises nothing.
2. Action patterns are n-grams of tool names (sizes `ngram_sizes`, unigrams and bigrams by default) in call order;
   calls that could not be parsed have no name and are skipped. c_p counts occurrences, and N is the number of
   n-gram occurrences *of the same size* in the iteration, so a bigram competes with bigrams, not with the always
   more numerous unigrams. `rare_patterns` itself takes one counts mapping, N = its sum, exactly as specified.
3. θ is compared exactly as the decimal it is written as (`Fraction(str(θ))`): a pattern at exactly θ% (1 in 1000
   at θ = 0.1) is never rare, whatever binary floating point would round 0.1 / 100 to.
4. Which trajectories an event names: forgetting — the task's failed rollouts (s < τ; there is at least one since
   their mean is < τ), with `history_window` and `now`; boundary — all K rollouts (the contrast is the signal),
   with the success and failure counts; both carry `scores`, aligned with `trajectory_ids`. rare — one event per
   task, naming the rollouts that contain a rare pattern, with `frequencies` (each rare pattern they contain ->
   c_p / N). Which of them a given rollout holds is `action_patterns(its tool names)` ∩ those patterns.

Cost: O(n) in the number of rollout records. The per-record work runs in C (slicing, map/compress, set and dict
probes, Counter): each detector is evaluated for all groups at once with the identity noted next to it (e.g.
boundary ⇔ max ≥ τ > min), and tests/test_signals.py checks that fast path against the pure functions on
generated iterations. Python-level loops run once per signal event and once per *distinct* tool sequence.
See bench/signals.py and BENCHMARKS.md.
"""

from __future__ import annotations

import gc
import math
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from functools import partial
from itertools import chain, compress, islice, repeat
from operator import add, and_, ge, itemgetter, lt, ne, not_, truediv
from typing import Iterable, Iterator, Mapping, Sequence

from coevolve.records import SIGNAL_KINDS, SignalEvent, Trajectory

PATTERN_SEPARATOR = " > "
"""Joins the tool names of an n-gram into its pattern string: `cd > mkdir`."""


# ---------------------------------------------------------------------------------------------------------------
# The three detectors: pure functions, exactly as in DESIGN.md ("Public interface")
# ---------------------------------------------------------------------------------------------------------------


def forgetting(history: Sequence[float], now: float, window: int, threshold: float = 0.5) -> bool:
    """True when a rate among the last `window` of `history` (oldest first) is ≥ threshold and `now` < threshold."""
    return now < threshold and _solved_recently(history, _checked_window(window), threshold)


def _checked_window(window: int) -> int:
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(f"window must be a non-negative int, got {window!r}")
    return window


def _recent(history: Sequence[float], window: int) -> list[float]:
    """H_recent: the last `window` rates (history[-0:] would be all of them, hence the guard)."""
    return list(history)[-window:] if window > 0 else []


def _solved_recently(history: Sequence[float], window: int, threshold: float) -> bool:
    return any(map(ge, _recent(history, window), repeat(threshold)))


def boundary(scores: Iterable[float], threshold: float = 0.5) -> bool:
    """True when the group holds a success (score ≥ threshold) and a failure (score < threshold)."""
    scores = list(scores)
    return any(map(ge, scores, repeat(threshold))) and any(map(lt, scores, repeat(threshold)))


def rare_patterns(counts: Mapping[str, int], theta_percent: float) -> set[str]:
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


def action_patterns(tool_names: Sequence[str], ngram_sizes: Sequence[int] = (1, 2)) -> list[str]:
    """Every n-gram of `tool_names` for each size, as pattern strings, with repeats: the definition of c_p."""
    return [
        PATTERN_SEPARATOR.join(gram) for size in ngram_sizes for gram in _ngrams(tuple(tool_names), size)
    ]


def _ngrams(sequence: tuple[str, ...], size: int) -> Iterable[tuple[str, ...]]:
    return zip(*(sequence[offset:] for offset in range(size)))


def _gram_pattern(gram: str | tuple[str, ...]) -> str:
    return gram if isinstance(gram, str) else PATTERN_SEPARATOR.join(gram)


def _exact_fraction(value: float) -> Fraction:
    try:
        fraction = Fraction(str(value))  # the decimal as written: Fraction("0.1") == 1/10, Fraction(0.1) is not
    except (ValueError, ZeroDivisionError, OverflowError) as error:
        raise ValueError(f"theta_percent must be a finite number, got {value!r}") from error
    return fraction


# ---------------------------------------------------------------------------------------------------------------
# Configuration and the columnar input
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SignalConfig:
    """How signals are mined. The notes on the paper give τ = 0.5 but not W or θ; their defaults here are ours."""

    window: int = 3
    """W: how many of the task's most recent earlier success rates form H_recent (0 disables forgetting)."""
    threshold: float = 0.5
    """τ: a score (or success rate) ≥ τ is a success, < τ a failure; the paper uses 0.5."""
    theta_percent: float = 1.0
    """θ: a pattern is rare when 0 < c_p / N < θ/100, i.e. under θ percent of its size's n-gram occurrences."""
    ngram_sizes: tuple[int, ...] = (1, 2)
    """Action patterns are tool-name n-grams of these sizes (1 = single tools, 2 = consecutive pairs)."""
    enabled: tuple[str, ...] = SIGNAL_KINDS
    """Which detectors run (the paper's signal ablations switch one off)."""

    def __post_init__(self) -> None:
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 0:
            raise ValueError(f"window must be a non-negative int, got {self.window!r}")
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold must lie in [0, 1], got {self.threshold!r}")
        if not 0.0 <= float(_exact_fraction(self.theta_percent)) <= 100.0:
            raise ValueError(f"theta_percent must lie in [0, 100], got {self.theta_percent!r}")
        sizes = tuple(self.ngram_sizes)
        if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
            raise ValueError(f"ngram_sizes must be positive ints, got {self.ngram_sizes!r}")
        if len(set(sizes)) != len(sizes):
            raise ValueError(f"ngram_sizes repeats a size: {self.ngram_sizes!r}")
        unknown = set(self.enabled) - set(SIGNAL_KINDS)
        if unknown:
            raise ValueError(f"unknown signal kinds {sorted(unknown)}; expected some of {SIGNAL_KINDS}")
        object.__setattr__(self, "ngram_sizes", sizes)
        object.__setattr__(self, "enabled", tuple(self.enabled))
        object.__setattr__(self, "threshold", float(self.threshold))  # so comparisons never mix int and float


@dataclass(frozen=True)
class RolloutColumns:
    """One iteration's rollouts as parallel columns, one entry per trajectory (what the hot path reads)."""

    trajectory_ids: Sequence[str]
    task_ids: Sequence[str]
    """Rollouts of a task may come in any order; contiguous groups (the usual K in a row) are fastest."""
    scores: Sequence[float]
    """Env scores in [0, 1]."""
    tool_names: Sequence[tuple[str, ...]]
    """Per trajectory, the names of its parsed calls in order (`Trajectory.tool_names`)."""

    def __post_init__(self) -> None:
        # Lists support the C-level slicing the extraction relies on; tuple() on a tuple is free.
        object.__setattr__(self, "trajectory_ids", list(self.trajectory_ids))
        object.__setattr__(self, "task_ids", list(self.task_ids))
        object.__setattr__(self, "scores", list(self.scores))
        object.__setattr__(self, "tool_names", list(map(tuple, self.tool_names)))
        lengths = {len(self.trajectory_ids), len(self.task_ids), len(self.scores), len(self.tool_names)}
        if len(lengths) != 1:
            raise ValueError(
                f"columns differ in length: {len(self.trajectory_ids)} trajectory ids, {len(self.task_ids)} task ids, "
                f"{len(self.scores)} scores, {len(self.tool_names)} tool-name tuples"
            )

    def __len__(self) -> int:
        return len(self.task_ids)

    @classmethod
    def from_trajectories(cls, trajectories: Iterable[Trajectory]) -> "RolloutColumns":
        trajectories = list(trajectories)
        return cls(
            [t.id for t in trajectories], [t.task_id for t in trajectories],
            [t.score for t in trajectories], [t.tool_names for t in trajectories],
        )


@dataclass(frozen=True)
class SignalReport:
    """What one iteration's feedback phase found."""

    iteration: int
    events: tuple[SignalEvent, ...]
    """In the order tasks first appear in the input; per task: forgetting, boundary, rare."""
    success_rates: Mapping[str, float]
    """Task id -> s_now (mean score this iteration): what the pool appends to each task's history."""
    pattern_counts: Mapping[int, Mapping[str, int]] = field(default_factory=dict)
    """n-gram size -> pattern -> occurrences this iteration (empty when `rare` is disabled)."""

    def count(self, kind: str) -> int:
        return sum(1 for event in self.events if event.kind == kind)


# ---------------------------------------------------------------------------------------------------------------
# One iteration
# ---------------------------------------------------------------------------------------------------------------


def extract_signals(
    trajectories: Iterable[Trajectory],
    history: Mapping[str, Sequence[float]],
    config: SignalConfig,
    iteration: int,
) -> list[SignalEvent]:
    """The signal events of one iteration.

    `history` maps task id -> its success rates (in [0, 1], a list or tuple, oldest first) of *earlier* iterations,
    e.g. `TaskPool.histories(before=iteration, window=config.window)`; a task without one has never been solved.
    """
    return list(mine_signals(RolloutColumns.from_trajectories(trajectories), history, config, iteration).events)


def mine_signals(
    columns: RolloutColumns,
    history: Mapping[str, Sequence[float]],
    config: SignalConfig,
    iteration: int,
) -> SignalReport:
    """`extract_signals` over columns, also returning this iteration's success rates and pattern counts."""
    with _gc_paused():
        return _mine(columns, history, config, iteration)


@contextmanager
def _gc_paused() -> Iterator[None]:
    # The extraction allocates many small containers and no reference cycles; on a large heap (a trainer holds
    # millions of objects) the cyclic collector would repeatedly walk that heap for nothing: with the 1M records
    # of bench/signals.py alive, extraction took about twice as long with the collector running.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _mine(columns: RolloutColumns, history: Mapping[str, Sequence[float]], config: SignalConfig,
          iteration: int) -> SignalReport:
    _check_scores(columns.scores)
    columns, task_keys, starts, ends = _grouped_by_task(columns)
    threshold, window, enabled = config.threshold, config.window, set(config.enabled)
    task_count = len(task_keys)
    spans = list(map(slice, starts, ends))
    group_scores = list(map(columns.scores.__getitem__, spans))
    # s_now per task; fsum is exactly rounded, so the rate does not depend on the order of the K rollouts.
    rates = list(map(truediv, map(math.fsum, group_scores), map(len, group_scores)))

    # Bit flags per task. Each detector below is its pure function evaluated for all groups at once in C;
    # tests/test_signals.py checks the fast path against the pure functions on generated iterations.
    FORGETTING, BOUNDARY, RARE = 1, 2, 4
    flags = [0] * task_count
    if "forgetting" in enabled and window > 0:
        # s_now < τ, and max(H_recent) >= τ (an empty window has no max: -inf)
        failing = list(compress(range(task_count), map(lt, rates, repeat(threshold))))
        earlier = map(history.get, map(task_keys.__getitem__, failing), repeat(()))
        peaks = map(_peak, map(itemgetter(slice(-window, None)), earlier))
        for index in compress(failing, map(ge, peaks, repeat(threshold))):
            flags[index] |= FORGETTING
    if "boundary" in enabled:
        # some s >= τ is max >= τ, and some s < τ is min < τ (scores are validated: no NaN)
        has_success = map(ge, map(max, group_scores), repeat(threshold))
        has_failure = map(lt, map(min, group_scores), repeat(threshold))
        for index in compress(range(task_count), map(and_, has_success, has_failure)):
            flags[index] |= BOUNDARY
    pattern_counts: dict[int, dict[str, int]] = {}
    rare = _RarePatterns({}, {}, {})
    if "rare" in enabled:
        rare = _find_rare_patterns(columns.tool_names, config)
        pattern_counts = rare.counts
        if rare.patterns_of:
            holds_rare = map(rare.patterns_of.keys().isdisjoint, map(columns.tool_names.__getitem__, spans))
            for index in compress(range(task_count), map(not_, holds_rare)):
                flags[index] |= RARE

    events: list[SignalEvent] = []
    trajectory_ids, tool_names = columns.trajectory_ids, columns.tool_names
    patterns_of, frequency = rare.patterns_of, rare.frequency
    for index in compress(range(task_count), flags):
        kinds, task_id = flags[index], task_keys[index]
        group, ids = group_scores[index], trajectory_ids[spans[index]]
        if kinds & FORGETTING:
            failed = list(map(lt, group, repeat(threshold)))  # at least one: their mean is < τ
            events.append(SignalEvent("forgetting", task_id, iteration, tuple(compress(ids, failed)), {
                "threshold": threshold, "window": window, "history_window": _recent(history[task_id], window),
                "now": rates[index], "scores": list(compress(group, failed)),
            }))
        if kinds & BOUNDARY:
            successes = sum(map(ge, group, repeat(threshold)))
            events.append(SignalEvent("boundary", task_id, iteration, tuple(ids), {
                "threshold": threshold, "successes": successes, "failures": len(group) - successes,
                "scores": list(group),
            }))
        if kinds & RARE:
            sequences = tool_names[spans[index]]
            flagged = list(map(patterns_of.__contains__, sequences))
            # the rare patterns of the flagged rollouts, in order of first appearance, without repeats
            patterns = dict.fromkeys(chain.from_iterable(map(patterns_of.__getitem__, compress(sequences, flagged))))
            events.append(SignalEvent("rare", task_id, iteration, tuple(compress(ids, flagged)), {
                "theta_percent": config.theta_percent,
                "frequencies": dict(zip(patterns, map(frequency.__getitem__, patterns))),
            }))
    return SignalReport(iteration, tuple(events), dict(zip(task_keys, rates)), pattern_counts)


_peak = partial(max, default=-math.inf)


def _check_scores(scores: Sequence[float]) -> None:
    if not scores:
        return
    # Three C-level passes: sum() turns any NaN into NaN, min/max catch the range.
    if math.isnan(sum(scores)) or min(scores) < 0.0 or max(scores) > 1.0:
        bad = next(s for s in scores if not 0.0 <= s <= 1.0)
        raise ValueError(f"scores must lie in [0, 1], got {bad!r}")


def _task_spans(task_ids: list[str]) -> tuple[list[str], list[int], list[int]]:
    """Maximal runs [start, end) of consecutive records of one task: (task of each run, starts, ends)."""
    count = len(task_ids)
    if count == 0:
        return [], [], []
    # Positions where the task id changes, found in C: no Python step per record.
    changes = list(compress(range(1, count), map(ne, islice(task_ids, 1, None), task_ids)))
    starts = [0, *changes]
    return list(map(task_ids.__getitem__, starts)), starts, [*changes, count]


def _grouped_by_task(
    columns: RolloutColumns,
) -> tuple[RolloutColumns, list[str], list[int], list[int]]:
    """The columns with each task's records contiguous (stable order), and their spans.

    Rollouts arrive grouped (K in a row) in practice, and then this is O(n) and copies nothing. Scattered input is
    reordered by a stable sort on the task's first position: O(n log n), same results.
    """
    task_keys, starts, ends = _task_spans(columns.task_ids)
    if len(set(task_keys)) == len(task_keys):
        return columns, task_keys, starts, ends
    first_position: dict[str, int] = {}
    order_keys = list(map(first_position.setdefault, columns.task_ids, range(len(columns))))
    order = sorted(range(len(columns)), key=order_keys.__getitem__)
    columns = RolloutColumns(*(list(map(column.__getitem__, order)) for column in (
        columns.trajectory_ids, columns.task_ids, columns.scores, columns.tool_names)))
    return (columns, *_task_spans(columns.task_ids))


@dataclass(frozen=True)
class _RarePatterns:
    counts: dict[int, dict[str, int]]
    """n-gram size -> pattern -> occurrences."""
    frequency: dict[str, float]
    """Rare pattern -> c_p / N (N: occurrences of n-grams of its size)."""
    patterns_of: dict[tuple[str, ...], tuple[str, ...]]
    """Tool sequence -> the rare patterns it contains (by size, then position), for sequences holding any."""


def _find_rare_patterns(tool_names: list[tuple[str, ...]], config: SignalConfig) -> _RarePatterns:
    """Count the action patterns of one iteration, find the rare ones and the tool sequences that hold one."""
    # One C-level pass over the records; everything after runs once per *distinct* tool sequence (rollouts of
    # one policy repeat themselves), weighted by how often it occurred.
    multiplicity = Counter(tool_names)
    sequences = list(multiplicity)

    counts_by_size: dict[int, dict[str, int]] = {}
    frequency: dict[str, float] = {}
    rare_grams: dict[int, dict[str | tuple[str, ...], str]] = {}
    for size in config.ngram_sizes:
        gram_counts: dict[str | tuple[str, ...], int] = {}
        get = gram_counts.get
        for grams, times in zip(_all_grams(sequences, size), multiplicity.values()):
            for gram in grams:
                gram_counts[gram] = get(gram, 0) + times
        patterns = {_gram_pattern(gram): gram for gram in gram_counts}
        counts = counts_by_size[size] = {pattern: gram_counts[gram] for pattern, gram in patterns.items()}
        total = sum(counts.values())
        rare = sorted(rare_patterns(counts, config.theta_percent))
        rare_grams[size] = {patterns[pattern]: pattern for pattern in rare}
        frequency.update((pattern, counts[pattern] / total) for pattern in rare)

    # The rare patterns of every distinct sequence, by size then position, built with C-level map/filter (no
    # Python frame per sequence); only sequences that hold one are kept.
    found: list[list[str]] = [[] for _ in sequences]
    for size, grams in rare_grams.items():
        if grams:  # per sequence: map(grams.__getitem__, filter(grams.__contains__, its n-grams))
            rare_grams_in = map(filter, repeat(grams.__contains__), _all_grams(sequences, size))
            found = list(map(add, found, map(list, map(map, repeat(grams.__getitem__), rare_grams_in))))
    patterns_of = dict(zip(compress(sequences, found), map(tuple, map(dict.fromkeys, compress(found, found)))))
    return _RarePatterns(counts_by_size, frequency, patterns_of)


def _all_grams(sequences: list[tuple[str, ...]], size: int) -> Iterable[Iterable[str | tuple[str, ...]]]:
    """Per sequence, its n-grams as hashable keys, built in C (no Python frame per sequence).

    Size 1 yields the names themselves (no 1-tuples to build); larger sizes yield tuples, like `_ngrams`.
    """
    if size == 1:
        return sequences
    return map(zip, *(map(itemgetter(slice(offset, None)), sequences) for offset in range(size)))
