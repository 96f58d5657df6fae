"""The vLLM backend on a GPU host: greedy replies match the transformers backend on a tiny model saved locally.

Skipped, with the reason, where there is no CUDA GPU or no vllm package (vLLM is GPU-only and not pinned in our
CPU requirements). The missing-package message itself is checked on every machine."""

from __future__ import annotations

import importlib.util

import pytest

from coevolve.policy.backends import BackendUnavailable, SamplingConfig, VLLMBackend

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(HAS_VLLM, reason="vllm is installed here; the missing-package message cannot be shown")
def test_missing_vllm_names_the_fix(tokenizer):
    with pytest.raises(BackendUnavailable, match="pip install vllm"):
        VLLMBackend("unused", tokenizer)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_VLLM or not has_cuda(), reason="needs a CUDA GPU and the vllm package")
def test_vllm_greedy_matches_transformers(tmp_path, tokenizer):
    import torch

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
