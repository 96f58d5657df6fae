"""The three feedback signals against hand-worked cases, their edges, and properties (coevolve/signals.py)."""

from __future__ import annotations

import math
import random
from collections import Counter
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coevolve.records import SignalEvent, Step, ToolCall, Trajectory
from coevolve.signals import (
    SignalConfig,
    SignalReport,
    action_patterns,
    auto_theta,
    boundary,
    extract_signals,
    forgetting,
    rare_patterns,
)

# ---------------------------------------------------------------------------------------------------------------
# forgetting: ∃ s_i ∈ H_recent (last W of history) with s_i ≥ τ, and s_now < τ
# ---------------------------------------------------------------------------------------------------------------


def test_forgetting_when_a_rate_in_the_window_was_a_success():
    assert forgetting([0.2, 0.6, 0.3], now=0.4, window=2)  # H_recent = [0.6, 0.3]; 0.6 >= 0.5 > 0.4


def test_forgetting_window_boundary_excludes_the_older_success():
    assert not forgetting([0.2, 0.6, 0.3], now=0.4, window=1)  # H_recent = [0.3]; the 0.6 is just outside
    assert not forgetting([0.9, 0.1, 0.2], now=0.0, window=2)
    assert forgetting([0.9, 0.1, 0.2], now=0.0, window=3)


def test_forgetting_window_longer_than_history_uses_all_of_it():
    assert forgetting([0.7], now=0.0, window=10)


def test_forgetting_now_exactly_at_threshold_is_not_a_failure():
    assert not forgetting([1.0, 1.0], now=0.5, window=2)
    assert forgetting([1.0, 1.0], now=0.4999, window=2)


def test_forgetting_earlier_rate_exactly_at_threshold_counts_as_solved():
    assert forgetting([0.5], now=0.0, window=1)
    assert not forgetting([0.4999], now=0.0, window=1)


def test_forgetting_with_empty_history_or_zero_window_is_false():
    assert not forgetting([], now=0.0, window=3)
    assert not forgetting([1.0, 1.0], now=0.0, window=0)  # not history[-0:], which would be the whole list


def test_forgetting_threshold_is_a_parameter():
    assert forgetting([0.7], 0.65, 1, threshold=0.7)
    assert not forgetting([0.7], 0.65, 1, threshold=0.8)  # 0.7 was not a success at τ = 0.8
    assert not forgetting([0.7], 0.65, 1, threshold=0.6)  # 0.65 is not a failure at τ = 0.6


@pytest.mark.parametrize("window", [-1, 1.5, True, "2"])
def test_forgetting_rejects_a_bad_window(window):
    with pytest.raises(ValueError):
        forgetting([1.0], 0.0, window)


# ---------------------------------------------------------------------------------------------------------------
# boundary: the group holds a success (s ≥ τ) and a failure (s < τ)
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scores", "expected"),
    [
        ([1.0, 0.0], True),
        ([0.5, 0.4999], True),  # 0.5 is a success, 0.4999 a failure
        ([0.5, 0.5, 0.5], False),  # exactly 0.5 everywhere: all successes
        ([0.4999, 0.0, 0.2], False),
        ([1.0], False),
        ([], False),
    ],
)
def test_boundary_hand_worked(scores, expected):
    assert boundary(scores) is expected


def test_boundary_threshold_is_a_parameter():
    assert boundary([0.3, 0.1], threshold=0.2)
    assert not boundary([0.3, 0.1], threshold=0.5)


# ---------------------------------------------------------------------------------------------------------------
# rare: 0 < c_p / N < θ/100, N = sum of counts
# ---------------------------------------------------------------------------------------------------------------


def test_rare_pattern_exactly_at_theta_is_not_rare():
    counts = {"mv": 1, "ls": 19}  # N = 20; mv is 1/20 = 5%
    assert rare_patterns(counts, 5) == set()
    assert rare_patterns(counts, 5.01) == {"mv"}


def test_rare_comparison_is_exact_where_floats_would_round():
    counts = {"mv": 9, "ls": 991}  # mv is 9/1000 = exactly 0.9%
    assert 9 / 1000 < 0.9 / 100  # binary floating point would call it rare...
    assert rare_patterns(counts, 0.9) == set()  # ...but it sits exactly at θ
    assert rare_patterns({"mv": 1, "ls": 999}, 0.1) == set()


