"""`coevolve pool DIR [--json] [--iteration T] [--source ...]` (coevolve/pool_cli.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from coevolve.pool import TaskPool
from coevolve.pool_cli import add_pool_parser, run_pool
from coevolve.records import Provenance, Task


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="coevolve")
    add_pool_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["pool", *argv])


def make_task(name: str, call: str, provenance: Provenance | None = None) -> Task:
    return Task.create("bfcl", name, [[{"role": "user", "content": f"please {name}"}]], {}, [[call]],
                       provenance=provenance)


@pytest.fixture
def run_dir(tmp_path):
    seeds = [make_task("multi_turn_base_0", "ls()"), make_task("multi_turn_base_1", "pwd()")]
    child = make_task("[bold red]not markup[/]", "cd(folder='x')",
                      Provenance("synthetic", seeds[0].id, "forgetting", "episode-7", 0, "accepted"))
    (tmp_path / "run").mkdir()
    with TaskPool(tmp_path / "run" / "pool.sqlite") as pool:
        pool.add_tasks(seeds, 0)
        pool.add_tasks([child], 1)
    return tmp_path / "run", seeds, child


def test_table_lists_the_latest_pool_with_provenance(run_dir, capsys):
    directory, seeds, child = run_dir
    assert run_pool(parse(str(directory))) == 0
    out = capsys.readouterr().out
    assert "D_1: 3 tasks (2 seed, 1 synthetic)" in out
    for task in (*seeds, child):
        assert task.id in out
    child_line = next(line for line in out.splitlines() if child.id in line)
    for value in ("[bold red]not markup[/]", "synthetic", "forgetting", seeds[0].id, "accepted"):
        assert value in child_line  # printed literally: task fields are never rich markup


def test_json_is_one_object_with_every_field(run_dir, capsys):
    directory, seeds, child = run_dir
    assert run_pool(parse(str(directory), "--json")) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["iteration"] == 1
    assert [row["id"] for row in document["tasks"]] == [seeds[0].id, seeds[1].id, child.id]
    assert document["tasks"][2] == {
        "id": child.id, "name": child.name, "env": "bfcl", "source": "synthetic", "signal": "forgetting",
        "parent": seeds[0].id, "episode": "episode-7", "iteration": 0, "verdict": "accepted", "added_iteration": 1,
    }


def test_earlier_iteration_and_source_filter(run_dir, capsys):
    directory, seeds, child = run_dir
    assert run_pool(parse(str(directory), "--json", "--iteration", "0")) == 0
    assert [row["id"] for row in json.loads(capsys.readouterr().out)["tasks"]] == [seeds[0].id, seeds[1].id]
    assert run_pool(parse(str(directory), "--json", "--source", "synthetic")) == 0
    assert [row["id"] for row in json.loads(capsys.readouterr().out)["tasks"]] == [child.id]


def test_empty_pool_prints_no_tasks(tmp_path, capsys):
    TaskPool(tmp_path / "pool.sqlite").close()
    assert run_pool(parse(str(tmp_path), "--json")) == 0
    assert json.loads(capsys.readouterr().out) == {"iteration": None, "tasks": []}


@pytest.mark.parametrize(("setup", "argv", "message"), [
    (lambda d: None, ["{d}/absent"], "no such directory"),
    (lambda d: None, ["{d}"], "no pool.sqlite in"),
    (lambda d: (d / "pool.sqlite").write_bytes(b"this is not a database" * 100), ["{d}"], "cannot read"),
    (lambda d: TaskPool(d / "pool.sqlite").close(), ["{d}", "--iteration", "3"], "no iteration 3"),
])
def test_errors_are_one_line_on_stderr_with_status_2(tmp_path, capsys, setup, argv, message):
    setup(tmp_path)
    assert run_pool(parse(*(arg.format(d=tmp_path) for arg in argv))) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and message in captured.err and captured.err.startswith("coevolve pool:")


def test_unknown_source_is_a_usage_error(tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        parse(str(tmp_path), "--source", "imagined")
    assert exit_info.value.code == 2


def test_coevolve_pool_command_end_to_end(run_dir):
    """The wired-up `coevolve pool` subcommand, as a user runs it."""
    import subprocess
    import sys

    directory, seeds, child = run_dir
    command = [sys.executable, "-m", "coevolve.cli", "pool", str(directory)]
    listed = subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)["tasks"]
    assert {row["id"] for row in rows} == {seeds[0].id, seeds[1].id, child.id}
    assert next(row for row in rows if row["id"] == child.id)["parent"] == child.provenance.parent_id
    table = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert table.returncode == 0 and child.name in table.stdout
    missing = subprocess.run([*command[:-1], str(directory / "nope")], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1


def test_an_exported_pool_is_a_task_file_eval_reads(tmp_path, capsys):
    from coevolve.cli import main
    from coevolve.envs import make_env
    from coevolve.pool import TaskPool

    tasks = make_env("bfcl-lite", split="test").tasks()[:6]
    (tmp_path / "run").mkdir()
    with TaskPool(tmp_path / "run" / "pool.sqlite") as pool:
        pool.add_tasks(tasks, 0)
    exported = tmp_path / "d0.jsonl"
    assert main(["pool", str(tmp_path / "run"), "--export", str(exported), "--json"]) == 0
    capsys.readouterr()
    assert main(["eval", "--env", "bfcl-lite", "--tasks", str(exported), "--policy", "oracle", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["n"] == 6 and report["accuracy"] == 1.0 and set(report["per_task"]) == {t.name for t in tasks}
    assert main(["eval", "--env", "bfcl", "--tasks", str(exported), "--policy", "oracle"]) == 2
    assert "a task of env 'bfcl-lite', not 'bfcl'" in capsys.readouterr().err


@pytest.mark.parametrize("target", ["pool.sqlite", "pool.sqlite-wal", "metrics.jsonl", ".", "d1.jsonl",
                                    "final/config.json", "checkpoints/checkpoint-8/coevolve-config.yaml",
                                    "final/new/deep.jsonl", "../other-run/final/config.json"])
def test_an_export_never_writes_inside_a_run_directory(run_dir, capsys, target):
    """Not the run's own files, not a new file beside them, not its model or checkpoints, not another run's."""
    directory, seeds, _ = run_dir
    (directory / "metrics.jsonl").write_text('{"iteration": 0}\n')
    for folder in ("final", "checkpoints/checkpoint-8", "../other-run/final"):
        (directory / folder).mkdir(parents=True, exist_ok=True)
    (directory / "final" / "config.json").write_text('{"model_type": "llama"}')
    (directory / "checkpoints" / "checkpoint-8" / "coevolve-config.yaml").write_text("run: {}\n")
    (directory / ".." / "other-run" / "pool.sqlite").write_bytes(b"")
    (directory / ".." / "other-run" / "final" / "config.json").write_text('{"model_type": "llama"}')
    before = {path: path.read_bytes() for path in directory.parent.rglob("*") if path.is_file()}
    assert run_pool(parse(str(directory), "--export", str(directory / target))) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("coevolve pool: --export") and len(error.splitlines()) == 1
    assert {path: path.read_bytes() for path in directory.parent.rglob("*") if path.is_file()} == before
    with TaskPool(directory / "pool.sqlite", create=False) as pool:  # the pool still opens, whole
        assert {task.id for task in pool.tasks_at(0)} == {task.id for task in seeds}
    outside = directory.parent / "exports" / "d1.jsonl"
    outside.parent.mkdir(exist_ok=True)
    assert run_pool(parse(str(directory), "--export", str(outside))) == 0  # outside every run: written
    assert outside.read_text().count("\n") == len(seeds) + 1


def test_a_pool_exported_from_an_mcp_run_is_a_task_file_its_env_reads(tmp_path, capsys):
    """The help says the export round-trips: for env mcp (and python) too, whose task files are the user's."""
    import sys as _sys

    from coevolve.cli import main
    from coevolve.envs.mcp_env import MCPEnv
    from coevolve.pool import TaskPool

    repo = Path(__file__).resolve().parent.parent
    _sys.path.insert(0, str(repo))
    board = "examples.board.server:make_server"
    tasks = MCPEnv(server=board, tasks=str(repo / "examples" / "board" / "tasks.jsonl")).tasks()[:3]
    (tmp_path / "run").mkdir()
    with TaskPool(tmp_path / "run" / "pool.sqlite") as pool:
        pool.add_tasks(tasks, 0)
    exported = tmp_path / "d0.jsonl"
    assert main(["pool", str(tmp_path / "run"), "--export", str(exported)]) == 0
    capsys.readouterr()
    assert main(["eval", "--env", f"mcp:{board}", "--tasks", str(exported), "--policy", "oracle", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["n"] == 3 and report["accuracy"] == 1.0
    assert main(["eval", "--env", "mcp:examples.board.server:make_other", "--tasks", str(exported),
                 "--policy", "oracle"]) == 2
