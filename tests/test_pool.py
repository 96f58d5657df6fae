"""The task pool D_t (coevolve/pool.py): versions, duplicates, history, sampling, and crash safety."""

from __future__ import annotations

import inspect
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coevolve.pool import (
    SCHEMA_VERSION,
    PoolError,
    BatchMix,
    TaskPool,
    dedup_key,
    draw,
    normalise_call,
    normalise_query,
)
from coevolve.records import Provenance, Task

REPO = Path(__file__).resolve().parent.parent


def seed_task(index: int, query: str | None = None, calls: tuple[str, ...] | None = None, **state) -> Task:
    return Task.create(
        "bfcl", f"seed_{index}", [[{"role": "user", "content": query or f"Make folder number {index}."}]],
        state or {"GorillaFileSystem": {"root": index}}, [list(calls or (f"mkdir(dir_name='d{index}')",))],
    )


def synthetic_task(index: int, parent: Task, signal: str | None = "boundary", iteration: int = 0,
                   focus_tool: str | None = None) -> Task:
    provenance = Provenance("synthetic", parent.id, signal, f"episode-{index}", iteration, "accepted", focus_tool)
    return Task.create(
        "bfcl", f"synthetic_{index}", [[{"role": "user", "content": f"List then touch file {index}."}]],
        dict(parent.initial_state), [["ls()", f"touch(file_name='f{index}')"]], provenance=provenance,
    )


@pytest.fixture
def pool(tmp_path):
    with TaskPool(tmp_path / "pool.sqlite") as opened:
        yield opened


# ---------------------------------------------------------------------------------------------------------------
# Duplicates
# ---------------------------------------------------------------------------------------------------------------


def test_normalise_call_ignores_spacing_quotes_and_keyword_order_but_not_values():
    assert normalise_call("cd( folder = 'a b' )") == normalise_call('cd(folder="a b")')
    assert normalise_call("cd(folder='ab')") != normalise_call("cd(folder='a b')")
    assert normalise_call("mv(source='a', destination='b')") == normalise_call("mv(destination='b',source='a')")
    assert normalise_call("mv(source='a', destination='b')") != normalise_call("mv(source='b', destination='a')")
    escaped = 'echo(content="it\'s  \\" x", file_name = "f")'  # a quote inside the literal does not close it
    assert normalise_call(escaped) == normalise_call("echo(file_name='f', content='it\\'s  \" x')")
    assert normalise_call("sort(\n  file_name='a.txt'\t)") == normalise_call("sort(file_name='a.txt')")
    assert normalise_call("not  a   call(") == "not a call("  # unparseable: whitespace collapsed only


def test_normalise_query_lowercases_and_collapses_whitespace():
    assert normalise_query("  Move  the FILE\n\tto ./tmp  ") == "move the file to ./tmp"


def test_dedup_key_ignores_case_and_whitespace_but_not_the_initial_state():
    base = seed_task(1, "Make folder  X.", ("mkdir(dir_name='X')",), GorillaFileSystem={"root": 0})
    same = seed_task(2, "make folder x.", ("mkdir( dir_name = 'X' )",), GorillaFileSystem={"root": 0})
    assert dedup_key(base) == dedup_key(same)
    other_state = seed_task(5, "Make folder X.", ("mkdir(dir_name='X')",), GorillaFileSystem={"root": 1})
    assert dedup_key(base) != dedup_key(other_state)
    assert dedup_key(base) != dedup_key(seed_task(3, "Make folder X.", ("mkdir(dir_name='Y')",)))
    assert dedup_key(base) != dedup_key(seed_task(4, "Make folder Y.", ("mkdir(dir_name='X')",)))


def test_duplicates_are_refused_with_the_task_they_duplicate(pool):
    original = seed_task(1, "Make folder X.", ("mkdir(dir_name='X')",), GorillaFileSystem={"root": 1})
    assert pool.add_tasks([original], 0).admitted == (original,)
    copy = seed_task(2, "  make FOLDER x. ", ("mkdir(dir_name = 'X')",), GorillaFileSystem={"root": 1})
    result = pool.add_tasks([copy, original], 1)
    assert result.admitted == ()
    assert [refusal.duplicate_of for refusal in result.refused] == [original.id, original.id]
    assert "same normalised query and solution" in result.refused[0].reason
    assert [task.id for task in pool.tasks_at(1)] == [original.id]


