"""The loss our training path computes (our config -> TRL's GRPOTrainer, our rollouts, env rewards) against the
paper's J(theta) written out here by hand; zero advantages for uniform groups; no gradient through masked tokens."""

from __future__ import annotations

import math

import pytest
import torch

from coevolve.config import load_config
from coevolve.envs.bfcl_lite import BFCLLiteEnv
from coevolve.policy.chat import ChatRenderer
from coevolve.rollout import RolloutConfig
from coevolve.train import EnvRollouts, build_trainer
from conftest import ScriptedBackend
from support import ls_tasks

TEMPERATURE = 0.7
BETA = 0.05
EPS_LOW, EPS_HIGH = 0.2, 0.28
DELTA = 1e-4  # TRL's epsilon in the advantage denominator


def two_tasks():
    """An `ls()` task and a `cat` task (different queries, so a scripted reply can tell them apart)."""
    other = next(t for t in BFCLLiteEnv("train").tasks() if t.ground_truth[0][0].startswith("cat("))
    return [ls_tasks(1)[0], other]


def replies_by_task(tasks):
    """Task 0 (ls): ls, pwd, ls, pwd: a mixed group. Task 1 (cat): always pwd: every rollout fails, a uniform group.
    After a tool result, the reply ends the turn."""
    counter = {"ls": 0}
    ls_query = tasks[0].turns[0][0]["content"]

    def reply_for(context: str) -> str:
        if "[ls()]" in context or "[pwd()]" in context:
            return "Done."
        if ls_query in context:
            counter["ls"] += 1
            return "[ls()]" if counter["ls"] % 2 else "[pwd()]"
        return "[pwd()]"

    return reply_for


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_dir, tokenizer):
    tasks = two_tasks()
    config = load_config(None, [
        "rollout.group_size=4", "grpo.prompts_per_step=2", "grpo.micro_batch_size=8", f"grpo.beta={BETA}",
        f"grpo.epsilon_low={EPS_LOW}", f"grpo.epsilon_high={EPS_HIGH}", f"rollout.temperature={TEMPERATURE}",
        "rollout.max_new_tokens=16", "model.demos=0", "run.max_steps=1", "model.device=cpu",
    ])
    env = BFCLLiteEnv("train")
    renderer = ChatRenderer(tokenizer, "python")
    backend = ScriptedBackend(tokenizer, replies_by_task(tasks))
    rollouts = EnvRollouts(env, tasks, renderer, RolloutConfig(group_size=4, max_new_tokens=16), backend=backend)
    trainer = build_trainer(config, tmp_path_factory.mktemp("run"), str(tiny_dir), tokenizer, rollouts, tasks)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    inputs = trainer._generate_and_score_completions([{"prompt": task.id} for task in tasks for _ in range(4)])
    return trainer, rollouts, inputs


