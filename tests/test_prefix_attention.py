"""The split attention over a prefix held once: the same softmax as over the whole context, the same generations as
the prefix laid into every row, less held."""

from __future__ import annotations

import pytest
import torch

from coevolve.policy.backends import SamplingConfig
from coevolve.policy.hf_backend import MIN_SPLIT, TransformersBackend
from coevolve.policy.prefix_attention import ATTENTION_NAME, split_attention


def _reference(query, key, value, visible, scaling):
    """Softmax attention over [prefix ; own] written out: heads grouped onto key/value heads as repeat_kv does."""
    group = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
    scores = query @ key.transpose(-1, -2) * scaling
    scores = scores.masked_fill(~visible, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ value).transpose(1, 2)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("queries,masked", [(1, True), (1, False), (3, True), (3, False)])
def test_split_attention_is_the_softmax_over_the_whole_context(queries, masked, fused):
    torch.manual_seed(0)
    rows, heads, kv_heads, head_dim, prefix, own = 3, 4, 2, 8, 5, 6
    query = torch.randn(rows, heads, queries, head_dim)
    key, value = torch.randn(rows, kv_heads, own, head_dim), torch.randn(rows, kv_heads, own, head_dim)
    prefix_keys, prefix_values = torch.randn(kv_heads, prefix, head_dim), torch.randn(kv_heads, prefix, head_dim)
    causal = torch.ones(queries, own, dtype=torch.bool).tril(own - queries)
    mask = None
    own_visible = causal.expand(rows, 1, queries, own).clone()
    if masked:  # row 1 has two padding slots before its tokens (left padding, as the backend lays rows)
        own_visible[1, :, :, :2] = False
        mask = own_visible
    out = split_attention(query, key, value, mask, prefix_keys, prefix_values, scaling=0.3, fused=fused)
    whole_keys = torch.cat([prefix_keys.expand(rows, -1, -1, -1), key], dim=2)
    whole_values = torch.cat([prefix_values.expand(rows, -1, -1, -1), value], dim=2)
    visible = torch.cat([torch.ones(rows, 1, queries, prefix, dtype=torch.bool), own_visible], dim=-1)
    expected = _reference(query, whole_keys, whole_values, visible, 0.3)
    assert out.shape == (rows, queries, heads, head_dim)
    assert torch.allclose(out, expected, atol=1e-5)


@pytest.mark.parametrize("fused", [True, False])
def test_split_attention_by_hand(fused):
    """One head, one query, two prefix keys and one own key: weights exp(s) / sum exp(s) written out."""
    query = torch.tensor([[[[1.0, 0.0]]]])
    prefix_keys, prefix_values = torch.tensor([[[1.0, 0.0], [0.0, 0.0]]]), torch.tensor([[[2.0, 0.0], [0.0, 2.0]]])
    key, value = torch.tensor([[[[2.0, 0.0]]]]), torch.tensor([[[[0.0, 0.0]]]])
    out = split_attention(query, key, value, None, prefix_keys, prefix_values, scaling=1.0, fused=fused)
    e = torch.exp(torch.tensor([1.0, 0.0, 2.0]))  # scores 1, 0 (prefix) and 2 (own)
    weights = e / e.sum()
    assert torch.allclose(out[0, 0, 0], torch.tensor([2 * weights[0], 2 * weights[1]]), atol=1e-6)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    shared = tokenizer("Every request of this batch opens with the same long system prompt, tools and examples. "
                       "Then each adds its own question.")["input_ids"]
    assert len(shared) >= MIN_SPLIT
    tails = ["list the files", "make a folder called reports and enter it", "list the files", "x"]
    return [shared + tokenizer(tail)["input_ids"] for tail in tails]


