"""`coevolve eval` as a user runs it: a real subprocess, its JSON output, its one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "coevolve.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_oracle_json_has_accuracy_n_and_per_task():
    result = run_cli("eval", "--env", "bfcl", "--category", "multi_turn_base", "--policy", "oracle", "--json",
                     "--limit", "5")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["accuracy"] == 1.0 and report["n"] == 5
    assert report["per_task"] == {f"multi_turn_base_{i}": 1 for i in range(5)}


def test_table_output_is_readable():
    result = run_cli("eval", "--category", "miss_param", "--policy", "oracle", "--limit", "3")
    assert result.returncode == 0, result.stderr
    assert "accuracy" in result.stdout and "1.0000" in result.stdout


def test_replay_scores_logged_outputs(tmp_path):
    from coevolve.envs.bfcl import load_tasks

    tasks = load_tasks("base")[:3]
    lines = [
        {"id": tasks[0].name, "turns": [list(turn) for turn in tasks[0].ground_truth]},  # correct
        {"id": tasks[1].name, "turns": [[] for _ in tasks[1].ground_truth]},  # says nothing
        # correct, with the JSON call form and one turn split into two replies
        {"id": tasks[2].name, "turns": [
            [[{"name": c.split("(")[0], "arguments": {}}] if c.endswith("()") else [c] for c in turn] if turn else []
            for turn in tasks[2].ground_truth
        ]},
    ]
    replay = tmp_path / "replay.jsonl"
    replay.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    result = run_cli("eval", "--category", "base", "--policy", f"replay:{replay}", "--json", "--limit", "4")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["per_task"] == {tasks[0].name: 1, tasks[1].name: 0, tasks[2].name: 1, "multi_turn_base_3": 0}
    assert "no function call" in report["failures"][tasks[1].name][0]
    assert "no replay entry" in report["failures"]["multi_turn_base_3"][0]


@pytest.mark.parametrize(
    "args, content, message",
    [
        (["--category", "multi_turn_bogus", "--policy", "oracle"], None, "unknown BFCL category"),
        (["--policy", "replay:/nonexistent/replay.jsonl"], None, "does not exist"),
        (["--policy", "replay:{file}"], '{"id": "multi_turn_base_0", "turns": []}\n{oops\n', ":2: not valid JSON"),
        (["--policy", "replay:{file}"], '{"id": "multi_turn_base_0"}\n', "expected an object with 'id' and 'turns'"),
        (["--policy", "replay:{file}"], '{"id": "multi_turn_base_0", "turns": ["cd()"]}\n', "each turn must be a list"),
        (["--policy", "replay:{file}"], '{"id": "no_such_task", "turns": []}\n', "unknown task id"),
        (["--policy", "replay:{file}"], '{"id": "multi_turn_base_0", "turns": [[1]]}\n', "a call must be"),
        (["--policy", "model_free_lunch"], None, "unknown policy"),
        (["--env", "atlantis", "--policy", "oracle"], None, "unknown env"),
        (["--policy", "oracle", "--limit", "0"], None, "--limit"),
    ],
)
def test_user_errors_give_one_line_and_nonzero_exit(tmp_path, args, content, message):
    path = tmp_path / "replay.jsonl"
    if content is not None:
        path.write_text(content)
    result = run_cli("eval", *[arg.format(file=path) for arg in args])
    assert result.returncode != 0
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_eval_of_scripted_policies_does_not_import_torch():
    code = (
        "import sys; from coevolve.cli import main; "
        "main(['eval', '--policy', 'oracle', '--limit', '2', '--json']); "
        "heavy = [m for m in ('torch', 'transformers', 'trl', 'numpy') if m in sys.modules]; "
        "print('HEAVY', heavy)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "HEAVY []" in result.stdout


def test_model_policy_runs_offline_with_the_shipped_smollm2(smol_dir):
    result = run_cli("eval", "--env", "bfcl-lite", "--split", "test", "--policy", "model:smollm2", "--limit", "2",
                     "--demos", "2", "--demo-choice", "coverage", "--max-new-tokens", "40", "--json", timeout=900)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["n"] == 2 and report["samples"] == 1 and set(report["per_task"].values()) <= {0, 1}
    assert report["policy"] == "model:smollm2" and 0.0 <= report["accuracy"] <= 1.0


@pytest.mark.parametrize("args, message", [
    (["--policy", "model:smollm2", "--backend", "vllm"], "vllm backend needs the `vllm` package"),
    (["--policy", "model:smollm2", "--backend", "openai"], "needs --base-url"),
    (["--policy", "model:/nonexistent/model"], "no such folder"),
    (["--policy", "model:smollm2", "--samples", "0"], "must be >= 1"),
    (["--policy", "model:smollm2", "--demo-choice", "best"], "invalid choice"),
])
def test_model_policy_errors_are_one_line(args, message):
    result = run_cli("eval", "--env", "bfcl-lite", "--limit", "1", *args, timeout=600)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_worked_examples_never_come_from_evaluated_tasks():
    """With --limit on bfcl-lite's train split, the examples come from the split's other tasks (before, the
    whole split counted as evaluated and a model was prompted with no example at all)."""
    from coevolve.cli import evaluation_tasks
    from coevolve.envs import make_env

    train = make_env("bfcl-lite", split="train")
    tasks, demo_env, demo_tasks = evaluation_tasks(train, "bfcl-lite", "official", 5, 3)
    assert len(tasks) == 5 and len(demo_tasks) == len(train.tasks()) - 5
    assert not {t.id for t in tasks} & {t.id for t in demo_tasks}
    bfcl = make_env("bfcl")
    tasks, demo_env, demo_tasks = evaluation_tasks(bfcl, "bfcl", "official", None, 2)
    assert demo_env is bfcl and len(demo_tasks) == 2 and not {t.id for t in demo_tasks} & {t.id for t in tasks}
    assert evaluation_tasks(bfcl, "bfcl", "official", 3, 0)[2] == []
