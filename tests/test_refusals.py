"""Accepted, then wrong — no more: what cannot work is refused in one line (exit 2) before anything runs or is written,
and what can is never silently changed (issue "nothing lost, nothing hung, nothing silent", items 9 and 10)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from coevolve.cli import main
from coevolve.config import ConfigError, load_config, write_config
from coevolve.envs.python_env import EnvDefinitionError, PythonEnv
from coevolve.run_setup import resolve_config

REPO = Path(__file__).resolve().parent.parent
TOOLS = textwrap.dedent('''
    class Counter:
        """A counter."""

        def __init__(self):
            self.value = 0

        def add(self, by: int) -> int:
            """Add to the counter."""
            self.value += by
            return self.value
''')


MODULE = "counter_tools"


@pytest.fixture()
def tools(tmp_path, monkeypatch):
    import sys

    for name in [name for name in sys.modules if name == MODULE]:  # each test writes its own version
        monkeypatch.delitem(sys.modules, name)
    (tmp_path / "counter_tools.py").write_text(TOOLS)
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"id": "a", "query": "Add 2.", "ground_truth": [["add(by=2)"]]})
                                          + "\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def one_line_error(capsys) -> str:
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "Traceback" not in error, error
    return error


@pytest.mark.parametrize("source, said", [
    ("    async def wait(self, seconds: int) -> str:\n        \"\"\"Wait.\"\"\"\n        return 'ok'\n", "is `async def`"),
    ("    def each(self, count: int) -> int:\n        \"\"\"Count.\"\"\"\n        yield count\n", "yields"),
    ("    def many(self, **options: int) -> int:\n        \"\"\"Many.\"\"\"\n        return 1\n", "**options cannot"),
])
def test_tools_that_cannot_be_tools_are_refused_by_name(tools, source, said):
    (tools / "counter_tools.py").write_text(TOOLS + "\n" + source)
    with pytest.raises(EnvDefinitionError, match=said.replace("*", r"\*")):
        PythonEnv("counter_tools:Counter", tasks="tasks.jsonl")


def test_task_files_that_would_count_wrong_are_refused(tools):
    (tools / "empty.jsonl").write_text("\n")
    with pytest.raises(EnvDefinitionError, match="no task in it"):
        PythonEnv("counter_tools:Counter", tasks="empty.jsonl")
    row = {"id": "a", "query": "Add 2.", "ground_truth": [["add(by=2)"]]}
    (tools / "twice.jsonl").write_text(json.dumps(row) + "\n" + json.dumps({**row, "id": "b"}) + "\n")
    with pytest.raises(EnvDefinitionError, match="twice.jsonl:2: the same task as line 1"):
        PythonEnv("counter_tools:Counter", tasks="twice.jsonl")


def test_reset_arguments_for_a_class_without_reset_fail_the_episode_with_the_reason(tools):
    (tools / "reset.jsonl").write_text(json.dumps({"id": "r", "query": "Add.", "reset": {"start": 5},
                                                   "ground_truth": [["add(by=1)"]]}) + "\n")
    env = PythonEnv("counter_tools:Counter", tasks="reset.jsonl")
    episode = env.reset(env.tasks()[0])
    [step] = episode.act(["add(by=1)"])
    assert "has no reset()" in step.error  # not dropped: the episode cannot start as the task says
    episode.end_turn()
    assert episode.score().value == 0.0 and "has no reset()" in " ".join(episode.score().reasons)


@pytest.mark.parametrize("argv, said", [
    (["--limit", "0"], "--limit must be at least 1"),
    (["--limit", "-1"], "--limit must be at least 1"),
    (["--category", "multi_turn_base"], "--category is for env bfcl"),
])
def test_eval_options_a_python_env_cannot_honour_are_refused(tools, capsys, argv, said):
    assert main(["eval", "--env", "python:counter_tools:Counter", "--tasks", "tasks.jsonl", "--policy", "oracle",
                 *argv]) == 2
    assert said in one_line_error(capsys)


def test_a_task_record_whose_ground_truth_is_a_string_is_refused(tmp_path, capsys):
    from coevolve.envs.bfcl_lite import BFCLLiteEnv

    row = BFCLLiteEnv("test").tasks()[0].to_dict()
    row["ground_truth"] = "ls(a=True)"  # 10 characters would have read as 10 turns
    (tmp_path / "tasks.jsonl").write_text(json.dumps(row) + "\n")
    assert main(["eval", "--env", "bfcl-lite", "--tasks", str(tmp_path / "tasks.jsonl"), "--policy", "oracle"]) == 2
    assert "ground_truth must be a list of turns" in one_line_error(capsys)


@pytest.mark.parametrize("overrides, said", [
    (["env.name=nosuch"], "nosuch"),
    (["env.name=python", "env.options={cls: 'no_such_module_xyz:Tools', tasks: tasks.jsonl}"], "cannot import"),
    (["env.options={no_such_option: 1}"], "no_such_option"),
])
def test_dry_run_checks_the_env_as_a_run_would(tmp_path, capsys, overrides, said):
    assert main(["train", "--config", str(REPO / "configs" / "quickstart.yaml"), "--output-dir",
                 str(tmp_path / "run"), "--dry-run", *overrides]) == 2
    assert said in one_line_error(capsys)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("case", ["missing", "folder", "empty"])
def test_a_tasks_file_that_is_not_there_or_empty_is_named_as_such(tmp_path, capsys, case):
    path = {"missing": tmp_path / "nope.jsonl", "folder": tmp_path, "empty": tmp_path / "empty.jsonl"}[case]
    if case == "empty":
        path.write_text("")
    assert main(["train", "--config", str(REPO / "configs" / "quickstart.yaml"), "--output-dir",
                 str(tmp_path / "run"), "--dry-run", f"env.tasks_file={path}"]) == 2
    said = {"missing": "is not there", "folder": "is a folder", "empty": "holds no task to train on"}[case]
    error = one_line_error(capsys)
    assert said in error and str(path) in error


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs /proc")
def test_an_output_dir_no_folder_can_be_made_in_is_refused_by_the_dry_run(capsys):
    assert main(["train", "--config", str(REPO / "configs" / "quickstart.yaml"), "--output-dir", "/proc/x",
                 "--dry-run"]) == 2
    assert "a folder cannot be made in /proc" in one_line_error(capsys)


def test_resume_with_a_config_file_uses_it_and_refuses_what_it_may_not_change(tmp_path):
    directory = tmp_path / "run"
    directory.mkdir()
    write_config(load_config(REPO / "configs" / "quickstart.yaml", [f"run.output_dir={directory}"]),
                 directory / "config.yaml")
    longer = tmp_path / "longer.yaml"
    longer.write_text((REPO / "configs" / "quickstart.yaml").read_text().replace("max_steps:", "max_steps: 99 #"))
    config, _ = resolve_config(str(longer), [], str(directory), resume=True)
    assert config.run.max_steps == 99  # the file given is read, not ignored
    other_k = tmp_path / "other.yaml"
    other_k.write_text((REPO / "configs" / "quickstart.yaml").read_text().replace("group_size:", "group_size: 6 #"))
    with pytest.raises(ConfigError, match="rollout.group_size is 6 here"):
        resolve_config(str(other_k), [], str(directory), resume=True)


@pytest.mark.parametrize("overrides, key", [
    (["loop.sampler=history", "loop.recur_fraction=0"], "loop.sampler"),  # the draw of every later iteration
    (["loop.recur_fraction=0.25"], "loop.recur_fraction"),
    (["synthesis.rest_contexts=random"], "synthesis.rest_contexts"),  # what the next iterations explore
    (["synthesis.focus_retries=8"], "synthesis.focus_retries"),
])
def test_a_resume_refuses_a_change_to_how_the_pool_is_drawn_or_explored(tmp_path, overrides, key):
    from coevolve.config import paper_overrides

    directory = tmp_path / "run"
    directory.mkdir()
    # The paper's coevolve (uniform draw), so that each override changes what the run was started with.
    write_config(load_config(REPO / "configs" / "quickstart.yaml", [f"run.output_dir={directory}", *paper_overrides()]),
                 directory / "config.yaml")
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        resolve_config(None, overrides, str(directory), resume=True)


@pytest.mark.parametrize("change, said", [
    (lambda row: row["meta"].pop("involved_classes"), "meta.involved_classes must list"),
    (lambda row: row["meta"].update(involved_classes=["os"]), "names ['os'], not BFCL multi-turn classes"),
    (lambda row: row["initial_state"].update(GorillaFileSystem="root"), "must be an object"),
    (lambda row: row["initial_state"].update(GorillaFileSystem=json.loads("{\"a\":" * 400 + "1" + "}" * 400)),
     "nested deeper than 64 levels"),
])
def test_task_records_that_cannot_run_are_refused_naming_the_line(tmp_path, capsys, change, said):
    from coevolve.envs.bfcl_lite import BFCLLiteEnv

    row = BFCLLiteEnv("test").tasks()[0].to_dict()
    change(row)
    (tmp_path / "tasks.jsonl").write_text(json.dumps(row) + "\n")
    assert main(["eval", "--env", "bfcl-lite", "--tasks", str(tmp_path / "tasks.jsonl"), "--policy", "oracle"]) == 2
    error = one_line_error(capsys)
    assert said in error and "tasks.jsonl:1" in error


def test_a_task_file_nested_past_the_parser_is_refused_naming_the_line(tmp_path, capsys):
    (tmp_path / "deep.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n")
    assert main(["eval", "--env", "bfcl-lite", "--tasks", str(tmp_path / "deep.jsonl"), "--policy", "oracle"]) == 2
    assert "deep.jsonl:1: nested too deep" in one_line_error(capsys)


def test_env_check_names_a_class_attribute_that_leaks_between_episodes(tools, capsys):
    (tools / "counter_tools.py").write_text(textwrap.dedent('''
        class Counter:
            """A counter whose log is, by mistake, shared by every instance."""

            log: list = []

            def add(self, by: int) -> int:
                """Add to the log."""
                self.log.append(by)
                return len(self.log)
    '''))
    assert main(["env", "check", "counter_tools:Counter", "--tasks", "tasks.jsonl"]) == 1
    said = capsys.readouterr().out
    assert "class attribute log is shared by every instance" in said and "randomness" not in said