def test_rare_needs_a_positive_count_and_a_nonempty_total():
    assert rare_patterns({"never": 0, "ls": 5}, 50) == set()  # 0 is not > 0; ls is 100%
    assert rare_patterns({}, 50) == set()
    assert rare_patterns({"a": 0, "b": 0}, 100) == set()


def test_rare_at_theta_100_and_0():
    assert rare_patterns({"a": 1, "b": 1}, 100) == {"a", "b"}  # 50% < 100%
    assert rare_patterns({"a": 1, "b": 1000}, 0) == set()


def test_rare_rejects_negative_counts_and_nan_theta():
    with pytest.raises(ValueError):
        rare_patterns({"a": -1, "b": 3}, 50)
    with pytest.raises(ValueError):
        rare_patterns({"a": 1}, float("nan"))


def test_action_patterns_are_unigrams_then_bigrams_with_repeats():
    assert action_patterns(("cd", "ls", "cd")) == ["cd", "ls", "cd", "cd > ls", "ls > cd"]
    assert action_patterns(("cd", "ls", "cd"), (3,)) == ["cd > ls > cd"]
    assert action_patterns((), (1, 2)) == []
    assert action_patterns(("cd",), (2,)) == []
    assert action_patterns(("cd", "ls"), (0,)) == []


# ---------------------------------------------------------------------------------------------------------------
# One iteration, worked by hand
# ---------------------------------------------------------------------------------------------------------------

# Four tasks x K = 4 rollouts. Unigram counts over the iteration: ls 15, cd 4, mv 1 (N = 20; D4 made no call).
HAND_ROLLOUTS = [
    ("A1", "A", 1.0, ("ls",)), ("A2", "A", 0.0, ("ls",)), ("A3", "A", 0.0, ("ls", "cd")), ("A4", "A", 0.0, ("ls",)),
    ("B1", "B", 0.0, ("ls",)), ("B2", "B", 0.0, ("ls",)), ("B3", "B", 0.0, ("ls", "mv")), ("B4", "B", 0.0, ("ls",)),
    ("C1", "C", 1.0, ("ls",)), ("C2", "C", 1.0, ("ls",)),
    ("C3", "C", 1.0, ("ls", "cd")), ("C4", "C", 1.0, ("ls", "cd")),
    ("D1", "D", 0.5, ("ls", "cd")), ("D2", "D", 0.5, ("ls",)), ("D3", "D", 0.0, ("ls",)), ("D4", "D", 0.0, ()),
]
HAND_HISTORY = {"A": [0.9, 0.1, 0.2], "B": [0.3, 0.5]}  # C and D have none


def trajectory(trajectory_id, task_id, score, names, unparsed_at=None) -> Trajectory:
    """A rollout calling `names` in order; `unparsed_at`: position of an extra call that could not be parsed."""
    steps = [Step(0, index, f"{name}()", ToolCall(name), "ok") for index, name in enumerate(names)]
    if unparsed_at is not None:
        steps.insert(unparsed_at, Step(0, len(names), "garbage(", None, "", "parse error"))
    return Trajectory(trajectory_id, task_id, 0, 0, tuple(steps), score)


def trajectories(rollouts=HAND_ROLLOUTS) -> list[Trajectory]:
    return [trajectory(*rollout) for rollout in rollouts]


def test_extract_hand_worked_iteration():
    config = SignalConfig(window=2, theta_percent=20, ngram_sizes=(1,))
    report = extract_signals(trajectories(), HAND_HISTORY, config, iteration=4)
    assert isinstance(report, SignalReport) and report.iteration == 4
    assert report.success_rates == {"A": 0.25, "B": 0.0, "C": 1.0, "D": 0.25}
    assert report.pattern_counts == {1: {"ls": 15, "cd": 4, "mv": 1}}
    assert [(e.kind, e.task_id) for e in report.events] == [
        ("boundary", "A"),  # 1 success, 3 failures; no forgetting: A's 0.9 lies outside W = 2
        ("forgetting", "B"),  # H_recent = [0.3, 0.5]: 0.5 >= 0.5, and now 0.0 < 0.5
        ("rare", "B"),  # mv: 1/20 = 5% < 20%; cd: 4/20 = exactly 20%, not rare
        ("boundary", "D"),  # 0.5 counts as a success
    ]
    assert (report.count("boundary"), report.count("forgetting"), report.count("rare")) == (2, 1, 1)
    boundary_a, forgetting_b, rare_b, boundary_d = report.events
    assert boundary_a.trajectory_ids == ("A1", "A2", "A3", "A4")
    assert boundary_a.evidence == {
        "threshold": 0.5, "successes": 1, "failures": 3, "scores": [1.0, 0.0, 0.0, 0.0],
    }
    assert forgetting_b.trajectory_ids == ("B1", "B2", "B3", "B4")  # the failed rollouts: all of them
    assert forgetting_b.evidence == {
        "threshold": 0.5, "window": 2, "history_window": [0.3, 0.5], "now": 0.0, "scores": [0.0, 0.0, 0.0, 0.0],
    }
    assert rare_b.trajectory_ids == ("B3",)
    assert rare_b.evidence == {"theta_percent": 20, "frequencies": {"mv": 0.05}}
    assert (boundary_d.evidence["successes"], boundary_d.evidence["failures"]) == (2, 2)
    assert all(event.iteration == 4 for event in report.events)