def direct_logps(model, inputs):
    """log pi_theta(token) of every completion token, from the model's plain logits at temperature T."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    width = inputs["completion_ids"].shape[1]
    logits = model(input_ids=ids, attention_mask=attention, logits_to_keep=width + 1).logits.double() / TEMPERATURE
    logps = torch.log_softmax(logits[:, :-1], dim=-1)
    return logps.gather(-1, inputs["completion_ids"][..., None]).squeeze(-1)


def paper_objective(logps, old_logps, ref_logps, scores, group_size, mask):
    """J(theta) = 1/sum_k|tau_k| sum_k sum_t min(r A, clip(r, 1-eps_low, 1+eps_high) A) - beta * KL, the KL per token
    by the k3 estimator, |tau_k| = model tokens; A_k = (R_k - mean R) / (std R + delta), std with Bessel's
    correction, per group of K. Written independently of TRL, in float64."""
    rewards = torch.tensor(scores, dtype=torch.float64).view(-1, group_size)
    advantages = (rewards - rewards.mean(dim=1, keepdim=True)) / (rewards.std(dim=1, keepdim=True) + DELTA)
    advantages = advantages.view(-1, 1)
    ratio = torch.exp(logps - old_logps)
    surrogate = torch.minimum(ratio * advantages, torch.clamp(ratio, 1 - EPS_LOW, 1 + EPS_HIGH) * advantages)
    kl = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
    tokens = mask.sum()
    return (surrogate * mask).sum() / tokens - BETA * (kl * mask).sum() / tokens, advantages.view(-1), ratio


def test_loss_equals_the_papers_objective(setup):
    trainer, rollouts, inputs = setup
    trajectories = rollouts.last.trajectories
    scores = [t.score for t in trajectories]
    assert scores[:4] == [1.0, 0.0, 1.0, 0.0] and scores[4:] == [0.0] * 4  # a mixed group and a uniform one

    # The mask TRL applies is ours: 1 exactly on the model's reply tokens, env/template tokens are 0.
    mask = (inputs["completion_mask"] * inputs["tool_mask"]).double()
    for row, trajectory in enumerate(trajectories):
        width = len(trajectory.completion_ids)
        assert mask[row, :width].tolist() == [float(m) for m in trajectory.completion_mask]
        assert mask[row, width:].sum() == 0
        assert 0 < sum(trajectory.completion_mask) < width  # env tokens are present and masked

    with torch.no_grad():
        logps = direct_logps(trainer.model, inputs)
    generator = torch.Generator().manual_seed(0)
    # pi_old and pi_ref differ from pi_theta by known offsets, wide enough that clipping bites on some tokens.
    old_logps = logps + torch.randn(logps.shape, generator=generator, dtype=torch.float64) * 0.4
    ref_logps = logps + torch.randn(logps.shape, generator=generator, dtype=torch.float64) * 0.3
    inputs = {**inputs, "old_per_token_logps": old_logps.float(), "ref_per_token_logps": ref_logps.float()}

    loss = trainer.compute_loss(trainer.model, inputs)
    objective, advantages, ratio = paper_objective(logps, old_logps, ref_logps, scores, 4, mask)

    assert torch.allclose(inputs["advantages"].double(), advantages, atol=1e-6)
    assert advantages[4:].abs().max() == 0  # the uniform group contributes no advantage
    outside = ((ratio < 1 - EPS_LOW) | (ratio > 1 + EPS_HIGH)) & (mask > 0) & (advantages.view(-1, 1) != 0)
    assert outside.sum() >= 5  # clipping is active on some tokens, not only in theory
    assert math.isfinite(loss.item())
    assert abs(loss.item() - (-objective.item())) < 1e-6


def test_uniform_groups_and_masked_tokens_carry_no_gradient(setup):
    trainer, rollouts, inputs = setup
    with torch.no_grad():
        logps = direct_logps(trainer.model, inputs).float()
    base = {**inputs, "old_per_token_logps": logps + 0.1, "ref_per_token_logps": logps - 0.1}
    env_positions = (inputs["completion_mask"] * inputs["tool_mask"]) == 0  # env tokens and padding

    model = trainer.model
    original = model.forward
    captured = {}

    def forward(*args, noise=None, **kwargs):
        out = original(*args, **kwargs)
        if kwargs.get("fused_lm_head"):
            if noise is not None:  # change what the model says at masked positions only
                width = noise.shape[1]
                out.log_probs = out.log_probs + torch.cat(
                    [torch.zeros_like(out.log_probs[:, :-width]), noise], dim=1)
            out.log_probs.retain_grad()
            captured["log_probs"] = out.log_probs
        return out

    def loss_with(noise):
        model.forward = lambda *a, **k: forward(*a, noise=noise, **k)
        try:
            model.zero_grad()
            loss = trainer.compute_loss(model, base)
            loss.backward()
        finally:
            model.forward = original
        return loss.item(), captured["log_probs"].grad

    clean_loss, grad = loss_with(None)
    width = inputs["completion_ids"].shape[1]
    completion_grad = grad[:, -width:]
    assert completion_grad[env_positions].abs().max() == 0  # no gradient reaches a masked token
    assert completion_grad[~env_positions].abs().max() > 0
    noise = torch.randn(env_positions.shape, generator=torch.Generator().manual_seed(1)) * 3 * env_positions
    noisy_loss, _ = loss_with(noise)
    assert noisy_loss == pytest.approx(clean_loss, abs=1e-7)  # perturbing masked positions changes nothing

    # The uniform group (rows 4..7, all scored 0) alone, with no KL: zero loss and zero gradient.
    uniform = {key: (value[4:] if torch.is_tensor(value) and value.dim() > 0 and value.shape[0] == 8 else value)
               for key, value in base.items()}
    uniform["num_items_in_batch"] = (uniform["completion_mask"] * uniform["tool_mask"]).sum()
    trainer.beta = 0.0
    try:
        model.zero_grad()
        loss = trainer.compute_loss(model, uniform)
        loss.backward()
    finally:
        trainer.beta = BETA
    assert loss.item() == 0.0
    assert all(p.grad is None or p.grad.abs().max() == 0 for p in model.parameters())


def test_cpu_compact_scoring_gives_the_same_logprobs(setup):
    import coevolve.train.grpo as train

    trainer, _, inputs = setup
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    width = inputs["completion_ids"].shape[1]
    results = []
    for compact in (True, False):
        train._compact_scoring_on_cpu(compact)  # what grpo.compact_scoring_on_cpu sets when the trainer is built
        try:
            with torch.no_grad():
                logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention, width)
        finally:
            train._compact_scoring_on_cpu(True)
        results.append(logps)
    assert torch.allclose(results[0], results[1], atol=1e-6)
