"""The history sampler (`loop.sampler: history`, `coevolve.curriculum`): each task's draw weight from its own tries,
checked against weights worked out by hand, the pool's record of tries, what a draw held, and the config's
refusals."""

from __future__ import annotations

import random

import pytest

from coevolve.config import ConfigError, load_config
from coevolve.curriculum import (CurriculumConfig, draw_summary, failed_in_a_row, history_weights, pool_draw_summary,
                                 pool_weights, standing, task_weight)
from coevolve.pool import BatchMix, TaskPool, draw
from coevolve.records import Provenance, Task


def test_standing_by_hand():
    assert standing([], 3) == "never_tried"
    assert standing([1.0, 1.0], 3) == "mastered"
    assert standing([0.0, 0.0, 0.0], 3) == "failing"
    assert standing([1.0, 0.0], 3) == "learnable"  # p = 1/2
    assert standing([0.0, 1.0, 1.0, 1.0], 3) == "mastered"  # the window keeps the last three
    assert standing([1.0, 0.0, 0.0, 0.0], 3) == "failing"
    assert standing([0.125], 3) == "learnable"
    assert failed_in_a_row([0.5, 0.0, 0.0]) == 2 and failed_in_a_row([0.0, 0.25]) == 0 and failed_in_a_row([]) == 0


def test_weights_by_hand():
    # Defaults: never_tried 8, learnable 2, mastered 0.2, failing 0.5, floor 0.05, window 3.
    assert task_weight((), admitted=2, iteration=3, teachable=False) == 8.0  # admitted after iteration 2: age 1
    assert task_weight((), admitted=2, iteration=4, teachable=False) == 4.5  # 1 + 7 / 2
    assert task_weight((), admitted=2, iteration=5, teachable=False) == 2.75  # 1 + 7 / 4
    assert task_weight((), admitted=0, iteration=1, teachable=False) == 8.0  # every seed task at t = 1: uniform
    assert task_weight([(1, 0.5)], 0, 2, False) == 2.0  # 2 * 4 * 1/2 * 1/2
    assert task_weight([(1, 0.25)], 0, 2, False) == 1.5  # 2 * 4 * 1/4 * 3/4
    assert task_weight([(1, 0.125)], 0, 2, False) == 0.875  # 2 * 4 * 1/8 * 7/8
    assert task_weight([(1, 0.0), (2, 1.0)], 0, 3, False) == 2.0  # p = 1/2 over the window
    assert task_weight([(1, 1.0)], 0, 2, False) == pytest.approx(0.2)  # just solved: one iteration since
    assert task_weight([(1, 1.0)], 0, 4, False) == pytest.approx(0.6)  # three iterations since: 0.2 * 3
    assert task_weight([(1, 1.0)], 0, 9, False) == 1.0  # retested now and then: back to 1
    failing = [(1, 0.0), (2, 0.0), (3, 0.0)]
    assert task_weight(failing, 0, 4, False) == 0.125  # 0.5 ** 3
    assert task_weight(failing, 0, 4, True) == 1.0  # guidance can teach it
    assert task_weight([(i, 0.0) for i in range(1, 6)], 0, 6, False) == 0.05  # 0.5 ** 5 = 0.03125 -> the floor
    assert task_weight([(1, 0.5), (2, 0.0), (3, 0.0), (4, 0.0)], 0, 5, False) == 0.125  # three failed in a row
    tuned = CurriculumConfig(never_tried=3.0, learnable=1.0)
    assert task_weight((), 0, 1, False, tuned) == 3.0 and task_weight([(1, 0.5)], 0, 2, False, tuned) == 1.0
    assert history_weights({"b": [(1, 1.0)]}, {"a": 1, "b": 0}, 2, False) == {"a": 8.0, "b": pytest.approx(0.2)}


def test_curriculum_config_refuses_what_it_cannot_use():
    assert CurriculumConfig.of({"window": 3.0}).window == 3  # YAML may give 3.0
    for bad in ({"bogus": 1.0}, {"failing": 1.5}, {"mastered": 0.0}, {"window": 0}, {"floor": float("nan")}):
        with pytest.raises(ValueError):
            CurriculumConfig.of(bad)


def test_the_config_refuses_history_with_recur_fraction_and_weights_without_history():
    assert load_config(None, ["loop.sampler=history"]).loop.sampler == "history"
    assert load_config(None, ["loop.sampler=history", "loop.curriculum={never_tried: 4}"]).loop.curriculum == {
        "never_tried": 4.0}
    with pytest.raises(ConfigError, match="recur_fraction"):
        load_config(None, ["loop.sampler=history", "loop.recur_fraction=0.25"])
    with pytest.raises(ConfigError, match="sampler: history"):
        load_config(None, ["loop.curriculum={learnable: 3}"])
    with pytest.raises(ConfigError, match="bogus"):
        load_config(None, ["loop.sampler=history", "loop.curriculum={bogus: 3}"])