def test_auto_theta_is_the_count_over_the_total():
    assert auto_theta(80, 3) == Fraction(15, 4)  # 3.75%: 2 of 80 is rare (2.5%), 3 of 80 is not (exactly 3.75%)
    assert rare_patterns({"a": 2, "b": 3, "c": 75}, auto_theta(80, 3)) == {"a"}
    assert auto_theta(0, 3) == 100
    with pytest.raises(ValueError):
        auto_theta(10, 0)


def test_extract_auto_theta_from_the_iterations_own_counts():
    """HAND_ROLLOUTS: unigrams ls 15, cd 4, mv 1 (N = 20); bigrams ls>cd 4, ls>mv 1 (N = 5). rare_below = 3:
    θ_1 = 100 x 3/20 = 15% -> mv (1) rare, cd (4) not; θ_2 = 100 x 3/5 = 60% -> ls>mv (1) rare, ls>cd (4) not."""
    config = SignalConfig(window=2, theta_percent="auto", rare_below=3)
    report = extract_signals(trajectories(), HAND_HISTORY, config, iteration=4)
    assert report.theta_percent == {1: 15.0, 2: 60.0}
    assert report.rare == {1: frozenset({"mv"}), 2: frozenset({"ls > mv"})}
    assert report.pattern_summary() == {
        "1": {"total": 20, "distinct": 3, "rare": 1, "theta_percent": 15.0},
        "2": {"total": 5, "distinct": 2, "rare": 1, "theta_percent": 60.0}}
    rare = [e for e in report.events if e.kind == "rare"]
    assert [(e.task_id, e.trajectory_ids) for e in rare] == [("B", ("B3",))]
    assert rare[0].evidence == {"theta_percent": {"1": 15.0, "2": 60.0}, "frequencies": {"mv": 0.05, "ls > mv": 0.2}}
    # rare_below = 5: cd's 4 occurrences are now rare too
    wider = extract_signals(trajectories(), HAND_HISTORY, SignalConfig(theta_percent="auto", rare_below=5), 4)
    assert wider.rare[1] == frozenset({"mv", "cd"})


def test_extract_theta_above_a_pattern_frequency_flags_it():
    config = SignalConfig(window=2, theta_percent=25, ngram_sizes=(1,))  # now cd (20%) is rare too
    events = extract_signals(trajectories(), HAND_HISTORY, config, 4).events
    rare = {e.task_id: e for e in events if e.kind == "rare"}
    assert {task: event.trajectory_ids for task, event in rare.items()} == {
        "A": ("A3",), "B": ("B3",), "C": ("C3", "C4"), "D": ("D1",),
    }
    assert rare["A"].evidence["frequencies"] == {"cd": 0.2}


def test_extract_bigram_frequency_is_relative_to_bigrams():
    # bigrams: "a > b" x4, "b > a" x1 (N2 = 5): "b > a" is 20% of bigrams. Unigrams: a 5, b 4 (N1 = 9).
    rollouts = [("t1", "T", 1.0, ("a", "b", "a")), ("t2", "T", 1.0, ("a", "b")),
                ("t3", "T", 1.0, ("a", "b")), ("t4", "T", 1.0, ("a", "b"))]
    report = extract_signals(trajectories(rollouts), {}, SignalConfig(theta_percent=30), 0)
    assert report.pattern_counts == {1: {"a": 5, "b": 4}, 2: {"a > b": 4, "b > a": 1}}
    (event,) = report.events
    assert event.kind == "rare" and event.trajectory_ids == ("t1",)
    assert event.evidence["frequencies"] == {"b > a": 0.2}


