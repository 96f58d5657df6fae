"""Held-out never overlaps D_0 silently: BFCL's seeded train/test halves, and the check every training run makes
before it writes anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from coevolve.config import ConfigError, load_config
from coevolve.envs.bfcl import BFCLEnv, bfcl_split
from coevolve.loop import run
from coevolve.run_setup import build_env, build_eval, check_heldout, heldout_overlap, load_tasks
from support import ls_tasks, write_tasks

REPO = Path(__file__).resolve().parent.parent


def test_bfcl_halves_are_seeded_disjoint_and_cover_the_category():
    every = BFCLEnv("multi_turn_base").tasks()
    train, test = BFCLEnv("multi_turn_base", split="train").tasks(), BFCLEnv("multi_turn_base", split="test").tasks()
    assert len(every) == 200 and len(train) == len(test) == 100
    assert not {t.id for t in train} & {t.id for t in test} and {t.id for t in train + test} == {t.id for t in every}
    assert [t.name for t in test] == [t.name for t in bfcl_split(every, "test")]  # the same halves every time
    assert [t.name for t in train] == [t.name for t in every if t in train]  # each half in the shipped order
    other = bfcl_split(every, "test", seed=7)
    assert {t.id for t in other} != {t.id for t in test} and len(bfcl_split(every, "test", 0.25)) == 50
    with pytest.raises(ValueError, match="unknown BFCL split"):
        BFCLEnv(split="dev")


@pytest.mark.parametrize("config_file", sorted((REPO / "configs").glob("bfcl-qwen3-4b*.yaml")))
def test_the_bfcl_configs_train_and_evaluate_on_disjoint_halves(config_file):
    config = load_config(config_file)
    env = build_env(config)
    train = load_tasks(config, env)
    _, heldout = build_eval(config, env)
    assert heldout and not heldout_overlap(train, heldout)
    check_heldout(config, train, heldout)  # no refusal


def test_a_heldout_set_sharing_tasks_with_d0_is_refused_before_anything_is_written(tmp_path):
    tasks = ls_tasks(4)
    copy = type(tasks[0]).create(tasks[0].env, "renamed", [[{"role": "user", "content": "  " + tasks[0].turns[0][0][
        "content"].upper()}]], tasks[0].initial_state, [["pwd()"]])
    assert heldout_overlap(tasks[1:], tasks[:2]) == [tasks[1]]  # the same id
    assert heldout_overlap(tasks, [copy]) == [copy]  # the same start and query, another id
    train_file = write_tasks(tasks, tmp_path / "train.jsonl")
    out = tmp_path / "run"
    overrides = [f"env.tasks_file={train_file}", "loop.eval_split=train", "model.demos=0"]
    with pytest.raises(ConfigError, match="the held-out set shares 3 of its 40 tasks with D_0"):
        run(str(REPO / "configs" / "lite-static.yaml"), overrides, str(out))
    assert not out.exists()  # refused before the directory was made
    config = load_config(REPO / "configs" / "lite-static.yaml", [*overrides, "loop.allow_heldout_overlap=true"])
    env = build_env(config)
    check_heldout(config, load_tasks(config, env), build_eval(config, env)[1])  # on purpose: allowed