def test_duplicates_within_one_batch_are_refused(pool):
    first, second = seed_task(1, "Do it."), seed_task(2, "do   it.", ("mkdir(dir_name='d1')",), GorillaFileSystem={"root": 1})
    result = pool.add_tasks([first, second], 0)
    assert result.admitted == (first,)
    assert result.refused[0].duplicate_of == first.id and "same batch" in result.refused[0].reason


def test_a_forged_id_or_unknown_provenance_is_refused_and_nothing_is_written(pool):
    good = seed_task(1)
    forged = Task(**{**good.__dict__, "id": "0" * 16, "name": "forged"})
    with pytest.raises(ValueError, match="does not match its content"):
        pool.add_tasks([seed_task(2), forged], 0)
    with pytest.raises(ValueError, match="unknown signal"):
        pool.add_tasks([replace(good, provenance=Provenance("synthetic", None, "novelty"))], 0)
    assert len(pool) == 0 and pool.iterations() == []


# ---------------------------------------------------------------------------------------------------------------
# Versions of D_t
# ---------------------------------------------------------------------------------------------------------------


def test_rebuilding_an_earlier_iteration_returns_exactly_its_tasks(tmp_path):
    seeds = [seed_task(i) for i in range(3)]
    first_wave = [synthetic_task(i, seeds[i % 3], iteration=0) for i in range(2)]
    second_wave = [synthetic_task(10 + i, seeds[0], "forgetting", iteration=1) for i in range(2)]
    with TaskPool(tmp_path / "pool.sqlite") as pool:
        pool.add_tasks(seeds, 0)
        pool.add_tasks(first_wave, 1)
        pool.start_iteration(2)
        pool.add_tasks(second_wave, 2)
        pool.start_iteration(3)  # nothing new: D_3 == D_2
    with TaskPool(tmp_path / "pool.sqlite", create=False) as pool:  # from disk, in a fresh connection
        assert pool.iterations() == [0, 1, 2, 3]
        assert pool.tasks_at(0) == seeds
        assert pool.tasks_at(1) == seeds + first_wave
        assert pool.tasks_at(2) == pool.tasks_at(3) == seeds + first_wave + second_wave
        assert pool.tasks_at() == pool.tasks_at(3)
        assert pool.tasks_at(2, source="synthetic") == first_wave + second_wave
        assert [entry.added_iteration for entry in pool.entries_at(2)] == [0, 0, 0, 1, 1, 2, 2]
        assert pool.get(first_wave[0].id) == first_wave[0]
        assert pool.get("missing") is None


def test_an_earlier_iteration_is_frozen_once_a_later_one_exists(pool):
    pool.add_tasks([seed_task(0)], 0)
    pool.start_iteration(1)
    pool.start_iteration(1)  # already the latest: no-op
    with pytest.raises(ValueError, match="frozen"):
        pool.add_tasks([seed_task(1)], 0)
    with pytest.raises(ValueError, match="frozen"):
        pool.start_iteration(0)
    assert [task.name for task in pool.tasks_at(0)] == ["seed_0"]


def test_unknown_iteration_is_a_key_error(pool):
    pool.add_tasks([seed_task(0)], 0)
    with pytest.raises(KeyError, match="no iteration 5"):
        pool.tasks_at(5)
    with pytest.raises(KeyError):
        pool.sample(5, 1, 0)


def test_empty_pool_has_no_iterations(pool):
    assert pool.iterations() == [] and pool.latest_iteration() is None and pool.tasks_at() == []


# ---------------------------------------------------------------------------------------------------------------
# Success history
# ---------------------------------------------------------------------------------------------------------------


def test_history_is_oldest_first_and_windowed(pool):
    a, b = seed_task(0), seed_task(1)
    pool.add_tasks([a, b], 0)
    pool.record_success_rates(2, {a.id: 0.25})
    pool.record_success_rates(0, {a.id: 1.0, b.id: 0.0})
    pool.record_success_rates(1, {a.id: 0.5})
    assert pool.history(a.id) == [1.0, 0.5, 0.25]
    assert pool.histories() == {a.id: [1.0, 0.5, 0.25], b.id: [0.0]}
    assert pool.histories(before=2, window=1) == {a.id: [0.5], b.id: [0.0]}
    assert pool.histories([b.id]) == {b.id: [0.0]}
    assert pool.histories(window=0) == {}
    pool.record_success_rates(1, {a.id: 0.75})  # rerunning an iteration overwrites it
    assert pool.history(a.id) == [1.0, 0.75, 0.25]