def test_rare_frequencies_list_each_pattern_once_by_size_then_position():
    # Unigrams: a 9, b 2 (N1 = 11): b is 18.2%. Bigrams: "a > a" 4, "a > b" 1, "b > a" 1 (N2 = 6): 16.7% each.
    rollouts = [("t1", "T", 1.0, ("a", "b")), ("t2", "T", 1.0, ("a", "a")), ("t3", "T", 0.0, ("b", "a", "a")),
                ("u1", "U", 0.0, ("a", "a")), ("u2", "U", 0.0, ("a", "a"))]
    report = extract_signals(trajectories(rollouts), {}, SignalConfig(theta_percent=20), 0)
    assert report.pattern_counts == {1: {"a": 9, "b": 2}, 2: {"a > b": 1, "a > a": 4, "b > a": 1}}
    assert [(e.kind, e.task_id, e.trajectory_ids) for e in report.events] == [
        ("boundary", "T", ("t1", "t2", "t3")), ("rare", "T", ("t1", "t3")),  # U holds nothing rare
    ]
    # t1 holds b and "a > b", t3 holds b and "b > a": b once, unigrams before bigrams, then in order of appearance
    assert list(report.events[1].evidence["frequencies"].items()) == [("b", 2 / 11), ("a > b", 1 / 6), ("b > a", 1 / 6)]


def test_unparsed_calls_have_no_name_and_are_skipped():
    rollouts = [("t1", "T", 1.0, ("cd", "ls", "cd"), 1), ("t2", "T", 1.0, ("cd", "ls", "cd"), 3)]
    report = extract_signals(trajectories(rollouts), {}, SignalConfig(ngram_sizes=(3,)), 0)
    assert report.pattern_counts == {3: {"cd > ls > cd": 2}}  # the garbage call between cd and ls is not in it


def test_forgetting_names_only_the_failed_rollouts():
    rollouts = [("t1", "T", 1.0, ()), ("t2", "T", 0.0, ()), ("t3", "T", 0.25, ()), ("t4", "T", 0.5, ())]
    (forgot, _) = extract_signals(trajectories(rollouts), {"T": [1.0]}, SignalConfig(window=1), 0).events
    assert forgot.kind == "forgetting" and forgot.evidence["now"] == 0.4375  # (1 + 0 + 0.25 + 0.5) / 4
    assert forgot.trajectory_ids == ("t2", "t3") and forgot.evidence["scores"] == [0.0, 0.25]


def test_forgetting_reads_only_the_last_window_of_the_history():
    rollouts = [("t1", "T", 0.0, ()), ("u1", "U", 0.0, ())]
    history = {"T": (1.0, 0.0, 0.0), "U": (0.0, 1.0, 0.0), "V": [1.0]}  # tuples work; V has no rollout: no event
    events = extract_signals(trajectories(rollouts), history, SignalConfig(window=2), 0).events
    assert [(e.kind, e.task_id, e.evidence["history_window"]) for e in events] == [("forgetting", "U", [1.0, 0.0])]
    assert extract_signals(trajectories(rollouts), history, SignalConfig(window=0), 0).events == ()


def test_disabled_signals_are_not_mined():
    config = SignalConfig(window=2, theta_percent=25, ngram_sizes=(1,), enabled=("boundary",))
    report = extract_signals(trajectories(), HAND_HISTORY, config, 4)
    assert {event.kind for event in report.events} == {"boundary"}
    assert report.pattern_counts == {}
    config = SignalConfig(window=2, theta_percent=25, ngram_sizes=(1,), enabled=("forgetting", "rare"))
    assert {event.kind for event in extract_signals(trajectories(), HAND_HISTORY, config, 4).events} == {
        "forgetting", "rare"}


def test_events_round_trip_through_json():
    config = SignalConfig(window=2, theta_percent=25, ngram_sizes=(1, 2))
    events = extract_signals(trajectories(), HAND_HISTORY, config, 4).events
    assert events and all(SignalEvent.from_json(event.to_json()) == event for event in events)


