"""Guidance (`grpo.guidance: solution`): an all-failure group gets one rollout replaced by the task's solution, played
in the env in the policy's reply format, scored by the env, with logprobs under the policy; a group with a success
is never touched; in training the guided rollout is the only source of a gradient where the policy never succeeds."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from coevolve.envs.bfcl_lite import BFCLLiteEnv
from coevolve.guidance import end_of_reply_token, guide_groups, model_scorer, solution_replies
from coevolve.loop import run
from coevolve.policy.chat import ChatRenderer
from coevolve.rollout import RolloutConfig, rollout
from support import ls_tasks, write_tasks

REPO = Path(__file__).resolve().parent.parent


def cat_task():
    return next(t for t in BFCLLiteEnv("train").tasks() if t.truth_tools == ("cat",))


def test_solution_replies_are_what_the_worked_examples_write():
    task = cat_task()
    call = task.ground_truth[0][0]  # e.g. cat(file_name='notes.md')
    docs = BFCLLiteEnv("train").reset(task).tools()
    assert solution_replies(task, "python", docs, max_replies_per_turn=2) == [f"[{call}]", "Done."]
    # One reply per turn allowed: the engine closes the turn after the calls, so no closing reply is scripted.
    assert solution_replies(task, "python", docs, max_replies_per_turn=1) == [f"[{call}]"]
    hermes = solution_replies(task, "hermes", docs, max_replies_per_turn=2)[0]
    name, argument = call.split("(")[0], call.split("'")[1]
    assert json.loads(hermes.split("\n")[1]) == {"name": name, "arguments": {"file_name": argument}}
    broken = replace(task, ground_truth=(("cat(file_name=",),))
    assert solution_replies(broken, "python", docs, 2) is None


def failing(tokenizer, scripted, tasks, group_size, good_for=()):
    """K rollouts per task whose replies are `[pwd()]` (fails every lite task), except tasks in `good_for`, whose
    first rollout answers with the ground truth."""
    env = BFCLLiteEnv("train")
    renderer = ChatRenderer(tokenizer, "python")
    config = RolloutConfig(group_size=group_size, max_new_tokens=32, max_replies_per_turn=2, max_episode_tokens=128)
    batch = rollout(env, tasks, scripted(tokenizer, lambda context: "[pwd()]"), renderer, config)
    trajectories = list(batch.trajectories)
    for index, trajectory in enumerate(trajectories):
        if trajectory.task_id in good_for and trajectory.sample_index == 0:
            trajectories[index] = replace(trajectory, score=1.0)
    return env, renderer, config, trajectories


def test_an_all_failure_group_gets_its_solution_and_a_group_with_a_success_is_untouched(tokenizer, scripted):
    tasks = [cat_task(), ls_tasks(1)[0]]
    env, renderer, config, trajectories = failing(tokenizer, scripted, tasks, 3, good_for={tasks[1].id})
    scored = []

    def score(prompt_ids, completion_ids):
        scored.append(len(completion_ids))
        return [-0.25] * len(completion_ids)

    out = guide_groups(trajectories, 3, {t.id: t for t in tasks}, env, renderer, config, score)
    assert len(out) == 6 and len(scored) == 1  # one guided rollout, scored once
    guided = out[2]
    assert guided.guided and guided.score == 1.0 and guided.task_id == tasks[0].id
    assert (guided.id, guided.sample_index) == (trajectories[2].id, 2)  # in place of the group's last rollout
    assert out[:2] == tuple(trajectories[:2]) and out[3:] == tuple(trajectories[3:])  # the rest unchanged
    assert not any(t.guided for t in out[3:])

    # Its model tokens decode to the replies (each ended by the end-of-turn token), env tokens are masked.
    end = end_of_reply_token(renderer)
    model = [token for token, keep in zip(guided.completion_ids, guided.completion_mask) if keep]
    replies = solution_replies(tasks[0], "python", env.reset(tasks[0]).tools(), 2)
    assert model == [token for reply in replies for token in renderer.encode(reply) + [end]]
    assert guided.prompt_ids == trajectories[2].prompt_ids
    assert sum(guided.completion_mask) < len(guided.completion_mask)  # the tool result is in the stream, masked
    assert [lp for lp, keep in zip(guided.logprobs, guided.completion_mask) if keep] == [-0.25] * len(model)
    assert all(lp == 0.0 for lp, keep in zip(guided.logprobs, guided.completion_mask) if not keep)

    # K = 1 (a group split across processes) and a solution that does not solve the task: nothing changes.
    assert guide_groups(trajectories, 1, {t.id: t for t in tasks}, env, renderer, config, score) == tuple(trajectories)
    wrong = replace(tasks[0], ground_truth=(("cat(file_name='no_such_file.txt')",),))
    assert not any(t.guided for t in guide_groups(trajectories, 3, {wrong.id: wrong, tasks[1].id: tasks[1]},
                                                  env, renderer, config, score))


def test_model_scorer_gives_the_models_sampling_logprobs(tokenizer, tiny_model):
    import torch

    prompt, completion = [1, 2, 3, 4], [5, 6, 7]
    values = model_scorer(tiny_model, 0.5)(prompt, completion)
    with torch.no_grad():
        logits = tiny_model(input_ids=torch.tensor([prompt + completion])).logits[0]
    expected = [torch.log_softmax(logits[len(prompt) - 1 + i] / 0.5, -1)[token].item()
                for i, token in enumerate(completion)]
    assert values == pytest.approx(expected, abs=1e-5) and all(v < 0 for v in values)


def test_model_scorer_reuses_the_prompt_it_shares_with_the_last_episode(tokenizer, tiny_model):
    """A second episode whose prompt opens like the first runs only its own tokens, and scores what a fresh
    scorer (a full pass) gives it; one that departs at once runs whole."""
    opening = list(range(10, 50))
    first, second, other = (opening + [1, 2], [5, 6]), (opening + [3], [7, 8, 9]), ([60, 61, 62], [5, 6])
    expected = [model_scorer(tiny_model, 0.7)(*episode) for episode in (first, second, other)]
    lengths = []
    hook = tiny_model.register_forward_pre_hook(  # the model is the session's: the hook leaves with this test
        lambda module, args, kwargs: lengths.append(kwargs["input_ids"].size(1)), with_kwargs=True)
    try:
        score = model_scorer(tiny_model, 0.7)
        scores = [score(*episode) for episode in (first, second, other)]
    finally:
        hook.remove()
    assert scores == [pytest.approx(e, abs=1e-5) for e in expected]
    # first: its prompt less the last token, then the rest (41 + 3); second: only its 4 tokens from position 40
    # on; other: nothing shared, so its own prompt is kept again (2 + 3).
    assert lengths == [41, 3, 4, 2, 3]


def overrides(model_dir, tasks_file, *extra):
    return [f"model.name={model_dir}", "model.demos=0", "model.device=cpu", f"env.tasks_file={tasks_file}",
            "rollout.group_size=4", "rollout.max_new_tokens=12", "rollout.max_replies_per_turn=1",
            "rollout.max_episode_tokens=64", "grpo.prompts_per_step=2", "grpo.learning_rate=1e-3", "run.seed=0",
            "loop.eval_limit=2", "loop.steps_per_iteration=1", "run.save_steps=1", *extra]


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_guidance_gives_a_policy_that_never_succeeds_a_gradient_and_resumes_exactly(tmp_path, tiny_dir):
    """A random tiny model never solves `ls()`: every group fails, so without guidance no step has a gradient; with
    it each group holds one guided success (positive advantage) and every step moves the weights. Stopping after
    step 1 and resuming to step 2 gives the uninterrupted run's rollouts and weights."""
    from safetensors.torch import load_file

    tasks_file = write_tasks(ls_tasks(4), tmp_path / "tasks.jsonl")
    plain = tmp_path / "plain"
    run(None, overrides(tiny_dir, tasks_file, "run.max_steps=2"), str(plain))
    assert all(step["grad_norm"] == 0 for step in lines(plain / "steps.jsonl"))  # nothing to learn from

    guided = tmp_path / "guided"
    run(None, overrides(tiny_dir, tasks_file, "run.max_steps=2", "grpo.guidance=solution"), str(guided))
    steps = lines(guided / "steps.jsonl")
    assert all(step["grad_norm"] > 0 and step["rollout/guided"] == 2 for step in steps)
    assert all(step["rollout/success_rate"] == 0 for step in steps)  # the policy's own rollouts
    rollouts = lines(guided / "rollouts.jsonl")
    assert [r["sample_index"] for r in rollouts if r["guided"]] == [3] * 4 and all(
        r["score"] == 1.0 for r in rollouts if r["guided"])
    metrics = lines(guided / "metrics.jsonl")
    assert [m["guided"] for m in metrics] == [0, 2, 2] and metrics[1]["train_success"] == 0.0
    assert metrics[1]["signals"]["boundary"] == 0  # a guided success never makes a boundary

    resumed = tmp_path / "resumed"
    run(None, overrides(tiny_dir, tasks_file, "run.max_steps=1", "grpo.guidance=solution"), str(resumed))
    run(None, overrides(tiny_dir, tasks_file, "run.max_steps=2", "grpo.guidance=solution"), str(resumed),
        resume=True)
    keep = ("id", "step", "guided", "score")
    assert [{k: r[k] for k in keep} for r in lines(resumed / "rollouts.jsonl")] == [{k: r[k] for k in keep}
                                                                                      for r in rollouts]
    final, expected = load_file(str(resumed / "final" / "model.safetensors")), load_file(
        str(guided / "final" / "model.safetensors"))
    assert all((final[name] - expected[name]).abs().max() < 1e-5 for name in expected)
    assert not math.isnan(steps[-1]["loss"])