def _episode(backend, prompts, tokenizer, sampling):
    """Two replies of each prompt's episode inside one `episode_caches` block, the second after a tool result."""
    with backend.episode_caches():
        first = backend.generate(prompts, sampling, [])
        later = [p + list(g.token_ids) + tokenizer(" -> ok.")["input_ids"] for p, g in zip(prompts, first)]
        second = backend.generate(later, sampling, [], budgets=[3, 6, 6, 2])
    return first + second


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_split_prefix_generates_what_the_prefix_in_every_row_does(tiny_model, tokenizer, prompts, temperature):
    sampling = SamplingConfig(temperature=temperature, max_new_tokens=6, seed=3)
    split = TransformersBackend(tiny_model, tokenizer)
    plain = TransformersBackend(tiny_model, tokenizer, split_prefix=False)
    assert split.split_prefix and not plain.split_prefix
    ours, theirs = _episode(split, prompts, tokenizer, sampling), _episode(plain, prompts, tokenizer, sampling)
    assert [g.token_ids for g in ours] == [g.token_ids for g in theirs]
    assert max(abs(a - b) for x, y in zip(ours, theirs) for a, b in zip(x.logprobs, y.logprobs)) < 1e-4
    assert split.prefill_tokens == plain.prefill_tokens  # the second call reused the kept caches and the prefix
    # The kept caches hold each row's own tokens only: the prefix is held once, not by each of the 3 prompts.
    assert split.kept_bytes_peak < plain.kept_bytes_peak
    assert tiny_model.config._attn_implementation == "sdpa"  # restored after every call


def test_split_attention_in_bfloat16_follows_float32():
    """Half precision takes the written-out path (softmax in float32) and returns its own dtype."""
    torch.manual_seed(2)
    query, key, value = torch.randn(2, 4, 1, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    prefix_keys, prefix_values = torch.randn(2, 7, 8), torch.randn(2, 7, 8)
    exact = split_attention(query, key, value, None, prefix_keys, prefix_values, scaling=0.35)
    half = split_attention(*(t.bfloat16() for t in (query, key, value)), None, prefix_keys.bfloat16(),
                           prefix_values.bfloat16(), scaling=0.35)
    assert half.dtype == torch.bfloat16
    assert torch.allclose(half.float(), exact, atol=5e-2)


@pytest.mark.parametrize("fused", [True, False])
def test_a_query_that_sees_none_of_its_rows_keys_takes_the_prefix_alone(fused):
    """A padding query before a row's first token: finite, and exactly attention over the prefix."""
    torch.manual_seed(1)
    query, key, value = torch.randn(2, 2, 2, 4), torch.randn(2, 1, 2, 4), torch.randn(2, 1, 2, 4)
    prefix_keys, prefix_values = torch.randn(1, 3, 4), torch.randn(1, 3, 4)
    mask = torch.ones(2, 1, 2, 2, dtype=torch.bool).tril()
    mask[1, :, :, 0] = False  # row 1: slot 0 is padding, so its first query sees nothing of its own
    out = split_attention(query, key, value, mask, prefix_keys, prefix_values, scaling=0.5, fused=fused)
    assert torch.isfinite(out).all()
    alone = torch.softmax(query[1, :, 0] @ prefix_keys[0].T * 0.5, dim=-1) @ prefix_values[0]
    assert torch.allclose(out[1, 0], alone, atol=1e-5)


def test_split_prefix_is_refused_where_prompts_share_little(tiny_model, tokenizer, prompts):
    backend = TransformersBackend(tiny_model, tokenizer)
    seen = []
    original = backend._forward

    def spy(*args, **kwargs):
        seen.append(backend._shared)
        return original(*args, **kwargs)

    backend._forward = spy
    backend.generate([prompts[0], tokenizer("an unrelated start")["input_ids"]], SamplingConfig(temperature=0), [])
    assert seen and all(shared is None for shared in seen)
    seen.clear()
    backend.generate(prompts, SamplingConfig(temperature=0, max_new_tokens=2), [])
    assert seen[0] is None and all(shared is not None for shared in seen[1:])  # the prefix's own run, then split


def test_the_models_attention_is_restored_after_an_error(tiny_model, tokenizer, prompts):
    backend = TransformersBackend(tiny_model, tokenizer)
    seen = []

    def failing(*args, **kwargs):
        seen.append(tiny_model.config._attn_implementation)
        raise RuntimeError("the forward failed")

    backend._forward = failing
    with pytest.raises(RuntimeError):
        backend.generate(prompts, SamplingConfig(temperature=0), [])
    assert seen == [ATTENTION_NAME] and tiny_model.config._attn_implementation == "sdpa"
    assert backend._shared is None


def test_split_prefix_is_off_for_attention_it_cannot_stand_in_for(tokenizer):
    from coevolve.policy.models import build_tiny_model

    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1)
    model.config.attn_logit_softcapping = 30.0  # a soft-capped softmax is not one plain softmax
    assert not TransformersBackend(model, tokenizer).split_prefix
