"""Each episode's KV cache kept across its replies: the reply after a tool result or a new user turn prefills only
the tokens added since the last reply, and what is sampled is what re-prefilling the whole context gives."""

from __future__ import annotations

import copy

import pytest

from coevolve.envs import make_env
from coevolve.policy.backends import SamplingConfig
from coevolve.policy.chat import ChatRenderer
from coevolve.policy.hf_backend import TransformersBackend
from coevolve.rollout import RolloutConfig, rollout
from conftest import trl_template
from test_rollout import multi_turn_tasks

# (architecture of the tiny model, chat template): SmolLM2's own is Llama's architecture with ChatML.
FAMILIES = [("llama", None), ("qwen2", "qwen2_5"), ("qwen3", "qwen3")]


def family_setup(tokenizer, family: str, template: str | None):
    from coevolve.policy.models import build_tiny_model

    local = copy.deepcopy(tokenizer)
    if template:
        local.chat_template = trl_template(template)
    return build_tiny_model(local, hidden_size=64, num_layers=2, seed=1, family=family), local


def paired_rollouts(model, tokenizer, env, tasks, config, reply_format="python"):
    """The same rollout with kept caches and with every context prefilled again; (kept, reprefilled, backends)."""
    kept = TransformersBackend(model, tokenizer, keep_cache=True)
    again = TransformersBackend(model, tokenizer, keep_cache=False)
    renderer = ChatRenderer(tokenizer, reply_format)
    first = rollout(env, tasks, kept, renderer, config)
    second = rollout(env, tasks, again, renderer, config)
    return first, second, kept, again


def assert_same(first, second):
    assert len(first.trajectories) == len(second.trajectories)
    for a, b in zip(first.trajectories, second.trajectories):
        assert a.completion_ids == b.completion_ids
        assert a.completion_mask == b.completion_mask
        assert a.reasons == b.reasons
        assert len(a.logprobs) == len(b.logprobs)
        assert max((abs(x - y) for x, y in zip(a.logprobs, b.logprobs)), default=0.0) < 1e-4


@pytest.mark.parametrize("family,template", FAMILIES)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_multi_turn_bfcl_samples_what_reprefilling_samples(tokenizer, family, template, temperature):
    """Multi-turn BFCL: every turn after the first is a new generate call over the episode's grown context."""
    model, local = family_setup(tokenizer, family, template)
    env = make_env("bfcl", category="base")
    config = RolloutConfig(group_size=2, max_new_tokens=6, max_episode_tokens=2048, max_turns=3,
                           sampling=SamplingConfig(temperature=temperature, seed=3))
    first, second, kept, again = paired_rollouts(model, local, env, multi_turn_tasks(2), config)
    assert first.generation_calls >= 3  # the later turns are what the kept cache serves
    assert_same(first, second)
    # Later calls run only the user turn and template tokens added since the last reply.
    assert kept.prefill_tokens < again.prefill_tokens / 2
    assert kept._kept is None  # freed when the rollout ends
    assert kept.kept_bytes_peak > 0


def test_an_episode_cut_by_max_episode_tokens(tokenizer):
    model, local = family_setup(tokenizer, "qwen2", "qwen2_5")
    env = make_env("bfcl", category="base")
    config = RolloutConfig(group_size=2, max_new_tokens=8, max_episode_tokens=40,
                           sampling=SamplingConfig(temperature=1.0, seed=5))
    first, second, _, _ = paired_rollouts(model, local, env, multi_turn_tasks(2), config)
    assert_same(first, second)
    assert any("max_episode_tokens" in reason for t in first.trajectories for reason in t.reasons)


