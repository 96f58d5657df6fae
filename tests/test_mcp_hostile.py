"""Hostile MCP servers, through the CLI where a user meets them: a tool that exits (`sys.exit`, `os._exit`) or
blocks the event loop, a factory that never returns, a stdio server that never answers, a server listing too many
tools, and a planted stdlib module beside the user's code. Each costs its episode, with a reason, never the run;
nothing hangs, nothing outlives the CLI, nothing from the working directory runs in a worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coevolve.envs.mcp_env import MCPEnv
from coevolve.envs.user_env import EnvDefinitionError

CLI = str(Path(sys.executable).parent / "coevolve")
"""The installed console script: its sys.path does not start with the working directory (`python -m` would)."""

HOSTILE = '''
import os, sys, time
from mcp.server.mcpserver import MCPServer


def make_server():
    server = MCPServer("hostile")

    @server.tool()
    def fine() -> str:
        """Answer."""
        return "ok"

    @server.tool()
    def leave() -> str:
        """Exit politely."""
        sys.exit(0)

    @server.tool()
    def hard() -> str:
        """Exit at once."""
        os._exit(7)

    @server.tool()
    async def block() -> str:
        """Block the event loop in plain code."""
        time.sleep(600)
        return "late"

    return server


def slow_factory():
    time.sleep(70)
    return make_server()


def exiting_factory():
    os._exit(5)


def raising_factory():
    raise RuntimeError("no database")


def many_tools():
    server = MCPServer("many")
    for index in range(600):
        server.add_tool(lambda: "x", name=f"tool_{index}", description="A tool.")
    return server
'''


@pytest.fixture()
def hostile(tmp_path, monkeypatch):
    (tmp_path / "hostile_server.py").write_text(HOSTILE)
    monkeypatch.syspath_prepend(str(tmp_path))
    rows = [{"id": name, "query": "Do it.", "ground_truth": [[f"{name}()"]]} for name in ("fine", "leave", "hard")]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return tmp_path


def run_cli(folder: Path, *arguments: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, *arguments], cwd=folder, capture_output=True, text=True, timeout=timeout)


def test_tools_that_exit_cost_their_episode_and_eval_reports_every_task(hostile):
    done = run_cli(hostile, "eval", "--env", "mcp:hostile_server:make_server", "--tasks", "tasks.jsonl",
                   "--policy", "oracle", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["per_task"] == {"fine": 1, "leave": 0, "hard": 0}
    assert "SystemExit" in report["failures"]["leave"][0]
    assert "exit code 7" in report["failures"]["hard"][0]
    assert report["failed_outside_model"] == 2  # the server lost both episodes: their 0 is not the script's
    plain = run_cli(hostile, "eval", "--env", "mcp:hostile_server:make_server", "--tasks", "tasks.jsonl",
                    "--policy", "oracle")
    assert "warning: 2 of 3 episodes failed outside the script (e.g. environment: " in plain.stderr, plain.stderr


def test_env_check_names_each_tool_that_exits_instead_of_ending_silently(hostile):
    done = run_cli(hostile, "env", "check", "mcp:hostile_server:make_server", "--tasks", "tasks.jsonl",
                   "--state-call", "fine()")
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 1, done.stdout + done.stderr
    assert any(line.startswith("task 'leave'") and "SystemExit" in line for line in lines)
    assert any(line.startswith("task 'hard'") and "exit code 7" in line for line in lines)
    assert not any("'fine'" in line for line in lines)


def test_a_tool_blocking_the_event_loop_costs_its_episode_within_the_deadline(hostile):
    env = MCPEnv(server="hostile_server:make_server", tasks=str(hostile / "tasks.jsonl"), call_timeout_s=1)
    task = env.tasks()[0]
    started = time.monotonic()
    episode = env.reset(task)
    [blocked] = episode.act(["block()"])
    assert "did not answer within 1 s" in blocked.error and "worker was restarted" in blocked.error
    assert episode.score().value == 0.0 and any(c.kind == "process" and not c.passed for c in episode.score().checks)
    fresh = env.reset(task)  # a fresh worker serves the next episode at once
    assert fresh.act(["fine()"])[0].observation == "ok"
    assert time.monotonic() - started < 30
    env.close()


SLOW_START = '''
import sys, time
sys.path.insert(0, ".")
from coevolve.envs.mcp_env import MCPEnv
from coevolve.envs.user_env import EnvDefinitionError
started = time.monotonic()
for factory in ("slow_factory", "exiting_factory"):
    try:
        MCPEnv(server="hostile_server:" + factory, tasks="tasks.jsonl", start_timeout_s=2)
    except EnvDefinitionError as error:
        print(factory, "refused:", error)
print("seconds", round(time.monotonic() - started, 1))
'''


def test_one_deadline_covers_a_factory_and_the_process_exits_when_refused(hostile):
    (hostile / "slow_start.py").write_text(SLOW_START)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "slow_start.py"], cwd=hostile, capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert "slow_factory refused:" in done.stdout and "did not return within 2 s" in done.stdout
    assert "exiting_factory refused:" in done.stdout and "exit code 5" in done.stdout
    assert elapsed < 40  # the factory sleeping 70 s holds nothing: the process ends with its answer


def test_a_worker_session_whose_factory_hangs_is_stuck_and_one_whose_factory_raises_is_lost(hostile):
    """The worker tells its parent to restart it only when the failed start still holds one of its threads: a
    factory past its deadline (the flag the deadline sets), not one that raised, whatever the messages say."""
    from coevolve.envs.mcp_worker import MCPHost

    hung = MCPHost("hostile_server:slow_factory", {}, call_timeout_s=5, max_sessions=2, start_timeout_s=0.5)
    raised = MCPHost("hostile_server:raising_factory", {}, call_timeout_s=5, max_sessions=2, start_timeout_s=5)
    assert hung.opening[0] == "stuck" and "did not return within 0.5 s" in hung.opening[1]
    assert raised.opening[0] == "lost" and "no database" in raised.opening[1]


NEVER_ANSWERS = '''
import os, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(600)
'''
STDIO_START = '''
import sys
from coevolve.envs.mcp_env import MCPEnv
from coevolve.envs.user_env import EnvDefinitionError
try:
    MCPEnv(command=[sys.executable, "never_answers.py", "server.pid"], tasks="tasks.jsonl", start_timeout_s=2)
except EnvDefinitionError as error:
    print("refused:", error)
'''


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "zombie" in status.read_text())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_no_stdio_server_outlives_the_process_that_started_it(hostile):
    (hostile / "never_answers.py").write_text(NEVER_ANSWERS)
    (hostile / "stdio_start.py").write_text(STDIO_START)
    done = subprocess.run([sys.executable, "stdio_start.py"], cwd=hostile, capture_output=True, text=True, timeout=120)
    assert "refused:" in done.stdout and "did not start within 2 s" in done.stdout, done.stdout + done.stderr
    pid = int((hostile / "server.pid").read_text())
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)


def test_a_server_listing_too_many_tools_is_refused_in_one_line(hostile):
    done = run_cli(hostile, "eval", "--env", "mcp:hostile_server:many_tools", "--tasks", "tasks.jsonl",
                   "--policy", "oracle")
    error = done.stderr.strip()
    assert done.returncode == 2 and len(error.splitlines()) == 1
    assert "lists more than 512 tools" in error and "env.options.max_tools" in error
    with pytest.raises(EnvDefinitionError, match="max_tools: a whole number"):
        MCPEnv(server="hostile_server:make_server", tasks=str(hostile / "tasks.jsonl"), max_tools=0)
    with pytest.raises(EnvDefinitionError, match="max_sessions: a whole number"):
        MCPEnv(server="hostile_server:make_server", tasks=str(hostile / "tasks.jsonl"), max_sessions=0)


PLANTED = '''
import pathlib
pathlib.Path(__file__).with_name("planted-{name}-ran").write_text("ran")
raise SystemExit("planted {name} imported")
'''
TOOLS = '''
class Counter:
    """A counter."""

    def __init__(self):
        self.count = 0

    def add(self, amount: int) -> int:
        """Add to the counter.

        Args:
            amount: how much to add.
        """
        self.count += amount
        return self.count
'''


@pytest.mark.parametrize("planted", ["pickle", "json", "selectors"])
def test_the_workers_import_nothing_from_the_working_directory(hostile, planted):
    """A stdlib name lying beside the user's tools never runs in the python env's or the MCP env's worker."""
    (hostile / f"{planted}.py").write_text(PLANTED.format(name=planted))
    (hostile / "counter_tools.py").write_text(TOOLS)
    (hostile / "counter.jsonl").write_text(json.dumps({"id": "add", "query": "Add 2.",
                                                       "ground_truth": [["add(amount=2)"]]}) + "\n")
    python = run_cli(hostile, "eval", "--env", "python:counter_tools:Counter", "--tasks", "counter.jsonl",
                     "--policy", "oracle", "--json")
    mcp = run_cli(hostile, "eval", "--env", "mcp:hostile_server:make_server", "--tasks", "tasks.jsonl",
                  "--policy", "oracle", "--json")
    assert not (hostile / f"planted-{planted}-ran").exists()
    assert python.returncode == 0 and json.loads(python.stdout)["per_task"] == {"add": 1}, python.stderr
    assert mcp.returncode == 0 and json.loads(mcp.stdout)["per_task"]["fine"] == 1, mcp.stderr


