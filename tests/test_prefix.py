"""Shared-prompt scoring: the same log-probabilities, entropies and gradients as TRL's per-row path."""

from __future__ import annotations

import contextlib
import json
from types import SimpleNamespace

import pytest
import torch

from coevolve.prefix import shared_prefix_length, shared_prefix_logps


def fused_tiny_model(tokenizer, seed: int = 0):
    from trl.trainer.utils import add_fused_lm_head

    from coevolve.policy.models import build_tiny_model

    model = build_tiny_model(tokenizer, hidden_size=64, num_layers=2, seed=seed)
    add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))
    model.train()
    return model


def batch(pad: int = 0):
    """Rows as TRL lays them out: left-padded prompts that share 40 tokens then differ in their own tail, and
    right-padded completions (the last column of row 2 is padding)."""
    generator = torch.Generator().manual_seed(0)
    shared = torch.randint(5, 1000, (40,), generator=generator).tolist()
    tails = [[11, 12, 13], [21, 22, 23, 24, 25, 26], [31], [41, 42, 43, 44]]
    completions = [[101, 102, 103, 104], [111, 112, 113, 114], [121, 122, 123, pad], [131, 132, 133, 134]]
    width = max(len(shared) + len(tail) for tail in tails)
    ids, mask = [], []
    for tail, completion in zip(tails, completions):
        prompt = shared + tail
        padding = width - len(prompt)
        ids.append([pad] * padding + prompt + completion)
        mask.append([0] * padding + [1] * len(prompt) + [int(token != pad) for token in completion])
    return torch.tensor(ids), torch.tensor(mask), 4


def trl_scores(model, ids, mask, keep):
    from trl import GRPOTrainer

    owner = SimpleNamespace(accelerator=SimpleNamespace(autocast=contextlib.nullcontext, is_main_process=True))
    logps, entropies, _ = GRPOTrainer._get_per_token_logps_and_entropies(owner, model, ids, mask, keep,
                                                                         compute_entropy=True)
    return logps, entropies


def test_shared_prefix_length_stops_where_rows_differ_and_keeps_the_last_prompt_token():
    ids, mask, keep = batch()
    assert shared_prefix_length(ids, mask, ids.size(1) - keep) == 40
    # One row only: everything but its last prompt token is "shared".
    assert shared_prefix_length(ids[2:3], mask[2:3], ids.size(1) - keep) == 40
    # A row whose first token differs: nothing is shared.
    other = ids.clone()
    other[1, (mask[1] == 1).nonzero()[0, 0]] = 999_999 % 1000
    assert shared_prefix_length(other, mask, ids.size(1) - keep) == 0


@pytest.mark.parametrize("padding_columns", [0, 3])
def test_same_logprobs_entropies_and_gradients_as_trl(tokenizer, padding_columns):
    """With `padding_columns`, the completions end in columns no row has a token in (TRL pads every completion to
    the generation batch's longest): those are not run and score 0."""
    ids, mask, keep = batch()
    ids = torch.nn.functional.pad(ids, (0, padding_columns))
    mask = torch.nn.functional.pad(mask, (0, padding_columns))
    keep += padding_columns
    shared = shared_prefix_length(ids, mask, ids.size(1) - keep)
    reference_model, model = fused_tiny_model(tokenizer), fused_tiny_model(tokenizer)

    expected_logps, expected_entropies = trl_scores(reference_model, ids, mask, keep)
    logps, entropies = shared_prefix_logps(model, ids, mask, keep, shared, True, contextlib.nullcontext)
    completion_mask = mask[:, -keep:].bool()
    assert logps.shape == expected_logps.shape == (4, keep)
    assert torch.allclose(logps[completion_mask], expected_logps[completion_mask], atol=1e-5)
    assert torch.allclose(entropies[completion_mask], expected_entropies[completion_mask], atol=1e-5)
    if padding_columns:
        assert not logps[:, -padding_columns:].any() and not entropies[:, -padding_columns:].any()

    # A loss like GRPO's (advantage-weighted log-probabilities of the model tokens): same gradient everywhere.
    advantages = torch.tensor([1.0, -0.5, 0.25, -0.75])[:, None]
    (expected_logps * advantages * completion_mask).sum().backward()
    (logps * advantages * completion_mask).sum().backward()
    for (name, expected), (_, got) in zip(reference_model.named_parameters(), model.named_parameters()):
        assert torch.allclose(got.grad, expected.grad, atol=1e-5, rtol=1e-4), name


