"""BFCL-lite: deterministic generation, disjoint splits, valid ground truth, BFCL's scoring, six tools."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from coevolve.envs import make_env
from coevolve.envs.bfcl_lite import LITE_TOOLS, BFCLLiteEnv, LiteConfig, generate_tasks, split_of
from coevolve.evaluate import evaluate, oracle_script
from coevolve.records import Task


@pytest.mark.parametrize("split", ["train", "test"])
@pytest.mark.parametrize("scope", ["exposed", "official"])
def test_oracle_scores_one(split, scope):
    env = BFCLLiteEnv(split, scope=scope)
    report = evaluate(env, env.tasks(), oracle_script, "oracle")
    assert report.n > 0 and report.accuracy == 1.0, report.to_dict()["failures"]


def test_generation_is_deterministic_and_seeded():
    first, again = generate_tasks(LiteConfig(seed=3)), generate_tasks(LiteConfig(seed=3))
    assert [t.id for t in first] == [t.id for t in again]
    assert {t.id for t in first}.isdisjoint({t.id for t in generate_tasks(LiteConfig(seed=4))})
    assert all(Task.from_json(t.to_json()) == t for t in first)


def test_splits_are_disjoint_cover_everything_and_are_stable():
    config = LiteConfig(num_tasks=200)
    train, test = BFCLLiteEnv("train", config).tasks(), BFCLLiteEnv("test", config).tasks()
    assert {t.id for t in train}.isdisjoint({t.id for t in test})
    assert len(train) + len(test) == len(generate_tasks(config))
    assert 0.15 < len(test) / (len(train) + len(test)) < 0.35
    # A task's split depends on its content only, not on how many tasks were generated.
    smaller = {t.id for t in BFCLLiteEnv("test", LiteConfig(num_tasks=80)).tasks()}
    assert smaller <= {t.id for t in test}


def test_curriculum_mix_and_one_call_only_config():
    tasks = generate_tasks(LiteConfig(num_tasks=200))
    counts = {n: sum(t.meta["num_calls"] == n for t in tasks) for n in (1, 2)}
    assert counts[1] > counts[2] > 20
    assert all(len(t.ground_truth) == 1 and len(t.ground_truth[0]) == t.meta["num_calls"] for t in tasks)
    assert {t.meta["num_calls"] for t in generate_tasks(LiteConfig(num_tasks=50, max_calls=1))} == {1}


def test_only_the_six_tools_are_exposed():
    env = BFCLLiteEnv("train")
    episode = env.reset(env.tasks()[0])
    assert sorted(doc["name"] for doc in episode.tools()) == sorted(LITE_TOOLS)
    (step,) = episode.act(["pwd()"])  # a real GorillaFileSystem method, not shown in BFCL-lite
    assert "not available in this turn" in step.error


def test_wrong_answers_fail_with_reasons():
    env = BFCLLiteEnv("train")
    mkdir_task = next(t for t in env.tasks() if t.ground_truth[0][0].startswith("mkdir("))
    episode = env.reset(mkdir_task)
    episode.act(["touch(file_name='something_else')"])  # same "None" result, wrong state
    episode.end_turn()
    score = episode.score()
    assert score.value == 0.0 and any("state differs" in reason for reason in score.reasons)

    two_call = next(t for t in env.tasks() if t.meta["num_calls"] == 2)
    episode = env.reset(two_call)
    episode.act([two_call.ground_truth[0][1]])  # the action without first entering the folder
    episode.end_turn()
    assert episode.score().value == 0.0


def test_every_ground_truth_call_runs_cleanly():
    env = BFCLLiteEnv("train")
    for task in env.tasks():
        steps = env.reset(task).act(list(task.ground_truth[0]))
        assert all(step.error is None and '"error"' not in step.observation for step in steps), task.name


def test_registry_and_cli():
    assert isinstance(make_env("bfcl-lite", split="test"), BFCLLiteEnv)
    with pytest.raises(ValueError, match="split"):
        BFCLLiteEnv("validation")
    result = subprocess.run([sys.executable, "-m", "coevolve.cli", "eval", "--env", "bfcl-lite", "--split", "test",
                             "--policy", "oracle", "--json"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["accuracy"] == 1.0 and report["n"] == len(BFCLLiteEnv("test").tasks())
    wrong = subprocess.run([sys.executable, "-m", "coevolve.cli", "eval", "--env", "bfcl-lite", "--category", "base",
                            "--policy", "oracle"], capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 2 and "does not take --category" in wrong.stderr


def test_split_of_uses_the_content_id():
    task = generate_tasks(LiteConfig(num_tasks=5))[0]
    expected = "test" if int(task.id, 16) < 0.25 * 16 ** 16 else "train"
    assert split_of(task, 0.25) == expected


def test_coverage_shift_drops_two_call_tasks_from_train_only():
    """train_max_calls = 1 (configs/lite-shift.yaml): D_0 holds only one-call tasks; the held-out split is the same
    as without the option, two-call tasks included; options arrive flat, as `env.options` gives them."""
    from coevolve.envs.bfcl_lite import BFCLLiteEnv

    shifted_train = BFCLLiteEnv("train", num_tasks=200, train_max_calls=1).tasks()
    plain_train = BFCLLiteEnv("train", num_tasks=200).tasks()
    assert {t.meta["num_calls"] for t in shifted_train} == {1}
    assert [t.id for t in shifted_train] == [t.id for t in plain_train if t.meta["num_calls"] == 1]
    shifted_test = BFCLLiteEnv("test", num_tasks=200, train_max_calls=1).tasks()
    assert [t.id for t in shifted_test] == [t.id for t in BFCLLiteEnv("test", num_tasks=200).tasks()]
    assert {t.meta["num_calls"] for t in shifted_test} == {1, 2}
    with pytest.raises(TypeError, match="unknown BFCL-lite option"):
        BFCLLiteEnv("train", num_taks=200)
    with pytest.raises(ValueError, match="train_max_calls"):
        BFCLLiteEnv("train", max_calls=1, train_max_calls=2)


def test_tool_shift_drops_the_left_out_tools_from_train_only():
    """train_without_tools (configs/lite-tools.yaml): no training task calls them; the held-out split is the same
    and keeps their tasks; the tools stay in what the agent is shown."""
    def tools_of(tasks):
        return {call.split("(", 1)[0] for task in tasks for turn in task.ground_truth for call in turn}

    plain_train = BFCLLiteEnv("train", num_tasks=200).tasks()
    shifted = BFCLLiteEnv("train", num_tasks=200, train_without_tools=["cat", "cd"])  # a YAML list, as in a config
    assert not tools_of(shifted.tasks()) & {"cat", "cd"}
    assert [t.id for t in shifted.tasks()] == [t.id for t in plain_train if not tools_of([t]) & {"cat", "cd"}]
    shifted_test = BFCLLiteEnv("test", num_tasks=200, train_without_tools=("cat", "cd")).tasks()
    assert [t.id for t in shifted_test] == [t.id for t in BFCLLiteEnv("test", num_tasks=200).tasks()]
    assert {"cat", "cd"} <= tools_of(shifted_test)
    assert {"cat", "cd"} <= {doc["name"] for doc in shifted.reset(shifted.tasks()[0]).tools()}
    for bad in (["grep"], "cat"):
        with pytest.raises(ValueError, match="train_without_tools"):
            BFCLLiteEnv("train", train_without_tools=bad)