def test_a_run_on_a_server_env_check_refuses_says_so_at_its_start(hostile, capsys):
    """`train` ran on a server `env check` refuses; its dry run (and the run's first lines) say why now."""
    from coevolve.cli import main

    repo = Path(__file__).resolve().parent.parent
    options = "env.options={server: 'hostile_server:make_server', tasks: '%s'}" % (hostile / "tasks.jsonl")
    assert main(["train", "--config", str(repo / "configs" / "quickstart.yaml"), "--output-dir",
                 str(hostile / "run"), "--dry-run", "env.name=mcp", "env.split=null", "model.demos=0",
                 options]) == 0
    err = capsys.readouterr().err
    assert "warning: `coevolve env check` refuses task 'leave'" in err and "SystemExit" in err


KILLED_PARENT = '''
import sys, time
sys.path.insert(0, ".")
from coevolve.envs.mcp_env import MCPEnv
env = MCPEnv(server="hostile_server:make_server", tasks="tasks.jsonl", call_timeout_s=600)
episode = env.reset(env.tasks()[0])
print(env.worker._process.pid, flush=True)
episode.act(["block()"])  # the worker's loop blocks; this process is killed meanwhile
'''


def test_the_worker_ends_when_its_parent_is_killed_even_while_a_tool_blocks(hostile):
    import signal

    (hostile / "killed_parent.py").write_text(KILLED_PARENT)
    parent = subprocess.Popen([sys.executable, "killed_parent.py"], cwd=hostile, stdout=subprocess.PIPE, text=True)
    worker = int(parent.stdout.readline())
    time.sleep(1.5)  # the call is in flight, the worker blocked in time.sleep(600)
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=10)
    deadline = time.monotonic() + 10
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(worker)