def test_history_write_is_all_or_nothing(pool):
    known = seed_task(0)
    pool.add_tasks([known], 0)
    with pytest.raises(KeyError, match="not in the pool"):
        pool.record_success_rates(0, {known.id: 0.5, "unknown-task": 0.5})
    assert pool.history(known.id) == []  # the known task's row was rolled back with the rest
    for bad in (float("nan"), 1.5, -0.5):
        with pytest.raises(ValueError):
            pool.record_success_rates(0, {known.id: bad})


# ---------------------------------------------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture
def mixed_pool(pool):
    seeds = [seed_task(i) for i in range(12)]
    pool.add_tasks(seeds, 0)
    synthetic = [synthetic_task(i, seeds[0], "boundary") for i in range(6)]
    synthetic += [synthetic_task(100 + i, seeds[1 + i], "rare") for i in range(4)]
    synthetic += [synthetic_task(200, seeds[5], None)]  # random exploration
    pool.add_tasks(synthetic, 1)
    return pool


def test_sampling_is_deterministic_for_a_seed(mixed_pool):
    draws = [[t.id for t in mixed_pool.sample(1, 8, rng_seed=seed)] for seed in (3, 3, 4)]
    assert draws[0] == draws[1]
    assert draws[0] != draws[2]
    assert len(set(draws[0])) == 8


def test_sampling_honours_the_seed_synthetic_mix(mixed_pool):
    tasks = mixed_pool.sample(1, 8, 0, BatchMix(synthetic_fraction=0.25))
    assert [t.provenance.source for t in tasks].count("synthetic") == 2
    assert len(tasks) == 8
    only_seed = mixed_pool.sample(1, 5, 0, BatchMix(synthetic_fraction=0.0))
    assert {t.provenance.source for t in only_seed} == {"seed"}


def test_a_short_source_is_filled_from_the_other(mixed_pool):
    tasks = mixed_pool.sample(1, 20, 0, BatchMix(synthetic_fraction=1.0))  # 11 synthetic exist
    assert [t.provenance.source for t in tasks].count("synthetic") == 11 and len(tasks) == 20


def test_caps_per_parent_and_per_signal(mixed_pool):
    config = BatchMix(synthetic_fraction=1.0, max_per_parent=2)
    for seed in range(5):
        tasks = mixed_pool.sample(1, 10, seed, config)
        assert sum(t.provenance.parent_id == mixed_pool.tasks_at(0)[0].id for t in tasks) <= 2
        assert len(tasks) == 10
    config = BatchMix(synthetic_fraction=1.0, max_per_signal=1)
    tasks = mixed_pool.sample(1, 6, 0, config)
    signals = [t.provenance.signal or "random" for t in tasks if t.provenance.source == "synthetic"]
    assert sorted(signals) == ["boundary", "random", "rare"]  # one of each kind, seeds fill the rest
    assert len(tasks) == 6


def test_weights_zero_excludes_and_large_weight_dominates(mixed_pool):
    all_ids = [t.id for t in mixed_pool.tasks_at(1)]
    favourite = all_ids[7]
    excluded = {task_id: 0.0 for task_id in all_ids[:5]}
    for seed in range(10):
        drawn = [t.id for t in mixed_pool.sample(1, 3, seed, weights={**excluded, favourite: 1e9})]
        assert drawn[0] == favourite
        assert not set(drawn) & set(excluded)
    never_random = BatchMix(signal_weights={"random": 0.0})
    drawn = mixed_pool.sample(1, 23, 0, never_random)
    assert None not in {t.provenance.signal for t in drawn if t.provenance.source == "synthetic"}