def test_scattered_rollouts_are_grouped_by_task_in_order_of_first_appearance():
    rollouts = [("B1", "B", 1.0, ("ls",)), ("A1", "A", 0.0, ("ls",)), ("B2", "B", 0.0, ("ls",)),
                ("A2", "A", 1.0, ("ls",)), ("B3", "B", 0.0, ("mv",))]
    report = extract_signals(iter(trajectories(rollouts)), {}, SignalConfig(theta_percent=25, ngram_sizes=(1,)), 0)
    assert list(report.success_rates.items()) == [("B", 1 / 3), ("A", 0.5)]
    assert [(e.kind, e.task_id, e.trajectory_ids) for e in report.events] == [
        ("boundary", "B", ("B1", "B2", "B3")), ("rare", "B", ("B3",)), ("boundary", "A", ("A1", "A2")),
    ]
    assert report.events[0].evidence["scores"] == [1.0, 0.0, 0.0]


def test_shuffling_the_rollouts_changes_no_signal():
    shuffled = list(HAND_ROLLOUTS)
    random.Random(7).shuffle(shuffled)
    config = SignalConfig(window=2, theta_percent=25)
    grouped = extract_signals(trajectories(), HAND_HISTORY, config, 4)
    scattered = extract_signals(trajectories(shuffled), HAND_HISTORY, config, 4)
    assert scattered.success_rates == grouped.success_rates
    assert scattered.pattern_counts == grouped.pattern_counts
    assert _event_sets(scattered.events) == _event_sets(grouped.events)


def _event_sets(events):
    """Comparable form: kind, task, trajectories, and for rare events the set of rare patterns they hold."""
    return {
        (event.kind, event.task_id, frozenset(event.trajectory_ids), frozenset(event.evidence["frequencies"]))
        if event.kind == "rare" else (event.kind, event.task_id, frozenset(event.trajectory_ids))
        for event in events
    }


def test_success_rate_does_not_depend_on_rollout_order():
    # sum() gives 0.6000000000000001 for 0.1 + 0.2 + 0.3 but 0.6 for 0.3 + 0.2 + 0.1; the rate must not
    forward = [("t1", "T", 0.1, ()), ("t2", "T", 0.2, ()), ("t3", "T", 0.3, ())]
    rates_forward = extract_signals(trajectories(forward), {}, SignalConfig(), 0).success_rates
    rates_backward = extract_signals(trajectories(forward[::-1]), {}, SignalConfig(), 0).success_rates
    assert rates_forward == rates_backward == {"T": 0.6 / 3}


@pytest.mark.parametrize("bad", [float("nan"), 1.5, -0.1])
def test_scores_outside_unit_interval_are_refused(bad):
    rollouts = [("t1", "T", 1.0, ()), ("t2", "T", bad, ())]
    with pytest.raises(ValueError, match="scores must lie in"):
        extract_signals(trajectories(rollouts), {}, SignalConfig(), 0)


def test_empty_iteration_has_no_signals():
    report = extract_signals([], {}, SignalConfig(), 0)
    assert report.events == () and report.success_rates == {} and report.pattern_counts == {1: {}, 2: {}}


@pytest.mark.parametrize("fields", [
    {"window": -1}, {"threshold": 1.5}, {"theta_percent": 101}, {"theta_percent": -1}, {"ngram_sizes": ()},
    {"ngram_sizes": (0,)}, {"ngram_sizes": (1, 1)}, {"enabled": ("boundary", "novelty")}, {"rare_below": 0},
    {"theta_percent": "sometimes"},
])
def test_signal_config_refuses_bad_values(fields):
    with pytest.raises(ValueError):
        SignalConfig(**fields)


# ---------------------------------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------------------------------

unit = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
rates = st.lists(unit, max_size=12)
thresholds = st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]) | unit


@given(rates, st.randoms(use_true_random=False), thresholds)
def test_boundary_is_symmetric_under_permutation(scores, rng, threshold):
    permuted = list(scores)
    rng.shuffle(permuted)
    assert boundary(permuted, threshold) == boundary(scores, threshold)


@given(rates.filter(bool), thresholds)
def test_boundary_is_max_above_and_min_below(scores, threshold):
    assert boundary(scores, threshold) == (max(scores) >= threshold and min(scores) < threshold)


@given(rates, unit, st.integers(0, 15), thresholds)
def test_forgetting_never_fires_when_now_is_a_success(history, now, window, threshold):
    if now >= threshold:
        assert not forgetting(history, now, window, threshold)


