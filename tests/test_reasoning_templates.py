"""Models whose chat templates rewrite history (Qwen3 and its kin): multi-turn episodes on the templates TRL ships,
with scripted replies (known texts) and with tiny random models of the matching architectures. What the trainer
scores is what was sampled, token for token, and the masks are 1 exactly on the model's tokens."""

from __future__ import annotations

import pytest

from coevolve.config import ConfigError, load_config
from coevolve.envs import make_env
from coevolve.policy.backends import SamplingConfig
from coevolve.policy.chat import ChatRenderer
from coevolve.rollout import RolloutConfig, rollout
from conftest import trl_template
from test_rollout import END, multi_turn_tasks, oracle_reply_for

THOUGHT = "<think>\nThe user wants this done; I will call the tools.\n</think>\n\n"


def qwen3_tokenizer(tokenizer):
    import copy

    qwen3 = copy.deepcopy(tokenizer)  # the SmolLM2 tokenizer: the same ChatML tokens as Qwen's
    qwen3.chat_template = trl_template("qwen3")
    return qwen3


def model_runs(trajectory, tokenizer) -> list[tuple[int, str]]:
    """The completion as (mask, text) runs."""
    ids, mask, runs, start = trajectory.completion_ids, trajectory.completion_mask, [], 0
    for position in range(1, len(ids) + 1):
        if position == len(ids) or mask[position] != mask[start]:
            runs.append((mask[start], tokenizer.decode(ids[start:position])))
            start = position
    return runs


def test_qwen3_keeps_the_sampled_reasoning_and_masks_only_the_models_tokens(tokenizer, scripted):
    """Qwen3's template writes an empty think block into the last assistant message only; with `keep` the model's
    own think block stays in the stream as sampled, the tool results follow it, and multi-turn BFCL is solved."""
    qwen3 = qwen3_tokenizer(tokenizer)
    env = make_env("bfcl", category="base")
    tasks = multi_turn_tasks(2)
    oracle = oracle_reply_for(tasks, "hermes")
    replies: list[str] = []

    def thinking(context: str) -> str:
        reply = oracle(context.replace(THOUGHT, ""))
        replies.append(THOUGHT + reply)
        return replies[-1]

    renderer = ChatRenderer(qwen3, "hermes", reasoning="keep")
    batch = rollout(env, tasks, scripted(qwen3, thinking), renderer,
                    RolloutConfig(group_size=1, max_episode_tokens=20000, max_new_tokens=512))
    for trajectory, task in zip(batch.trajectories, tasks):
        assert trajectory.score == 1.0, trajectory.reasons
        runs = model_runs(trajectory, qwen3)
        model = [text for flag, text in runs if flag == 1]
        between = "".join(text for flag, text in runs if flag == 0)
        assert all(text.endswith(END) and text[: -len(END)] in replies for text in model)  # as sampled
        assert all(text.startswith(THOUGHT) for text in model)
        assert THOUGHT not in between and "<think>" not in between  # no think block the model did not write
        assert all(step.observation in between for step in trajectory.steps)
        assert all(m["content"] in between for turn in task.turns[1:] for m in turn)


def test_qwen3_with_reasoning_off_puts_the_empty_think_block_in_the_prompt_not_in_the_models_tokens(
        tokenizer, scripted):
    qwen3 = qwen3_tokenizer(tokenizer)
    env = make_env("bfcl", category="base")
    tasks = multi_turn_tasks(1)
    renderer = ChatRenderer(qwen3, "hermes", reasoning="off")
    batch = rollout(env, tasks, scripted(qwen3, oracle_reply_for(tasks, "hermes")), renderer,
                    RolloutConfig(group_size=1, max_episode_tokens=20000, max_new_tokens=512))
    [trajectory] = batch.trajectories
    assert trajectory.score == 1.0, trajectory.reasons
    assert qwen3.decode(trajectory.prompt_ids).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    runs = model_runs(trajectory, qwen3)
    assert all("<think>" not in text for flag, text in runs if flag == 1)
    assert all(text.endswith("assistant\n<think>\n\n</think>\n\n") for flag, text in runs if flag == 0)


def test_a_call_written_while_thinking_is_not_a_call():
    from coevolve.policy.replies import split_reply

    reply = split_reply("<think>maybe [rm(file_name='all')] first?</think>\n[ls()]", "python")
    assert reply.call_texts == ("ls()",)
    assert split_reply("<think>I will call <tool_call>{\"name\": \"rm\"}</tool_call>", "hermes").call_texts == ()


def test_strip_is_refused_with_the_settings_that_work():
    with pytest.raises(ConfigError, match=r"model\.reasoning: .*use keep .* or off"):
        load_config(None, ["model.reasoning=strip"])


@pytest.mark.parametrize("family, template", [("qwen3", "qwen3"), ("qwen2", "qwen2_5"), ("llama", "llama3_2")])
def test_tiny_models_of_each_architecture_score_exactly_what_they_sampled(family, template, tokenizer):
    """A random tiny model of the architecture, with the template TRL ships for it: multi-turn BFCL episodes, and
    the log-probabilities of every masked-in token recomputed from the whole sequence equal the sampled ones."""
    import copy

    import torch

    from coevolve.policy.hf_backend import TransformersBackend
    from coevolve.policy.models import build_tiny_model

    templated = copy.deepcopy(tokenizer)
    templated.chat_template = trl_template(template)
    model = build_tiny_model(templated, hidden_size=64, num_layers=2, seed=0, family=family)
    assert type(model).__name__.lower().startswith(family)
    env = make_env("bfcl", category="base")
    tasks = multi_turn_tasks(1)
    batch = rollout(env, tasks, TransformersBackend(model, templated), ChatRenderer(templated, "hermes"),
                    RolloutConfig(group_size=2, max_new_tokens=12, max_replies_per_turn=2, max_episode_tokens=400,
                                  sampling=SamplingConfig(temperature=1.0, seed=0)))
    for trajectory in batch.trajectories:
        ids = list(trajectory.prompt_ids) + list(trajectory.completion_ids)
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, len(trajectory.prompt_ids) - 1:-1].float()
        recomputed = torch.log_softmax(logits, -1).gather(-1, torch.tensor(trajectory.completion_ids)[:, None])[:, 0]
        mask = torch.tensor(trajectory.completion_mask, dtype=torch.bool)
        sampled = torch.tensor(trajectory.logprobs)
        assert mask.any() and (~mask).any()  # replies and what the template and env put between them
        assert torch.allclose(sampled[mask], recomputed[mask], atol=1e-4)
        assert (sampled[~mask] == 0).all()


def test_eval_of_a_qwen3_model_with_qwen3s_template_runs(tmp_path, tokenizer, capsys):
    """The reported failure: `coevolve eval --env bfcl --policy model:DIR --format hermes` on a Qwen3-architecture
    model saved with Qwen3's template ended in a TemplateError traceback."""
    import json

    from coevolve.cli import main
    from coevolve.policy.models import build_tiny_model
    from support import save_model

    qwen3 = qwen3_tokenizer(tokenizer)
    folder = save_model(build_tiny_model(qwen3, family="qwen3"), qwen3, tmp_path / "qwen3")
    code = main(["eval", "--env", "bfcl", "--category", "base", "--policy", f"model:{folder}", "--format", "hermes",
                 "--limit", "1", "--max-new-tokens", "8", "--max-replies-per-turn", "1", "--demos", "0",
                 "--device", "cpu", "--json"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["n"] == 1
