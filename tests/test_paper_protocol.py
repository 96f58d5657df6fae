"""`loop.d0: explored` (the paper's own BFCL protocol): D_0 is what one exploration pass admits, the env's tasks only
start explorations and are never trained on, so all of them may be held out without the overlap check refusing."""

from __future__ import annotations

import json
from pathlib import Path

from coevolve.loop import run
from coevolve.pool import TaskPool
from support import ls_tasks, write_tasks

REPO = Path(__file__).resolve().parent.parent


def test_explored_d0_trains_only_on_what_exploration_admitted(tmp_path, ls_policy_dir):
    entries = write_tasks(ls_tasks(4), tmp_path / "entries.jsonl")
    out = tmp_path / "run"
    run(None, [f"model.name={ls_policy_dir}", "model.demos=0", "model.device=cpu", f"env.tasks_file={entries}",
               "rollout.group_size=4", "rollout.max_new_tokens=12", "rollout.max_replies_per_turn=1",
               "rollout.max_episode_tokens=64", "grpo.prompts_per_step=2", "run.max_steps=2", "run.save_steps=10",
               "loop.steps_per_iteration=1", "loop.eval_split=train", "loop.eval_limit=40", "loop.d0=explored",
               "loop.synthetic_contexts=4", "synthesis.focus_weight=0.3", "synthesis.episodes_per_context=2",
               "run.mode=coevolve"], str(out), say=lambda text: None)
    seed_ids = {task.id for task in ls_tasks(4)}
    with TaskPool(out / "pool.sqlite") as pool:
        explored = {task.id for task in pool.tasks_at(0, source="synthetic")}
    assert explored  # the pass before training admitted tasks
    sampled = [task_id for line in (out / "samples.jsonl").read_text().splitlines()
               for task_id in json.loads(line)["task_ids"]]
    rolled = {json.loads(line)["task_id"] for line in (out / "rollouts.jsonl").read_text().splitlines()}
    assert sampled and not set(sampled) & seed_ids and not rolled & seed_ids  # no entry was trained on
    assert set(sampled) <= explored | {json.loads(l)["task_id"] for l in (out / "synthesis.jsonl").read_text()
                                       .splitlines() if json.loads(l)["task_id"]}
    # The held-out set (the train split's first 40, holding 3 of the 4 entries) was not refused: no entry in D_0.
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["heldout_success"] is not None