def test_step_prefix_across_micro_batches_gives_trls_gradient(tokenizer):
    """Two micro-batches of two rows each: the 40 tokens all four rows share run once, as leaves, and one backward
    after the second micro-batch brings the weights' gradient to what TRL's per-row path accumulates."""
    from coevolve.prefix import StepPrefix, step_prefix_of

    ids, mask, keep = batch()
    prompt_width = ids.size(1) - keep
    step = step_prefix_of(ids[:, :prompt_width], mask[:, :prompt_width])
    assert isinstance(step, StepPrefix) and len(step) == 40
    reference_model, model = fused_tiny_model(tokenizer), fused_tiny_model(tokenizer)
    advantages = torch.tensor([1.0, -0.5, 0.25, -0.75])[:, None]
    completion_mask = mask[:, -keep:].bool()
    calls = []
    model.register_forward_pre_hook(lambda module, args, kwargs: calls.append(kwargs["input_ids"].shape),
                                    with_kwargs=True)
    for rows in (slice(0, 2), slice(2, 4)):
        expected, _ = trl_scores(reference_model, ids[rows], mask[rows], keep)
        (expected * advantages[rows] * completion_mask[rows]).sum().backward()
        chunk_ids, chunk_mask = ids[rows], mask[rows]
        shared = shared_prefix_length(chunk_ids, chunk_mask, prompt_width)
        logps, _ = shared_prefix_logps(model, chunk_ids, chunk_mask, keep, shared, False, contextlib.nullcontext,
                                       step_prefix=(step, 7))
        assert torch.allclose(logps[completion_mask[rows]], expected[completion_mask[rows]], atol=1e-5)
        (logps * advantages[rows] * completion_mask[rows]).sum().backward()
    # The prefix ran once (40 tokens, batch of one); the micro-batches' own calls never rerun it.
    assert [shape for shape in calls if shape[1] == 40] == [torch.Size([1, 40])]
    step.backward()
    for (name, expected), (_, got) in zip(reference_model.named_parameters(), model.named_parameters()):
        assert torch.allclose(got.grad, expected.grad, atol=1e-5, rtol=1e-4), name
    # A prefix whose tokens the rows do not start with is not used: the chunk scores on its own.
    other = StepPrefix([1] * 40)
    calls.clear()
    shared_prefix_logps(model, ids[:2], mask[:2], keep, 40, False, contextlib.nullcontext, step_prefix=(other, 7))
    assert calls[0] == torch.Size([1, 40]) and not other._leaves


def test_training_takes_both_shortcuts_and_learns_what_trl_alone_learns(tmp_path, ls_policy_dir, monkeypatch):
    """Real GRPO steps through the trainer: shared-prefix scoring runs, flat micro-batches (every advantage zero)
    are skipped, and the weights after three steps are the ones TRL's plain path gives (`grpo.shared_prefix=false`
    and the skip switched off)."""
    import coevolve.prefix as prefix
    from coevolve.loop import run
    from support import ls_tasks, write_tasks

    calls = []
    original = prefix.shared_prefix_logps

    def counting(*args, **kwargs):
        calls.append(args[4])  # the shared prefix length
        return original(*args, **kwargs)

    monkeypatch.setattr(prefix, "shared_prefix_logps", counting)
    step_runs = []  # the step prefix's forward: once per optimizer step that trains
    original_keys_values = prefix.StepPrefix.keys_values

    def counting_keys_values(self, model, autocast, step):
        step_runs.append((step, len(self), bool(self._leaves) and self._step == step))
        return original_keys_values(self, model, autocast, step)

    monkeypatch.setattr(prefix.StepPrefix, "keys_values", counting_keys_values)
    tasks_file = write_tasks(ls_tasks(4), tmp_path / "tasks.jsonl")
    common = [f"model.name={ls_policy_dir}", "model.demos=0", "model.device=cpu", f"env.tasks_file={tasks_file}",
              "rollout.group_size=4", "rollout.max_new_tokens=8", "rollout.max_replies_per_turn=1",
              "rollout.max_episode_tokens=32", "rollout.temperature=1.0", "grpo.prompts_per_step=2",
              "grpo.learning_rate=1e-3", "run.max_steps=3", "run.seed=1", "loop.eval_limit=2",
              "loop.eval_every=0"]
    run(None, common, str(tmp_path / "fast"))
    steps = [json.loads(line) for line in (tmp_path / "fast" / "steps.jsonl").read_text().splitlines()]
    assert calls and min(calls) >= prefix.MIN_SHARED_TOKENS
    assert any(step["skipped_flat_micro_batches"] > 0 for step in steps)
    assert any(step["skipped_flat_micro_batches"] < 1 and step["grad_norm"] > 0 for step in steps)
    # Each trained step ran its shared prefix once: a second micro-batch of the step found its leaves.
    assert step_runs and min(length for _, length, _ in step_runs) >= prefix.MIN_SHARED_TOKENS
    first_uses = [step for step, _, reused in step_runs if not reused]
    assert len(first_uses) == len(set(first_uses))

    calls.clear()
    step_runs.clear()
    run(None, [*common, "grpo.shared_step_prefix=false"], str(tmp_path / "groups"))
    assert calls and not step_runs
    groups = weights(tmp_path / "groups" / "final")
    calls.clear()
    run(None, [*common, "grpo.shared_prefix=false", "grpo.skip_flat_micro_batches=false"], str(tmp_path / "plain"))
    plain = [json.loads(line) for line in (tmp_path / "plain" / "steps.jsonl").read_text().splitlines()]
    assert calls == [] and all(step["skipped_flat_micro_batches"] == 0 for step in plain)
    assert [s["rollout/success_rate"] for s in plain] == [s["rollout/success_rate"] for s in steps]
    fast_weights, plain_weights = weights(tmp_path / "fast" / "final"), weights(tmp_path / "plain" / "final")
    for name, value in plain_weights.items():
        assert torch.allclose(fast_weights[name], value, atol=1e-5), name
        assert torch.allclose(groups[name], value, atol=1e-5), name