def test_unexplored_weight_stands_for_the_signal_weight_of_tasks_made_for_an_unexplored_tool(pool):
    seeds = [seed_task(i) for i in range(4)]
    pool.add_tasks(seeds, 0)
    rare = [synthetic_task(i, seeds[0], "rare") for i in range(6)]
    unexplored = [synthetic_task(50 + i, seeds[1], "rare", focus_tool="cat") for i in range(3)]
    pool.add_tasks(rare + unexplored, 1)
    focus_ids = {t.id for t in unexplored}
    assert {t.provenance.focus_tool for t in pool.tasks_at(1) if t.id in focus_ids} == {"cat"}  # read back
    only_synthetic = {"synthetic_fraction": 1.0}
    for seed in range(8):
        first = pool.sample(1, 3, seed, BatchMix(**only_synthetic, signal_weights={"unexplored": 1e9}))
        assert {t.id for t in first} == focus_ids  # they come first
        never = pool.sample(1, 9, seed, BatchMix(**only_synthetic, signal_weights={"unexplored": 0.0}))
        assert not focus_ids & {t.id for t in never}
        assert [t.provenance.source for t in never].count("seed") == 3  # 6 rare tasks, then the seeds fill in
        # Without an `unexplored` weight a focus task weighs as its signal: rare 0 excludes both kinds.
        no_rare = pool.sample(1, 9, seed, BatchMix(**only_synthetic, signal_weights={"rare": 0.0}))
        assert {t.provenance.source for t in no_rare} == {"seed"}
        # With one, the unexplored weight replaces the signal's: rare 0 leaves the focus tasks drawable.
        mixed = pool.sample(1, 3, seed, BatchMix(**only_synthetic, signal_weights={"rare": 0.0, "unexplored": 1.0}))
        assert {t.id for t in mixed} == focus_ids


def test_sample_larger_than_pool_returns_all_of_it(mixed_pool):
    assert sorted(t.id for t in mixed_pool.sample(1, 100, 0)) == sorted(t.id for t in mixed_pool.tasks_at(1))


@pytest.mark.parametrize("fields", [
    {"synthetic_fraction": 1.5}, {"signal_weights": {"novelty": 1.0}}, {"signal_weights": {"rare": -1.0}},
    {"max_per_parent": -1}, {"max_per_signal": 1.5},
])
def test_sampling_config_refuses_bad_values(fields):
    with pytest.raises(ValueError):
        BatchMix(**fields)


rows_strategy = st.lists(
    st.tuples(st.sampled_from(["seed", "synthetic"]), st.sampled_from([None, "p1", "p2"]),
              st.sampled_from([None, "forgetting", "boundary", "rare"])),
    max_size=30,
)


@settings(max_examples=80, deadline=None)
@given(rows_strategy, st.integers(0, 40), st.integers(0, 2**32), st.sampled_from([None, 0.0, 0.5, 1.0]),
       st.sampled_from([None, 0, 1, 3]), st.sampled_from([None, 1, 2]))
def test_draw_invariants(rows, count, seed, fraction, per_parent, per_signal):
    rows = [(f"id{index:03d}", source, parent if source == "synthetic" else None,
             signal if source == "synthetic" else None, "cat" if source == "synthetic" and index % 3 == 0 else None)
            for index, (source, parent, signal) in enumerate(rows)]
    config = BatchMix(synthetic_fraction=fraction, max_per_parent=per_parent, max_per_signal=per_signal)
    chosen = draw(rows, count, random.Random(seed), config, {})
    assert chosen == draw(rows, count, random.Random(seed), config, {})  # deterministic
    assert len(chosen) == len(set(chosen)) <= count  # distinct, never too many
    by_id = {row[0]: row for row in rows}
    synthetic = [by_id[task_id] for task_id in chosen if by_id[task_id][1] == "synthetic"]
    if per_parent is not None:
        parents = [row[2] for row in synthetic if row[2] is not None]
        assert all(parents.count(parent) <= per_parent for parent in parents)
    if per_signal is not None:
        kinds = [row[3] or "random" for row in synthetic]
        assert all(kinds.count(kind) <= per_signal for kind in kinds)
    if per_parent is None and per_signal is None:
        assert len(chosen) == min(count, len(rows))  # without caps the batch is full whenever it can be


# ---------------------------------------------------------------------------------------------------------------
# The file: schema, WAL, and a writer killed with SIGKILL
# ---------------------------------------------------------------------------------------------------------------


def test_pool_file_uses_wal_and_records_its_schema_version(pool):
    assert pool._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert pool._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_foreign_files_are_refused(tmp_path):
    with pytest.raises(PoolError, match="no task pool"):
        TaskPool(tmp_path / "absent.sqlite", create=False)
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE notes (x)")
    with pytest.raises(PoolError, match="not a coevolve task pool"):
        TaskPool(other)
    newer = tmp_path / "newer.sqlite"
    TaskPool(newer).close()
    with sqlite3.connect(newer) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(PoolError, match="schema version"):
        TaskPool(newer)


