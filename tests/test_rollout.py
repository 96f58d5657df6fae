"""The rollout engine with scripted replies (known texts) and with a real tiny model: scores, masks, limits."""

from __future__ import annotations

import pytest

from coevolve.calls import parse_call
from coevolve.envs import make_env
from coevolve.envs.bfcl import load_tasks
from coevolve.policy.backends import SamplingConfig
from coevolve.policy.chat import ChatRenderer, format_calls
from coevolve.rollout import RolloutConfig, rollout

START, END = "<|im_start|>", "<|im_end|>"


def last_message(context: str) -> tuple[str, str]:
    """(role, content) of the message before the final generation prompt of a ChatML context."""
    generation_prompt = context.rfind(START)
    previous = context.rfind(START, 0, generation_prompt)
    role, _, content = context[previous + len(START):generation_prompt].partition("\n")
    return role, content.rsplit(END, 1)[0]


def oracle_reply_for(tasks, reply_format):
    """Replies with each turn's ground truth, then 'Done.' once the tool results are in."""
    envs = {"bfcl-lite": make_env("bfcl-lite"), "bfcl": make_env("bfcl", category="base")}
    docs = [doc for task in tasks for doc in envs[task.env].reset(task).tools()]
    by_query = {}
    for task in tasks:
        for turn, messages in enumerate(task.turns):
            for message in messages:
                by_query[message["content"].strip()] = task.ground_truth[turn]

    def reply_for(context: str) -> str:
        role, content = last_message(context)
        calls = by_query.get(content.strip()) if role == "user" else None
        if calls:
            return format_calls([parse_call(call) for call in calls], reply_format, docs)
        return "Done."

    return reply_for


def multi_turn_tasks(count: int):
    """Base tasks whose user queries are unique (so a query names its turn)."""
    seen, chosen = {}, []
    for task in load_tasks("base"):
        queries = [m["content"].strip() for turn in task.turns for m in turn]
        if any(q in seen for q in queries):
            continue
        seen.update({q: task.id for q in queries})
        chosen.append(task)
        if len(chosen) == count:
            return chosen
    return chosen


@pytest.mark.parametrize("reply_format", ["python", "hermes"])
def test_oracle_replies_solve_multi_turn_bfcl_and_episodes_leave_the_batch(tokenizer, scripted, reply_format):
    env = make_env("bfcl", category="base")
    tasks = multi_turn_tasks(4)
    assert len({t.num_turns for t in tasks}) > 1  # episodes of different lengths
    backend = scripted(tokenizer, oracle_reply_for(tasks, reply_format))
    batch = rollout(env, tasks, backend, ChatRenderer(tokenizer, reply_format),
                    RolloutConfig(group_size=2, max_episode_tokens=20000, max_new_tokens=512))
    assert [t.score for t in batch.trajectories] == [1.0] * 8, [t.reasons for t in batch.trajectories]
    assert [t.task_id for t in batch.trajectories] == [t.id for t in tasks for _ in range(2)]
    assert backend.calls[0] == 8 and backend.calls[-1] < 8 and backend.calls == sorted(backend.calls, reverse=True)
    assert batch.generation_calls == len(backend.calls)
    for trajectory in batch.trajectories:
        assert not trajectory.truncated and trajectory.steps and all(step.ok for step in trajectory.steps)