def test_tool_results_then_a_second_reply(tokenizer, ls_policy_dir):
    """A policy that calls `ls()`: the reply after the tool result reuses the cache of the reply that called."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(ls_policy_dir).eval()
    env = make_env("bfcl-lite", split="train")
    config = RolloutConfig(group_size=4, max_new_tokens=16, max_replies_per_turn=3, max_episode_tokens=256,
                           sampling=SamplingConfig(temperature=1.0, seed=0))
    first, second, kept, again = paired_rollouts(model, tokenizer, env, env.tasks()[:3], config)
    assert_same(first, second)
    assert any(len(t.steps) >= 1 and sum(t.completion_mask) > len(t.completion_mask) // 4 for t in first.trajectories)
    assert first.generation_calls >= 2
    assert kept.prefill_tokens < again.prefill_tokens


def test_a_call_extending_the_last_prefills_only_the_new_tokens(tiny_model, tokenizer):
    backend = TransformersBackend(tiny_model, tokenizer)
    reference = TransformersBackend(tiny_model, tokenizer, keep_cache=False)
    prompts = [tokenizer(text)["input_ids"] for text in ("the first prompt of two", "and the second one, longer")]
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=5, seed=11)
    added = [tokenizer(" then more text")["input_ids"], tokenizer(" x")["input_ids"]]
    with backend.episode_caches():
        replies = backend.generate(prompts, sampling, [])
        grown = [p + list(r.token_ids) + a for p, r, a in zip(prompts, replies, added)]
        before = backend.prefill_tokens
        continued = backend.generate(grown, sampling, [])
        assert backend.prefill_tokens - before == sum(len(a) + 1 for a in added)  # + the last sampled token
        assert len(backend._kept) == 2  # only what the last call left
    assert backend._kept is None
    expected = reference.generate(grown, sampling, [])
    for a, b in zip(continued, expected):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4


def test_outside_a_rollout_nothing_is_kept(tiny_model, tokenizer):
    backend = TransformersBackend(tiny_model, tokenizer)
    prompt = tokenizer("a prompt")["input_ids"]
    reply = backend.generate([prompt], SamplingConfig(temperature=0, max_new_tokens=4), [])[0]
    before = backend.prefill_tokens
    backend.generate([prompt + list(reply.token_ids)], SamplingConfig(temperature=0, max_new_tokens=4), [])
    assert backend.prefill_tokens - before == len(prompt) + len(reply.token_ids)
    assert backend._kept is None


def test_rows_leaving_in_place_sample_exactly_what_a_new_room_samples(tiny_model, tokenizer):
    """Requests leaving the batch at different steps: the kept rows moved down inside the room give the very
    tokens and log-probabilities (bit for bit) that copying them into a new room gives, kept caches included."""
    prompts = [tokenizer(text)["input_ids"] for text in ("one", "a second prompt", "the third, longest prompt here",
                                                         "four", "one")]
    budgets = [2, 7, 4, 9, 1]  # every row leaves at its own step; the last two leave first and in the middle
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=9, seed=5)
    results = []
    for in_place in (True, False):
        backend = TransformersBackend(tiny_model, tokenizer, compact_in_place=in_place)
        with backend.episode_caches():
            first = backend.generate(prompts, sampling, [], budgets=budgets)
            grown = [p + list(g.token_ids) + tokenizer(" more")["input_ids"] for p, g in zip(prompts, first)]
            second = backend.generate(grown, sampling, [], budgets=list(reversed(budgets)))
        results.append([(g.token_ids, g.logprobs, g.finish_reason) for g in first + second])
    assert results[0] == results[1]
    assert [len(tokens) for tokens, _, _ in results[0][:5]] == budgets


def test_in_place_compaction_keeps_the_room_and_moves_only_later_rows(tiny_model, tokenizer):
    import torch

    backend = TransformersBackend(tiny_model, tokenizer)
    cache = backend._new_cache()
    layer = cache.layers[0]
    keys = torch.arange(4 * 2 * 3 * 2, dtype=torch.float32).reshape(4, 2, 3, 2)
    layer.update(keys, -keys)
    room = layer.key_room
    layer.batch_select_indices(torch.tensor([0, 2, 3]))
    assert layer.key_room is room  # no new room
    assert torch.equal(layer.keys, keys[[0, 2, 3]]) and torch.equal(layer.values, -keys[[0, 2, 3]])
    layer.update(keys[:3, :, :1], keys[:3, :, :1])  # the next token lands after the moved rows' slots
    assert layer.keys.shape == (3, 2, 4, 2) and torch.equal(layer.keys[:, :, 3], keys[:3, :, 0])
    layer.batch_select_indices(torch.tensor([1, 0]))  # not increasing: a new room, as transformers does it
    assert layer.key_room is not room and torch.equal(layer.keys[0, :, :3], keys[2])