def weights(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_flat_groups_go_last_and_stay_whole():
    from coevolve.prefix import flat_groups_last

    # Three groups of 2: (0.5, -0.5) has a signal, (0, 0) is flat, (0, 1e-3) has a signal.
    assert flat_groups_last([0.5, -0.5, 0.0, 0.0, 0.0, 1e-3], 2) == [0, 1, 4, 5, 2, 3]
    assert flat_groups_last(torch.tensor([0.0, 0.0, 1.0, -1.0]), 2) == [2, 3, 0, 1]
    assert flat_groups_last([0.0, 0.0, 0.0], 2) == [0, 1, 2]  # not whole groups: left alone


def _two_layers(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    model[0].bias.requires_grad_(False)  # a frozen weight keeps no gradient either way
    return model


def _step(model, flat_loss, signal_first: bool):
    """One AdamW step (weight decay on) over micro-batches: one with a signal then a flat one, or a flat one only."""
    optimizer = torch.optim.AdamW([w for w in model.parameters() if w.requires_grad], lr=0.1, weight_decay=0.5)
    for _ in range(2):
        if signal_first:
            model(torch.linspace(-1, 1, 12).view(2, 6)).square().sum().backward()
        flat_loss(model).backward()
        grads = [None if w.grad is None else w.grad.clone() for w in model.parameters()]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return grads, [w.detach().clone() for w in model.parameters()], optimizer.state_dict()["state"]


def test_a_flat_micro_batch_leaves_the_gradients_and_the_step_the_autograd_zero_gives():
    """`zero_gradient_loss` against the loss it replaced, `sum((w * 0).sum())`: the same gradients (zero where no
    micro-batch had a signal, untouched where one had), the same weights and AdamW moments after two steps, and a
    frozen weight without a gradient."""
    from coevolve.prefix import zero_gradient_loss

    def autograd_zero(model):
        return sum((weight * 0).sum() for weight in model.parameters() if weight.requires_grad)

    for signal_first in (True, False):
        old_grads, old_weights, old_state = _step(_two_layers(3), autograd_zero, signal_first)
        new_grads, new_weights, new_state = _step(_two_layers(3), zero_gradient_loss, signal_first)
        assert old_grads[1] is None and new_grads[1] is None
        for old, new in zip(old_grads, new_grads):
            assert (old is None) == (new is None) and (old is None or torch.equal(old, new))
        assert any(g is not None and bool(g.ne(0).any()) for g in new_grads) == signal_first
        for old, new in zip(old_weights, new_weights):
            assert torch.equal(old, new)
        assert old_state.keys() == new_state.keys()
        for key in old_state:
            for name in ("exp_avg", "exp_avg_sq"):
                assert torch.equal(old_state[key][name], new_state[key][name])
    assert zero_gradient_loss(_two_layers(0)).item() == 0.0
