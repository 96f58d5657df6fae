"""The OpenAI-compatible backend: a real `openai` client over real HTTP to `coevolve serve`'s server on loopback.

The server runs in this process (threads) on an ephemeral port, backed by a tiny model or by a scripted token
backend (to get known tool calls); faults are injected with the server's `before_request` hook."""

from __future__ import annotations

import time

import pytest

from coevolve.envs import make_env
from coevolve.policy.backends import SamplingConfig
from coevolve.policy.chat import ChatRenderer
from coevolve.policy.hf_backend import TransformersBackend
from coevolve.policy.openai_backend import OpenAIBackend
from coevolve.policy.serve import ChatServer
from coevolve.rollout import RolloutConfig, rollout

from test_rollout import oracle_reply_for


def test_chat_against_a_tiny_model_server_batches_concurrent_requests(tiny_model, tokenizer):
    calls = []
    backend = TransformersBackend(tiny_model, tokenizer)
    original = backend.generate
    backend.generate = lambda prompts, *a, **k: calls.append(len(prompts)) or original(prompts, *a, **k)
    with ChatServer(backend, model_name="tiny", batch_window_seconds=0.2) as server:
        client = OpenAIBackend("tiny", base_url=server.base_url)
        assert client.client.models.list().data[0].id == "tiny"
        conversations = [[{"role": "user", "content": f"Say something about {topic}."}] for topic in "abcd"]
        replies = client.chat(conversations, [], SamplingConfig(temperature=1.0, max_new_tokens=8, seed=0))
    assert len(replies) == 4 and all(r.error is None and r.text for r in replies)
    assert all(r.finish_reason == "length" for r in replies)  # a random model does not stop by itself
    assert max(calls) > 1  # concurrent requests shared one generate call
    assert client.stats == {"requests": 4, "attempts": 4, "retries": 0, "failures": 0}


def test_native_tool_calls_over_http_solve_lite_tasks(tokenizer, scripted):
    env = make_env("bfcl-lite", split="train")
    tasks = env.tasks()[:3]
    oracle = oracle_reply_for(tasks, "hermes")

    def reply_for(context):
        # The server renders tool results as `tool` messages; after them the task is done.
        if "<|im_start|>tool" in context.rsplit("<|im_start|>assistant", 2)[-2][-400:]:
            return "Done."
        return oracle(context)

    with ChatServer(scripted(tokenizer, reply_for), model_name="scripted") as server:
        client = OpenAIBackend("scripted", base_url=server.base_url)
        renderer = ChatRenderer(None, "hermes")  # tools go to the endpoint, natively
        batch = rollout(env, tasks, client, renderer, RolloutConfig(group_size=2))
    assert [t.score for t in batch.trajectories] == [1.0] * 6, [t.reasons for t in batch.trajectories]
    assert all(t.steps and t.prompt_ids == () for t in batch.trajectories)  # chat backends keep no token record


def _faulty(plan):
    """before_request hook: answers the first requests from `plan` ('503', 'sleep', '400'), then lets them pass."""
    remaining = list(plan)

    def hook(path, body):
        if not remaining:
            return None
        fault = remaining.pop(0)
        if fault == "sleep":
            time.sleep(1.5)
            return 200, {"error": "too late"}
        return int(fault), {"error": {"message": f"injected {fault}"}}

    return hook


def test_retries_with_backoff_then_success(tiny_model, tokenizer):
    with ChatServer(TransformersBackend(tiny_model, tokenizer), before_request=_faulty(["503", "503"])) as server:
        client = OpenAIBackend("local", base_url=server.base_url, backoff_seconds=0.05, max_retries=3)
        reply = client.complete([{"role": "user", "content": "hi"}], [], SamplingConfig(max_new_tokens=3))
    assert reply.error is None and client.stats["retries"] == 2 and client.stats["failures"] == 0


@pytest.mark.parametrize("plan, expected, attempts", [
    (["503"] * 5, "gave up after 3 attempts", 3),
    (["sleep"] * 5, "gave up after 3 attempts: APITimeoutError", 3),
    (["400"], "HTTP 400", 1),
])
def test_endpoint_trouble_ends_the_episode_with_a_reason(tiny_model, tokenizer, plan, expected, attempts):
    env = make_env("bfcl-lite", split="train")
    with ChatServer(TransformersBackend(tiny_model, tokenizer), before_request=_faulty(plan)) as server:
        client = OpenAIBackend("local", base_url=server.base_url, backoff_seconds=0.01, max_retries=2, timeout=0.5)
        batch = rollout(env, env.tasks()[:1], client, ChatRenderer(None, "python"), RolloutConfig(group_size=1))
    trajectory = batch.trajectories[0]
    assert trajectory.score == 0.0 and any(expected in reason for reason in trajectory.reasons)
    assert client.stats["attempts"] == attempts and client.stats["failures"] == 1
