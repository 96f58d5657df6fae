"""AppWorld: metrics and action parsing (pure), the process boundary with the real `appworld` package in its own
venv (`make appworld-venv`), the missing-venv and missing-data messages, and the CLI's exit code.

Tests that need a world (tasks and databases) run on a task built offline with AppWorld's own models
(tests/appworld_offline.py); see test_appworld_world.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from coevolve.calls import CallError
from coevolve.envs.appworld import (
    AppWorldConfig,
    AppWorldEnv,
    AppWorldUnavailable,
    WorkerFailed,
    WorkerProcess,
    as_call,
    check_code,
    code_of,
    goal_completion,
    scenario_of,
)
from coevolve.records import ToolCall

ROOT = Path(__file__).resolve().parent.parent
APPWORLD_PYTHON = ROOT / ".venv-appworld" / "bin" / "python"
needs_appworld_venv = pytest.mark.usefixtures("appworld_venv")  # fails, naming `make appworld-venv`, without it


# -- metrics ------------------------------------------------------------------------------------------------------


def test_goal_completion_by_hand():
    # scenario a: 2 of 2 solved; scenario b: 1 of 2; scenario c: 0 of 1 -> TGC 3/5, SGC 1/3
    per_task = {"a_1": 1, "a_2": 1, "b_1": 1, "b_2": 0, "c_1": 0}
    metrics = goal_completion(per_task)
    assert metrics["tgc"] == pytest.approx(3 / 5)
    assert metrics["sgc"] == pytest.approx(1 / 3)
    assert (metrics["tasks"], metrics["scenarios"]) == (5, 3)
    # K samples: a task with rate 0.5 adds 0.5 to TGC and never completes its scenario
    assert goal_completion({"a_1": 0.5, "a_2": 1.0}) == {"tgc": 0.75, "sgc": 0.0, "tasks": 2, "scenarios": 1}
    assert goal_completion({})["tgc"] == 0.0


def test_scenario_of():
    assert scenario_of("82e2fac_1") == "82e2fac"
    assert scenario_of("82e2fac_3:tagged") == "82e2fac"


# -- actions --------------------------------------------------------------------------------------------------------


CODE = "print(apis.supervisor.show_profile())"


@pytest.mark.parametrize("call", [
    ToolCall("execute", {"code": CODE}),
    {"name": "execute", "arguments": {"code": CODE}},
    {"name": "execute", "arguments": json.dumps({"code": CODE})},
    json.dumps({"name": "execute", "arguments": {"code": CODE}}),
    f"execute(code={CODE!r})",
    f"[execute(code={CODE!r})]",
    CODE,
    f"```python\n{CODE}\n```",
])
def test_code_of_reads_every_reply_format(call):
    assert code_of(call) == CODE


def test_code_of_refuses_other_tools_and_bad_arguments():
    assert isinstance(code_of(ToolCall("ls", {})), CallError)
    assert "one tool" in code_of({"name": "cd", "arguments": {"folder": "x"}}).reason
    assert isinstance(code_of(ToolCall("execute", {"code": 3})), CallError)
    assert isinstance(code_of("execute(code=open('x'))"), CallError)  # not a literal: never evaluated
    assert code_of(as_call(CODE)) == CODE


@pytest.mark.parametrize("code, reason", [
    ("import os\nos.system('ls')", "unsafe_argument"),
    ("from pathlib import Path", "unsafe_argument"),
    ("x = ().__class__.__bases__", "private_function"),
    ("apis._internal()", "private_function"),
    ("eval('1 + 1')", "unsafe_argument"),
    ("open('/etc/passwd').read()", "unsafe_argument"),
    ("getattr(apis, 'spotify')", "unsafe_argument"),
    ("print(apis.spotify.login(", "unparseable"),
    ("x = 1\n" * 3000, "too_large"),
])
def test_check_code_refuses(code, reason):
    refusal = check_code(code)
    assert refusal is not None and refusal[0] == reason, refusal


def test_check_code_accepts_ordinary_cells():
    assert check_code(CODE) is None
    assert check_code("songs = apis.spotify.show_song_library(access_token=token)\n"
                      "titles = [song['title'] for song in songs]\nprint(len(titles))") is None


def test_config_refuses_unknown_split_and_anchors_paths():
    with pytest.raises(ValueError, match="test_normal"):
        AppWorldConfig(split="test")
    # the worker runs in the data root: a relative interpreter path must not move with it (nor lose its venv)
    interpreter = AppWorldConfig(python=".venv-appworld/bin/python").interpreter()
    assert interpreter == Path.cwd() / ".venv-appworld" / "bin" / "python"


# -- missing venv / missing data ------------------------------------------------------------------------------------


def test_missing_venv_names_the_make_target(tmp_path):
    env = AppWorldEnv(python=str(tmp_path / "nowhere" / "python"), root=str(tmp_path))
    with pytest.raises(AppWorldUnavailable, match="make appworld-venv"):
        env.tasks()


def _cli(*args: str, **environment: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "coevolve.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **environment}, timeout=300)


def test_cli_exits_2_without_the_venv(tmp_path):
    result = _cli("eval", "--env", "appworld", "--split", "test_normal", "--policy", "oracle",
                  COEVOLVE_APPWORLD_PYTHON=str(tmp_path / "python"))
    assert result.returncode == 2, result.stderr
    assert "make appworld-venv" in result.stderr
    assert "Traceback" not in result.stderr


@needs_appworld_venv
def test_missing_data_names_the_download_command(tmp_path):
    env = AppWorldEnv(split="dev", python=str(APPWORLD_PYTHON), root=str(tmp_path))
    try:
        with pytest.raises(AppWorldUnavailable) as raised:
            env.tasks()
    finally:
        env.close()
    message = str(raised.value)
    assert f"APPWORLD_ROOT={tmp_path.resolve()}" in message and "appworld download data" in message
    assert str(tmp_path.resolve() / "data") in message


@needs_appworld_venv
def test_cli_exits_2_without_the_data(tmp_path):
    result = _cli("eval", "--env", "appworld", "--split", "test_normal", "--policy", "oracle", "--json",
                  COEVOLVE_APPWORLD_PYTHON=str(APPWORLD_PYTHON), APPWORLD_ROOT=str(tmp_path))
    assert result.returncode == 2, result.stderr
    assert "appworld download data" in result.stderr and "Traceback" not in result.stderr


# -- the process boundary -------------------------------------------------------------------------------------------


@pytest.fixture()
def worker(tmp_path):
    process = WorkerProcess(AppWorldConfig(python=str(APPWORLD_PYTHON), root=str(tmp_path)))
    yield process
    process.kill()


@needs_appworld_venv
def test_worker_answers_in_protocol(worker, tmp_path):
    hello = worker.request("hello", timeout_s=120)
    assert hello["protocol"] == 1 and hello["has_data"] is False
    assert hello["data"] == str(tmp_path.resolve() / "data")
    with pytest.raises(RuntimeError, match="unknown op"):
        worker.request("format_disk", timeout_s=30)
    with pytest.raises(RuntimeError, match="no world is open"):
        worker.request("execute", timeout_s=30, code="print(1)")
    assert worker.alive  # errors are replies, not crashes


@needs_appworld_venv
def test_hung_worker_is_killed_at_its_deadline(worker):
    worker.request("hello", timeout_s=120)
    os.kill(worker.process.pid, signal.SIGSTOP)  # a process that stops answering
    with pytest.raises(WorkerFailed, match="did not answer `hello` within"):
        worker.request("hello", timeout_s=2)
    assert not worker.alive


@needs_appworld_venv
def test_crashed_worker_is_reported(worker):
    worker.request("hello", timeout_s=120)
    worker.process.kill()
    worker.process.wait()
    with pytest.raises(WorkerFailed, match="exited"):
        worker.request("hello", timeout_s=30)