@given(rates, unit, st.integers(0, 15), thresholds)
def test_forgetting_is_monotone_in_the_window(history, now, window, threshold):
    if forgetting(history, now, window, threshold):
        assert forgetting(history, now, window + 1, threshold)


@given(rates, unit, st.integers(0, 15))
def test_forgetting_matches_its_definition(history, now, window):
    recent = history[max(0, len(history) - window):]
    assert forgetting(history, now, window) == (any(s >= 0.5 for s in recent) and now < 0.5)


pattern_counts = st.dictionaries(st.sampled_from("abcdefgh"), st.integers(0, 50), max_size=8)
percents = st.integers(0, 100) | st.floats(0, 100, allow_nan=False)


@given(pattern_counts, percents)
def test_rare_patterns_have_positive_counts(counts, theta):
    assert rare_patterns(counts, theta) <= {p for p, c in counts.items() if c > 0}


@given(pattern_counts, percents, percents)
def test_rare_patterns_grow_with_theta(counts, theta_a, theta_b):
    low, high = sorted((theta_a, theta_b))
    assert rare_patterns(counts, low) <= rare_patterns(counts, high)


@given(pattern_counts, st.integers(0, 100))
def test_rare_patterns_match_exact_integer_arithmetic(counts, theta):
    total = sum(counts.values())
    assert rare_patterns(counts, theta) == {p for p, c in counts.items() if 0 < c and c * 100 < theta * total}


# A whole iteration against the definitions written out independently of coevolve.signals: min/max for boundary,
# plain slicing for H_recent, zip n-grams and integer arithmetic (θ an integer percent) for rare.

iteration_rows = st.lists(
    st.tuples(st.sampled_from("PQRS"), st.sampled_from([0.0, 0.25, 0.5, 1.0]),
              st.lists(st.sampled_from(["cd", "ls", "mv", "rm"]), max_size=4).map(tuple)),
    max_size=24,
)


@settings(max_examples=150, deadline=None)
@given(
    iteration_rows,
    st.dictionaries(st.sampled_from("PQRS"), rates),
    st.integers(0, 4),
    st.sampled_from([0, 5, 12, 20, 50, 100]),
    st.sampled_from([(1,), (2,), (1, 2), (1, 3)]),
)
def test_extract_signals_matches_the_definitions(rows, history, window, theta, sizes):
    rows = [(f"r{index}", task, score, names) for index, (task, score, names) in enumerate(rows)]
    report = extract_signals(trajectories(rows), history, SignalConfig(window=window, theta_percent=theta,
                                                                       ngram_sizes=sizes), 1)
    groups: dict[str, list] = {}
    for row in rows:
        groups.setdefault(row[1], []).append(row)
    grams = {size: {row[0]: [" > ".join(g) for g in zip(*(row[3][i:] for i in range(size)))] for row in rows}
             for size in sizes}
    counts = {size: Counter(p for patterns in grams[size].values() for p in patterns) for size in sizes}
    rare = {size: {p for p, c in counts[size].items() if c * 100 < theta * sum(counts[size].values())}
            for size in sizes}
    frequency = {p: counts[size][p] / sum(counts[size].values()) for size in sizes for p in rare[size]}

    expected = []
    for task, group in groups.items():
        scores = [row[2] for row in group]
        now = math.fsum(scores) / len(scores)
        assert report.success_rates[task] == now
        earlier = history.get(task, [])
        recent = earlier[max(0, len(earlier) - window):] if window else []
        if now < 0.5 and recent and max(recent) >= 0.5:
            expected.append(("forgetting", task, tuple(row[0] for row in group if row[2] < 0.5)))
        if max(scores) >= 0.5 > min(scores):
            expected.append(("boundary", task, tuple(row[0] for row in group)))
        held = {row[0]: [p for size in sizes for p in grams[size][row[0]] if p in rare[size]] for row in group}
        if any(held.values()):
            expected.append(("rare", task, tuple(row_id for row_id, patterns in held.items() if patterns),
                             {p: frequency[p] for patterns in held.values() for p in patterns}))
    assert [(e.kind, e.task_id, e.trajectory_ids) + ((e.evidence["frequencies"],) if e.kind == "rare" else ())
            for e in report.events] == expected
    assert list(report.success_rates) == list(groups)
    assert report.pattern_counts == {size: dict(counts[size]) for size in sizes}
