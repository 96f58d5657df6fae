"""Your tools cannot end, hang or kill the run (`coevolve.envs.python_worker`): a tool that exits, fakes Ctrl-C,
sleeps or loops is an observation with its reason; a worker that dies or hangs is restarted and the episodes it held
fail as the env's doing."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from coevolve.envs.python_env import PythonEnv

REPO = Path(__file__).resolve().parent.parent
HOSTILE = textwrap.dedent('''
    import os, sys, time


    class Hostile:
        """Tools that misbehave."""

        def __init__(self):
            self.calls = 0

        def fine(self, x: int) -> int:
            """Count a call and return x."""
            self.calls += 1
            return x

        def leave(self, code: int) -> str:
            """Exit with a code."""
            sys.exit(code)

        def vanish(self) -> str:
            """End the process at once."""
            os._exit(0)

        def interrupt(self) -> str:
            """Pretend the user pressed Ctrl-C."""
            raise KeyboardInterrupt

        def nap(self, seconds: float) -> str:
            """Sleep, then answer."""
            time.sleep(seconds)
            return "rested"

        def spin(self) -> str:
            """Loop forever."""
            while True:
                pass
''')


@pytest.fixture()
def hostile(tmp_path, monkeypatch):
    (tmp_path / "hostile_tools.py").write_text(HOSTILE)
    rows = [{"id": "ok", "query": "Count one.", "ground_truth": [["fine(x=1)"]]},
            {"id": "exits", "query": "Leave.", "ground_truth": [["leave(code=3)"]]},
            {"id": "vanishes", "query": "Vanish.", "ground_truth": [["vanish()"]]}]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_exits_and_fake_interrupts_are_observations_and_the_instance_lives_on(hostile):
    env = PythonEnv("hostile_tools:Hostile", tasks="tasks.jsonl", call_timeout_s=5.0)
    assert env.worker is not None
    task = env.tasks()[0]
    episode = env.reset(task)
    steps = episode.act(["leave(code=0)", "leave(code=3)", "interrupt()", "fine(x=2)"])
    assert [s.error.split(" raised ")[1].split(":")[0] for s in steps[:3]] == ["SystemExit"] * 2 + ["KeyboardInterrupt"]
    assert steps[3].error is None and steps[3].observation == "2" and episode.state() == {"calls": 1}
    episode.act(["fine(x=1)"])
    episode.end_turn()
    assert episode.score().value == 0.0  # two calls of fine where the truth makes one: state differs, not lost
    assert all(check.kind != "process" for check in episode.score().checks)


def test_a_call_past_its_deadline_or_a_dead_worker_costs_the_episode_not_the_run(hostile):
    env = PythonEnv("hostile_tools:Hostile", tasks="tasks.jsonl", call_timeout_s=1.0)
    task = env.tasks()[0]
    for hang in ("nap(seconds=60)", "spin()", "vanish()"):
        episode = env.reset(task)
        started = time.perf_counter()
        [step] = episode.act([hang])
        assert time.perf_counter() - started < 30
        assert ("no answer within 1 s" in step.error) if hang != "vanish()" else ("exit code 0" in step.error)
        [after] = episode.act(["fine(x=1)"])
        assert after.error.startswith("this episode's instance is gone")  # it went with the worker
        episode.end_turn()
        score = episode.score()
        assert score.value == 0.0 and any(c.kind == "process" and not c.passed for c in score.checks)
        fresh = env.reset(task)  # a new worker: the next episode is whole
        fresh.act(["fine(x=1)"])
        fresh.end_turn()
        assert fresh.score().value == 1.0
    assert env.reset(task).act(["nap(seconds=0.1)"])[0].observation == "rested"  # under the deadline: fine


def test_env_check_and_eval_say_why_in_one_line_and_never_exit_silently(hostile):
    check = subprocess.run([sys.executable, "-m", "coevolve.cli", "env", "check", "hostile_tools:Hostile",
                            "--tasks", "tasks.jsonl"], cwd=hostile, capture_output=True, text=True, timeout=300)
    assert check.returncode != 0 and "Traceback" not in check.stderr + check.stdout
    said = check.stdout + check.stderr
    assert "leave(code=3)" in said and "SystemExit" in said and "vanish()" in said and "exit code 0" in said
    evaluated = subprocess.run([sys.executable, "-m", "coevolve.cli", "eval", "--env", "python:hostile_tools:Hostile",
                                "--tasks", "tasks.jsonl", "--policy", "oracle", "--json"], cwd=hostile,
                               capture_output=True, text=True, timeout=300)
    assert evaluated.returncode == 0 and "Traceback" not in evaluated.stderr
    report = json.loads(evaluated.stdout)
    # `exits`: the truth's own SystemExit is an observation the oracle reproduces; `vanishes` ends the worker, an
    # environment failure the episode cannot pass.
    assert report["n"] == 3 and report["per_task"] == {"ok": 1, "exits": 1, "vanishes": 0}
    assert "exit code 0" in " ".join(report["failures"]["vanishes"])


def test_a_class_a_worker_cannot_import_is_refused_up_front_unless_isolate_is_off(tmp_path):
    """It ran in-process without a deadline, with only a warning: a tool that exits would end the run."""
    import json

    from coevolve.envs.python_env import PythonEnv
    from coevolve.envs.user_env import EnvDefinitionError

    class Local:
        """Defined inside a function: no name a fresh interpreter can import."""

        def add(self, amount: int) -> int:
            """Add.

            Args:
                amount: how much.
            """
            return amount

    (tmp_path / "tasks.jsonl").write_text(json.dumps({"id": "a", "query": "Add 1.",
                                                      "ground_truth": [["add(amount=1)"]]}) + "\n")
    with pytest.raises(EnvDefinitionError, match="cannot be imported by name in a worker process") as refused:
        PythonEnv(Local, tasks=str(tmp_path / "tasks.jsonl"))
    assert "isolate" in str(refused.value) and "\n" not in str(refused.value)
    env = PythonEnv(Local, tasks=str(tmp_path / "tasks.jsonl"), isolate=False)  # asked for: in this process
    assert env.reset(env.tasks()[0]).act(["add(amount=1)"])[0].observation == "1"
