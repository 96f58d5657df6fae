"""The transformers backend: the shared prefill changes nothing but the work done."""

from __future__ import annotations

import pytest
import torch

from coevolve.policy.backends import SamplingConfig
from coevolve.policy.hf_backend import TransformersBackend, common_prefix_length


@pytest.fixture(scope="module")
def prompts(tokenizer):
    shared = tokenizer("A long shared system prompt that every request of the batch starts with. ")["input_ids"]
    tails = ["hello there", "a much longer suffix with many more tokens in it than the others", "hello there", "x"]
    return [shared + tokenizer(tail)["input_ids"] for tail in tails]


def test_common_prefix_length():
    assert common_prefix_length([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix_length([[5], [6]]) == 0
    assert common_prefix_length([]) == 0


@pytest.mark.parametrize("with_odd_one", [False, True])
def test_shared_prefill_matches_separate_rows_and_generate(tiny_model, tokenizer, prompts, with_odd_one):
    batch = prompts + ([tokenizer("completely different start")["input_ids"]] if with_odd_one else [])
    greedy = SamplingConfig(temperature=0, max_new_tokens=10)
    shared = TransformersBackend(tiny_model, tokenizer, share_prefill=True).generate(batch, greedy, [])
    separate = TransformersBackend(tiny_model, tokenizer, share_prefill=False).generate(batch, greedy, [])
    for prompt, a, b in zip(batch, shared, separate):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
        reference = tiny_model.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False,
                                        pad_token_id=tokenizer.pad_token_id, eos_token_id=None)
        assert list(a.token_ids) == reference[0, len(prompt):].tolist()


def test_k_copies_are_prefilled_once(tiny_model, tokenizer, prompts):
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=4, seed=0)
    shared = TransformersBackend(tiny_model, tokenizer)
    separate = TransformersBackend(tiny_model, tokenizer, share_prefill=False)
    group = [prompts[1]] * 8
    shared.generate(group, sampling, [])
    separate.generate(group, sampling, [])
    assert shared.prefill_tokens == len(prompts[1])
    assert separate.prefill_tokens == 8 * len(prompts[1])


def test_sampling_is_seeded_and_logprobs_are_the_tempered_distribution(tiny_model, tokenizer, prompts):
    backend = TransformersBackend(tiny_model, tokenizer)
    sampling = SamplingConfig(temperature=0.8, max_new_tokens=6, seed=7)
    first = backend.generate([prompts[0]] * 4, sampling, [])
    again = backend.generate([prompts[0]] * 4, sampling, [])
    other = backend.generate([prompts[0]] * 4, SamplingConfig(temperature=0.8, max_new_tokens=6, seed=8), [])
    assert [g.token_ids for g in first] == [g.token_ids for g in again]
    assert [g.token_ids for g in first] != [g.token_ids for g in other]
    assert len({g.token_ids for g in first}) > 1  # the K samples differ
    generation = first[0]
    ids = prompts[0] + list(generation.token_ids)
    with torch.no_grad():
        logits = tiny_model(torch.tensor([ids])).logits[0, len(prompts[0]) - 1:-1] / 0.8
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(generation.token_ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(generation.logprobs), expected, atol=1e-4)


def test_top_k_one_is_greedy(tiny_model, tokenizer, prompts):
    backend = TransformersBackend(tiny_model, tokenizer)
    greedy = backend.generate(prompts, SamplingConfig(temperature=0, max_new_tokens=5), [])
    top1 = backend.generate(prompts, SamplingConfig(temperature=1.0, top_k=1, max_new_tokens=5, seed=1), [])
    nucleus = backend.generate(prompts, SamplingConfig(temperature=1.0, top_p=1e-6, max_new_tokens=5, seed=2), [])
    assert [g.token_ids for g in greedy] == [g.token_ids for g in top1] == [g.token_ids for g in nucleus]


def test_stop_tokens_and_per_row_budgets(tiny_model, tokenizer, prompts):
    backend = TransformersBackend(tiny_model, tokenizer)
    greedy = SamplingConfig(temperature=0, max_new_tokens=8)
    free = backend.generate(prompts, greedy, [])
    stop = free[0].token_ids[2]
    first = free[0].token_ids.index(stop)
    stopped = backend.generate(prompts, greedy, [stop])
    assert stopped[0].token_ids == free[0].token_ids[:first + 1] and stopped[0].finish_reason == "stop"
    assert stopped[0].text == tokenizer.decode(free[0].token_ids[:first], skip_special_tokens=True)
    budgeted = backend.generate(prompts, greedy, [], budgets=[1, 3, 8, 2])
    assert [len(g.token_ids) for g in budgeted] == [1, 3, 8, 2]
    assert all(g.finish_reason == "length" for g in budgeted)
    assert [g.token_ids for g in budgeted] == [f.token_ids[:n] for f, n in zip(free, [1, 3, 8, 2])]


def test_cache_keyword_follows_the_installed_transformers_name():
    from coevolve.policy.hf_backend import cache_keyword

    class Old:  # transformers <= 5.20 (the GPU hosts' pin)
        def forward(self, input_ids=None, past_key_values=None, use_cache=None): ...

    class New:  # transformers 5.24 (our CPU pin)
        def forward(self, input_ids=None, cache=None, use_cache=None): ...

    class PeftWrapper:
        def __init__(self, base):
            self.base = base

        def forward(self, *args, **kwargs): ...

        def get_base_model(self):
            return self.base

    assert cache_keyword(Old()) == "past_key_values" and cache_keyword(New()) == "cache"
    assert cache_keyword(PeftWrapper(Old())) == "past_key_values"