def test_masks_are_one_exactly_on_model_tokens(tokenizer, scripted):
    env = make_env("bfcl", category="base")
    tasks = multi_turn_tasks(2)
    reply_for = oracle_reply_for(tasks, "python")
    replies: list[str] = []

    def recording(context):
        replies.append(reply_for(context))
        return replies[-1]

    batch = rollout(env, tasks, scripted(tokenizer, recording), ChatRenderer(tokenizer, "python"),
                    RolloutConfig(group_size=1, max_episode_tokens=20000, max_new_tokens=512))
    for trajectory, task in zip(batch.trajectories, tasks):
        ids, mask = trajectory.completion_ids, trajectory.completion_mask
        assert len(ids) == len(mask) == len(trajectory.logprobs)
        runs, start = [], 0
        for position in range(1, len(ids) + 1):
            if position == len(ids) or mask[position] != mask[start]:
                runs.append((mask[start], tokenizer.decode(ids[start:position])))
                start = position
        model_runs = [text for flag, text in runs if flag == 1]
        other_runs = [text for flag, text in runs if flag == 0]
        # Every model run is one reply exactly as written, ending with the end-of-turn token it sampled.
        assert all(text.endswith(END) and text[: -len(END)] in replies for text in model_runs)
        assert len(model_runs) == sum(len(turn) for turn in task.ground_truth) // 1 or len(model_runs) >= task.num_turns
        # Everything between replies is template, tool results and user turns: no reply text leaks into it.
        assert all(text.startswith("\n" + START) and text.endswith(START + "assistant\n") for text in other_runs)
        between = "".join(other_runs)
        assert all(step.observation in between for step in trajectory.steps)
        assert all(m["content"] in between for turn in task.turns[1:] for m in turn)
        assert all((lp == -0.5) == (flag == 1) for lp, flag in zip(trajectory.logprobs, mask))
        assert trajectory.completion_ids[-1] == tokenizer.convert_tokens_to_ids(END) and mask[-1] == 1


def test_token_stream_is_what_the_template_renders(tokenizer, scripted):
    env = make_env("bfcl-lite", split="train")
    task = next(t for t in env.tasks() if t.meta["num_calls"] == 1)
    reply = format_calls([parse_call(task.ground_truth[0][0])], "python")
    renderer = ChatRenderer(tokenizer, "python")
    backend = scripted(tokenizer, lambda context: reply if last_message(context)[0] == "user" else "Done.")
    trajectory = rollout(env, [task], backend, renderer, RolloutConfig(group_size=1)).trajectories[0]
    assert trajectory.score == 1.0
    step = trajectory.steps[0]
    messages = renderer.opening_messages(env.reset(task).tools(), task.turns[0]) + [
        {"role": "assistant", "content": reply}, {"role": "tool", "content": step.observation},
        {"role": "assistant", "content": "Done."}]
    expected = tokenizer.apply_chat_template(messages, tokenize=False)
    assert tokenizer.decode(trajectory.prompt_ids + trajectory.completion_ids) + "\n" == expected


def test_hostile_and_broken_replies_become_error_steps_and_the_run_goes_on(tokenizer, scripted):
    env = make_env("bfcl-lite", split="train")
    tasks = env.tasks()[:2]
    hostile = iter(["[__import__('os').system('touch /tmp/pwned')]", "<tool_call>{not json</tool_call>",
                    "[cd(folder=pwd())]", "[open('x', 'w')]", "[ls(" + "a=" * 3000 + "1)]", "[rm(file_name=[1]*10**9)]"])
    batch = rollout(env, tasks, scripted(tokenizer, lambda context: next(hostile, "Done.")),
                    ChatRenderer(tokenizer, "python"), RolloutConfig(group_size=3, max_replies_per_turn=2))
    assert len(batch.trajectories) == 6 and all(t.score == 0.0 for t in batch.trajectories)
    errors = [step for t in batch.trajectories for step in t.steps]
    assert errors and all(not step.ok and step.error for step in errors)


def test_limits_are_recorded_as_truncation(tokenizer, scripted):
    lite = make_env("bfcl-lite", split="train")
    task = lite.tasks()[0]
    always_call = lambda context: format_calls([parse_call("ls()")], "python")  # noqa: E731
    renderer = ChatRenderer(tokenizer, "python")

    cut = rollout(lite, [task], scripted(tokenizer, always_call), renderer,
                  RolloutConfig(group_size=1, max_new_tokens=2, max_replies_per_turn=1)).trajectories[0]
    assert cut.truncated and any("max_new_tokens" in r for r in cut.reasons)

    capped = rollout(lite, [task], scripted(tokenizer, always_call), renderer,
                     RolloutConfig(group_size=1, max_replies_per_turn=2)).trajectories[0]
    assert capped.truncated and any("max_replies_per_turn" in r for r in capped.reasons)
    assert len(capped.steps) == 2

    long_task = multi_turn_tasks(1)[0]
    base = make_env("bfcl", category="base")
    short = rollout(base, [long_task], scripted(tokenizer, oracle_reply_for([long_task], "python")), renderer,
                    RolloutConfig(group_size=1, max_turns=1, max_episode_tokens=20000)).trajectories[0]
    assert short.score == 0.0 and any("max_turns" in r for r in short.reasons)

    budget = rollout(base, [long_task], scripted(tokenizer, oracle_reply_for([long_task], "python")), renderer,
                     RolloutConfig(group_size=1, max_episode_tokens=60)).trajectories[0]
    assert budget.score == 0.0 and budget.truncated and len(budget.completion_ids) <= 60


