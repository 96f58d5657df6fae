"""The vLLM backend on a GPU host: greedy replies match the transformers backend on a tiny model saved locally.

Skipped, with the reason, where there is no CUDA GPU or no vllm package (vLLM is GPU-only and not pinned in our
CPU requirements). The missing-package message itself is checked on every machine."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from coevolve.policy.backends import BackendUnavailable, SamplingConfig, VLLMBackend

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def has_cuda() -> bool:
    return torch.cuda.is_available()


@pytest.mark.skipif(HAS_VLLM, reason="vllm is installed here; the missing-package message cannot be shown")
def test_missing_vllm_names_the_fix(tokenizer):
    with pytest.raises(BackendUnavailable, match="bench/gpu.sh --setup"):
        VLLMBackend("unused", tokenizer)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_VLLM or not has_cuda(), reason="needs a CUDA GPU and the vllm package")
def test_vllm_greedy_matches_transformers(tmp_path, tokenizer):
    from coevolve.policy.hf_backend import TransformersBackend
    from coevolve.policy.models import build_tiny_model

    model = build_tiny_model(tokenizer, hidden_size=128, num_layers=2)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    prompts = [tokenizer(text)["input_ids"] for text in ("List the files here.", "Make a folder named 'temp'.")]
    greedy = SamplingConfig(temperature=0, max_new_tokens=8)
    vllm_out = VLLMBackend(str(tmp_path), tokenizer, dtype="float32", gpu_memory_utilization=0.2).generate(
        prompts, greedy, [])
    hf_out = TransformersBackend(model.to("cuda"), tokenizer).generate(prompts, greedy, [])
    assert [g.token_ids for g in vllm_out] == [g.token_ids for g in hf_out]
    for a, b in zip(vllm_out, hf_out):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-3)


class FakeVLLMClient:
    """TRL's `VLLMClient.generate` contract: per prompt one completion, logprobs as [[top-1], ...] per token."""

    def __init__(self, stop: int) -> None:
        self.stop = stop
        self.requests: list[dict] = []

    def generate(self, prompts, n, temperature, top_p, top_k, max_tokens, logprobs, generation_kwargs):
        self.requests.append({"prompts": prompts, "max_tokens": max_tokens, **generation_kwargs})
        completions = []
        for prompt in prompts:
            body = [prompt[-1] + 1, prompt[-1] + 2, prompt[-1] + 3][:max_tokens]
            completions.append(body + [self.stop] if len(body) < max_tokens else body)
        return {"prompt_ids": prompts, "completion_ids": completions,
                "logprobs": [[[-0.25] for _ in c] for c in completions]}


def test_vllm_client_backend_groups_requests_by_budget(tokenizer):
    from coevolve.policy.backends import VLLMClientBackend

    client = FakeVLLMClient(stop=2)
    backend = VLLMClientBackend(client, tokenizer)
    out = backend.generate([[10], [20], [30]], SamplingConfig(max_new_tokens=8, seed=3), [2], budgets=[8, 2, 8])
    assert sorted(r["max_tokens"] for r in client.requests) == [2, 8]  # one request per distinct budget
    # No shared seed: one seed for a request would give the K copies of a prompt the same reply.
    assert all(r["stop_token_ids"] == [2] and "seed" not in r for r in client.requests)
    assert [g.token_ids for g in out] == [(11, 12, 13, 2), (21, 22), (31, 32, 33, 2)]  # the callers' order
    assert [g.finish_reason for g in out] == ["stop", "length", "stop"]
    assert out[0].logprobs == (-0.25,) * 4
    assert out[0].text == tokenizer.decode([11, 12, 13], skip_special_tokens=True)