def test_draw_summary_by_hand():
    tries = {"a": [(1, 1.0)], "b": [(1, 0.5)], "c": [(1, 0.0)]}
    admitted = {"a": 0, "b": 0, "c": 0, "d": 0, "s1": 1, "s2": 2, "s3": 2}
    summary = draw_summary(["a", "b", "c", "d", "s1", "s2"], tries, admitted, {"s1", "s2", "s3"}, 3,
                           ["s2", "s2", "s2", "a", "s1"], 3)
    assert summary.to_dict() == {"tasks": 6, "never_tried": 3, "learnable": 1, "mastered": 1, "failing": 1,
                                 "synthetic": 2, "admitted_last": 1, "admitted_last_rollouts": 3,
                                 "admitted_last_pool": 2}


def seed_task(index: int, source: str = "seed", iteration: int = 0) -> Task:
    task = Task.create("bfcl-lite", f"t{index}", [[{"role": "user", "content": f"list folder {index}"}]],
                       {"root": {}}, [[f"ls(a={index})"]], {})
    if source == "seed":
        return task
    return Task(task.id, task.env, task.name, task.turns, task.initial_state, task.ground_truth, task.meta,
                Provenance("synthetic", parent_id=None, signal="boundary", iteration=iteration))


def test_the_pool_keeps_each_tasks_tries_and_admission(tmp_path):
    seeds = [seed_task(i) for i in range(3)]
    fresh = seed_task(9, "synthetic", 1)
    with TaskPool(tmp_path / "pool.sqlite") as pool:
        pool.add_tasks(seeds, 0)
        pool.record_success_rates(1, {seeds[0].id: 1.0, seeds[1].id: 0.25})
        pool.start_iteration(1)
        pool.add_tasks([fresh], 1)
        pool.record_success_rates(2, {seeds[0].id: 0.5})
        assert pool.tries(before=3) == {seeds[0].id: [(1, 1.0), (2, 0.5)], seeds[1].id: [(1, 0.25)]}
        assert pool.tries(before=2) == {seeds[0].id: [(1, 1.0)], seeds[1].id: [(1, 0.25)]}
        assert pool.admissions(1) == {seeds[0].id: 0, seeds[1].id: 0, seeds[2].id: 0, fresh.id: 1}
        assert pool.admissions(1, source="synthetic") == {fresh.id: 1}
        weights = pool_weights(pool, 2, CurriculumConfig(), teachable=False)
        # seed 0: mastered one iteration ago -> 0.2; seed 1: p = 1/4 -> 1.5; seed 2 never tried, admitted at 0,
        # age 2 -> 4.5; the fresh task admitted after iteration 1, age 1 -> 8.
        assert weights == {seeds[0].id: pytest.approx(0.2), seeds[1].id: 1.5, seeds[2].id: 4.5, fresh.id: 8.0}
        summary = pool_draw_summary(pool, 2, [fresh.id, seeds[0].id], [fresh.id] * 4 + [seeds[0].id] * 4, 3)
        assert (summary.admitted_last, summary.admitted_last_rollouts, summary.synthetic, summary.mastered) == (
            1, 4, 1, 1)


def test_the_history_draw_gives_a_new_task_its_rollouts_where_the_uniform_draw_does_not():
    # 40 mastered seed tasks and one task just admitted; 4 slots. Uniformly the new task is drawn with chance
    # 4/41; weighed by history (0.2 each against 8) about 1 - (1 - 8/16)(...) ~ 0.6 or more. Fixed seeds: no flake.
    rows = [(f"s{i:02d}", "seed", None, None, None) for i in range(40)] + [("new", "synthetic", "s00", "rare", None)]
    tries = {f"s{i:02d}": [(1, 1.0)] for i in range(40)}
    admitted = {**{f"s{i:02d}": 0 for i in range(40)}, "new": 1}
    weights = history_weights(tries, admitted, 2, False)
    history = sum("new" in draw(rows, 4, random.Random(seed), BatchMix(), weights) for seed in range(200))
    uniform = sum("new" in draw(rows, 4, random.Random(seed), BatchMix(), {}) for seed in range(200))
    assert uniform < 40 < 150 < history  # ~10% of the draws against most of them