def test_tool_aware_template_gets_the_tools_and_hermes_calls_solve_tasks(qwen_tokenizer, scripted):
    env = make_env("bfcl-lite", split="train")
    tasks = env.tasks()[:3]
    renderer = ChatRenderer(qwen_tokenizer, "hermes")
    assert renderer.template_takes_tools and renderer.tools_in_template

    def reply_for(context):
        if "<tool_response>" in context.rsplit(START + "assistant", 1)[0].rsplit(START, 1)[-1]:
            return "Done."
        return oracle_reply_for(tasks, "hermes")(context)

    batch = rollout(env, tasks, scripted(qwen_tokenizer, reply_for), renderer, RolloutConfig(group_size=2))
    assert [t.score for t in batch.trajectories] == [1.0] * 6
    prompt = qwen_tokenizer.decode(batch.trajectories[0].prompt_ids)
    assert "<tools>" in prompt and '"name": "mkdir"' in prompt


def test_tiny_model_rollout_logprobs_are_the_models(tokenizer, tiny_model):
    import torch

    from coevolve.policy.hf_backend import TransformersBackend

    env = make_env("bfcl-lite", split="train")
    batch = rollout(env, env.tasks()[:2], TransformersBackend(tiny_model, tokenizer),
                    ChatRenderer(tokenizer, "python"),
                    RolloutConfig(group_size=3, max_new_tokens=12, max_episode_tokens=64,
                                  sampling=SamplingConfig(temperature=0.7, seed=0)))
    assert len(batch.trajectories) == 6
    for trajectory in batch.trajectories:
        ids = list(trajectory.prompt_ids) + list(trajectory.completion_ids)
        with torch.no_grad():
            logits = tiny_model(torch.tensor([ids])).logits[0, len(trajectory.prompt_ids) - 1:-1].float() / 0.7
        recomputed = torch.log_softmax(logits, -1).gather(-1, torch.tensor(trajectory.completion_ids)[:, None])[:, 0]
        mask = torch.tensor(trajectory.completion_mask, dtype=torch.bool)
        sampled = torch.tensor(trajectory.logprobs)
        assert mask.any()
        assert torch.allclose(sampled[mask], recomputed[mask], atol=1e-4)
        assert (sampled[~mask] == 0).all()


def test_a_prompt_longer_than_the_models_context_is_refused_before_generation(tokenizer, scripted):
    env = make_env("bfcl-lite", split="train")
    task = env.tasks()[0]
    backend = scripted(tokenizer, lambda context: "Done.")
    backend.context_tokens = 64  # far below the opening prompt
    batch = rollout(env, [task], backend, ChatRenderer(tokenizer, "python"), RolloutConfig(group_size=2))
    assert backend.calls == []  # the model never ran
    for trajectory in batch.trajectories:
        assert trajectory.score == 0.0 and trajectory.truncated
        assert any("refused before generation" in reason and "the model's is 64" in reason
                   for reason in trajectory.reasons)
    roomy = scripted(tokenizer, lambda context: "Done.")
    roomy.context_tokens = len(batch.trajectories[0].prompt_ids) + 3  # room for 3 tokens: the reply is cut there
    [cut] = rollout(env, [task], roomy, ChatRenderer(tokenizer, "python"), RolloutConfig(group_size=1)).trajectories
    assert len(cut.completion_ids) <= 3