def big_task(index: int) -> Task:
    """A task of ~16 KB, so that one transaction spans several database pages."""
    from coevolve.records import Task

    return Task.create(
        "bfcl", f"killed_{index}", [[{"role": "user", "content": f"Write report {index}."}]],
        {"GorillaFileSystem": {"root": {"report.txt": ("line %d\n" % index) * 2000}}},
        [[f"echo(content='report {index}', file_name='r{index}.txt')"]],
    )


WRITER = """from __future__ import annotations
import sys
from coevolve.pool import TaskPool
{factory}
path, start, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
pool = TaskPool(path)
index = start
while True:
    tasks = [big_task(i) for i in range(index, index + batch)]
    pool.add_tasks(tasks, 0)
    print(index + batch, flush=True)  # acknowledged: every task below this index is committed
    index += batch
"""


def run_and_kill_writer(path: Path, start: int, batch: int, acks_before_kill: int) -> int:
    """Start a writer, SIGKILL it after `acks_before_kill` commits plus a random moment; return the last ack."""
    script = WRITER.format(factory=textwrap.dedent(inspect.getsource(big_task)))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", script, str(path), str(start), str(batch)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    acknowledged = start
    try:
        deadline = time.monotonic() + 30
        while acknowledged < start + acks_before_kill * batch:
            line = child.stdout.readline()
            assert line, f"writer died early: {child.stderr.read()}"
            acknowledged = int(line)
            assert time.monotonic() < deadline, "writer too slow"
        time.sleep(random.uniform(0.0, 0.05))  # land somewhere inside a later transaction
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL
    for line in child.stdout.read().splitlines():  # acks written before the kill but not read yet
        acknowledged = int(line)
    return acknowledged


def test_sigkill_during_writes_leaves_every_committed_task_and_no_partial_batch(tmp_path):
    path, batch = tmp_path / "pool.sqlite", 3
    acknowledged = 0
    for round_ in range(3):  # each round reopens a file whose writer was killed (hot WAL recovery)
        acknowledged = run_and_kill_writer(path, acknowledged, batch, acks_before_kill=10 + 5 * round_)
        with TaskPool(path, create=False) as pool:
            assert pool._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"  # SQLite's own verdict
            stored = pool._db.execute("SELECT id, payload FROM tasks ORDER BY seq").fetchall()
            members = {row[0] for row in pool._db.execute("SELECT task_id FROM membership WHERE iteration = 0")}
            # every acknowledged task is there, byte for byte, and round-trips
            for index in range(acknowledged):
                expected = big_task(index)
                assert stored[index] == (expected.id, expected.to_json())
                assert Task.from_json(stored[index][1]) == expected
            # at most the one batch committed between its COMMIT and its ack; never a part of a batch
            assert len(stored) in (acknowledged, acknowledged + batch)
            assert {task_id for task_id, _ in stored} == members
            acknowledged = len(stored)


def test_all_bfcl_seed_tasks_are_admitted_as_distinct(pool):
    """Long-context entries repeat base entries' queries and solutions over a larger state: not duplicates."""
    from coevolve.envs.bfcl import CATEGORIES, load_tasks

    seeds = [task for category in CATEGORIES for task in load_tasks(category)]
    result = pool.add_tasks(seeds, 0)
    assert len(result.admitted) == 800 and result.refused == ()


def test_recently_solved_draws_only_tasks_with_a_success_in_their_history():
    import random

    from coevolve.pool import recently_solved

    histories = {"a": [0.0, 0.75], "b": [0.25], "c": [0.5, 0.0], "d": []}
    assert sorted(recently_solved(histories, 0.5, 10, random.Random(0))) == ["a", "c"]  # c counts: 0.5 >= τ
    assert len(recently_solved(histories, 0.5, 1, random.Random(0))) == 1
    assert recently_solved(histories, 0.5, 1, random.Random(3)) == recently_solved(dict(reversed(histories.items())),
                                                                                  0.5, 1, random.Random(3))
    assert recently_solved(histories, 0.9, 5, random.Random(0)) == [] and recently_solved(histories, 0.5, 0,
                                                                                          random.Random(0)) == []
