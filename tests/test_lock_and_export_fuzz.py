"""Fuzzed: the run lock under kill -9 at random moments (a holder killed while it takes, writes or releases the
lock never leaves a lock the next run cannot take, nor a line it cannot read), and the pool's export/import round
trip (any task a pool holds comes back from `coevolve pool --export` as the same record)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coevolve.jsonl import jsonl_rows
from coevolve.pool import TaskPool
from coevolve.pool_cli import run_pool
from coevolve.records import Provenance, Task, canonical_json
from coevolve.run_lock import LOCK_FILE, RunDirectoryBusy, RunLock

REPO = Path(__file__).resolve().parent.parent
CHURN = ("import sys\nfrom coevolve.run_lock import RunLock\nprint('go', flush=True)\n"
         "while True:\n    with RunLock(sys.argv[1]):\n        pass\n")


def test_a_lock_holder_killed_at_random_moments_never_leaves_a_lock_the_next_run_cannot_take(tmp_path):
    rng = random.Random(7)
    for attempt in range(10):
        churn = subprocess.Popen([sys.executable, "-c", CHURN, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE,
                                 text=True)
        assert churn.stdout.readline().strip() == "go"
        time.sleep(rng.uniform(0.0, 0.15))  # somewhere among open, flock, truncate, write, unlock
        os.kill(churn.pid, signal.SIGKILL)
        churn.wait(timeout=30)
        with RunLock(tmp_path) as lock:  # taken at once, whatever the dead holder left
            assert lock.previous is None or isinstance(lock.previous, dict)
            assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
            second = subprocess.run([sys.executable, "-c", "import sys\nfrom coevolve.run_lock import RunLock\n"
                                     "RunLock(sys.argv[1]).__enter__()", str(tmp_path)], cwd=REPO,
                                    capture_output=True, text=True, timeout=60)
            assert second.returncode != 0 and "is being written by another run" in second.stderr
            assert f"pid {os.getpid()}" in second.stderr


def test_a_torn_holder_line_is_read_as_no_holder(tmp_path):
    (tmp_path / LOCK_FILE).write_text('{"pid": 12')  # killed mid-write
    with RunLock(tmp_path) as lock:
        assert lock.previous is None


TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
VALUES = st.one_of(st.integers(-10**12, 10**12), st.floats(allow_nan=False, allow_infinity=False), TEXT,
                   st.booleans(), st.none())
TASKS = st.builds(
    lambda name, turns, state, arguments, signal: Task.create(
        "bfcl-lite", name, [[{"role": "user", "content": text}] for text in turns], state,
        [[f"ls(a={value!r})" for value in arguments]], {"split": "train"},
        Provenance("synthetic", None, signal, None, 1, "accepted") if signal else Provenance()),
    TEXT, st.lists(TEXT, min_size=1, max_size=3), st.dictionaries(TEXT, VALUES, max_size=4),
    st.lists(TEXT, min_size=1, max_size=2), st.one_of(st.none(), st.sampled_from(["boundary", "rare", "forgetting"])))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tasks=st.lists(TASKS, min_size=1, max_size=6, unique_by=lambda task: task.id))
def test_a_pools_tasks_come_back_from_the_export_as_the_same_records(tmp_path, tasks):
    import argparse

    run_dir = tmp_path / f"run-{os.urandom(4).hex()}"
    run_dir.mkdir()
    with TaskPool(run_dir / "pool.sqlite") as pool:
        pool.add_tasks(tasks, 0)
    exported = tmp_path / f"{run_dir.name}.jsonl"
    arguments = argparse.Namespace(directory=str(run_dir), json=False, iteration=None, source=None,
                                   export=str(exported))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("coevolve.pool_cli._print_table", lambda iteration, rows: None)
        assert run_pool(arguments) == 0
    back = [Task.from_dict(row) for _, row in jsonl_rows(exported)]
    assert sorted(canonical_json(task.to_dict()) for task in back) == sorted(canonical_json(task.to_dict())
                                                                           for task in tasks)
    assert all(task.id == Task.create(task.env, task.name, task.turns, task.initial_state, task.ground_truth,
                                      task.meta, task.provenance).id for task in back)
