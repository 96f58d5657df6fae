"""fp32 master weights for a bf16 model: updates below the bf16 spacing accumulate, and a checkpoint resumes them."""

from __future__ import annotations

import pytest
import torch

from coevolve.master_weights import MASTERS, MasterWeightAdamW, with_master_weights


def bf16_params():
    torch.manual_seed(0)
    weight = torch.nn.Parameter((torch.randn(8, 8) * 0.03).to(torch.bfloat16))
    bias = torch.nn.Parameter(torch.full((8,), 0.5, dtype=torch.bfloat16))
    return [weight, bias]


def gradients(step: int):
    generator = torch.Generator().manual_seed(step)
    return [torch.randn(8, 8, generator=generator).to(torch.bfloat16),
            torch.randn(8, generator=generator).to(torch.bfloat16)]


def run_steps(optimizer, params, steps):
    for step in steps:
        for param, grad in zip(params, gradients(step)):
            param.grad = grad.clone()
        optimizer.step()
        optimizer.zero_grad()


def test_small_updates_accumulate_where_plain_bf16_loses_them():
    """lr 1e-5: an AdamW step moves a weight by ~1e-5, below half the bf16 spacing at 0.5 (2^-9 = 0.002)."""
    plain = bf16_params()
    run_steps(torch.optim.AdamW(plain, lr=1e-5, weight_decay=0.0), plain, range(20))
    assert torch.equal(plain[1], torch.full((8,), 0.5, dtype=torch.bfloat16))  # every update rounded away

    params = bf16_params()
    optimizer = MasterWeightAdamW([{"params": params}], lr=1e-5, weight_decay=0.0)
    run_steps(optimizer, params, range(20))
    reference = [torch.nn.Parameter(p.detach().float()) for p in bf16_params()]
    fp32 = torch.optim.AdamW(reference, lr=1e-5, weight_decay=0.0)
    for step in range(20):  # the same bf16 gradients, widened, on fp32 weights: the masters match exactly
        for param, grad in zip(reference, gradients(step)):
            param.grad = grad.float()
        fp32.step()
    assert all(torch.equal(master, ref) for master, ref in zip(optimizer.masters, reference))
    assert not torch.equal(optimizer.masters[1], torch.full((8,), 0.5))  # the bias moved by ~20 x 1e-5
    assert all(torch.equal(p, m.to(torch.bfloat16)) for p, m in zip(params, optimizer.masters))


def test_a_saved_state_resumes_exactly():
    params = bf16_params()
    whole = MasterWeightAdamW([{"params": params, "weight_decay": 0.1}], lr=1e-3)
    run_steps(whole, params, range(6))

    first = bf16_params()
    half = MasterWeightAdamW([{"params": first, "weight_decay": 0.1}], lr=1e-3)
    run_steps(half, first, range(3))
    saved = half.state_dict()
    assert len(saved[MASTERS]) == 2 and saved[MASTERS][0].dtype == torch.float32
    fresh = [torch.nn.Parameter(p.detach().clone()) for p in first]  # the model as a checkpoint holds it (bf16)
    resumed = MasterWeightAdamW([{"params": fresh, "weight_decay": 0.1}], lr=1e-3)
    resumed.load_state_dict(saved)
    run_steps(resumed, fresh, range(3, 6))
    assert all(torch.equal(a, b) for a, b in zip(fresh, params))
    assert all(torch.equal(a, b) for a, b in zip(resumed.masters, whole.masters))


def test_groups_and_options_carry_over_and_other_optimizers_are_refused():
    params = bf16_params()
    adamw = torch.optim.AdamW([{"params": [params[0]], "weight_decay": 0.01}, {"params": [params[1]],
                               "weight_decay": 0.0}], lr=3e-4, betas=(0.9, 0.95), eps=1e-6)
    wrapped = with_master_weights(adamw)
    assert [g["weight_decay"] for g in wrapped.param_groups] == [0.01, 0.0]
    assert wrapped.defaults["lr"] == 3e-4 and wrapped.defaults["betas"] == (0.9, 0.95)
    assert wrapped.model_params == params
    with pytest.raises(TypeError, match="AdamW"):
        with_master_weights(torch.optim.SGD(params, lr=0.1))
