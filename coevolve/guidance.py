"""Guidance: learning from a task the policy cannot solve yet (`grpo.guidance: solution`; off by default).

GRPO learns nothing from a group whose K rollouts all fail: every reward is 0, so every advantage is 0. On a
coverage shift that is where the policy stands on exactly what D_0 lacks, whatever the data holds. Guidance
follows LUFFY (Yan et al., 2025, "Learning to Reason under Off-Policy Guidance"): for a task with a verified
solution (a seed task's ground truth, a synthesized task's validated solution), a group whose K rollouts all
fail gets its last rollout replaced by that solution, played in the env in the policy's own reply format:

    replies    per turn, one reply making the turn's ground-truth calls (`format_calls`, as the worked examples
               write them), then a closing reply without calls (`DONE_MESSAGE`; left out when
               `rollout.max_replies_per_turn` is 1, since the engine closes the turn itself), or only the
               closing reply for a turn without calls
    tokens     each reply is the tokenizer's encoding of its text followed by the template's end-of-turn token,
               what the policy would have sampled to write it; the env's answers, user turns and template tokens
               between replies come from the same rollout engine as for any rollout (mask 0)
    score      the env scores the episode; the guided rollout is used only when it scores 1 (solved)
    logprobs   log pi(token) at the sampling temperature under the policy that sampled the group (one forward
               pass over the episode), so TRL's ratio, clipping and any importance-sampling correction treat it as
               any rollout of the group. TRL then gives it a positive advantage (1 - 1/K over the group's std) and
               the group's failures a negative one: the group carries a gradient towards the solution.

Deviations from LUFFY: LUFFY mixes off-policy traces into every group and reshapes their importance ratio
(policy shaping, no clipping); here one trace replaces one rollout, only in groups without any success, and the
ratio and clipping are TRL's, unchanged. A group with a success is never touched. The guided rollout is marked
(`Trajectory.guided`, in rollouts.jsonl) and counted (metrics.jsonl's `guided`); the signals read the policy's
own rollouts only, so a guided success never makes a boundary. With several processes each rolls out whole groups
(a run whose micro-batches would split a group across processes is refused with guidance on, before anything
loads: `coevolve.run_setup.check_processes`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Mapping, Sequence

from coevolve.calls import parse_call
from coevolve.envs.base import Env
from coevolve.policy.backends import Generation, SamplingConfig
from coevolve.policy.chat import DONE_MESSAGE, ChatRenderer, format_calls
from coevolve.records import Task, ToolCall, Trajectory

GUIDANCE = ("off", "solution")
"""`grpo.guidance` choices."""

Scorer = Callable[[Sequence[int], Sequence[int]], list[float]]
"""(prompt ids, completion ids) -> log pi(token) of each completion token under the sampling policy."""


def solution_replies(task: Task, reply_format: str, docs: Sequence[Mapping[str, Any]],
                     max_replies_per_turn: int) -> list[str] | None:
    """The replies, in order, that play `task`'s ground truth the way the worked examples do (module docstring);
    None when a ground-truth call does not parse (nothing to play)."""
    replies: list[str] = []
    for calls in task.ground_truth:
        parsed = [parse_call(text) for text in calls]
        if not all(isinstance(call, ToolCall) for call in parsed):
            return None
        if parsed:
            replies.append(format_calls(parsed, reply_format, docs))
        if not parsed or max_replies_per_turn > 1:
            replies.append(DONE_MESSAGE)
    return replies


def end_of_reply_token(renderer: ChatRenderer) -> int:
    """The token the policy ends a reply with: the template's end-of-turn token (ChatML's `<|im_end|>`) when it
    is a special token, else EOS."""
    stops = renderer.stop_token_ids()
    suffix = renderer.encode(renderer.assistant_suffix)
    if suffix and suffix[0] in stops:
        return suffix[0]
    if not stops:
        raise ValueError("guidance: the tokenizer has neither an EOS nor an end-of-turn token")
    return stops[0]


class ScriptedReplies:
    """A token backend that writes the scripted replies in order, one episode at a time: each reply's tokens are
    the tokenizer's encoding of its text plus the end-of-turn token (cut, as a sampled reply would be, at the
    engine's budget). Logprobs are 0 here; `guide_groups` scores the finished episode under the policy."""

    def __init__(self, renderer: ChatRenderer, replies: Sequence[str]) -> None:
        self.tokenizer = renderer.tokenizer
        self.renderer = renderer
        self.replies = list(replies)
        self.end = end_of_reply_token(renderer)

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig, stop_token_ids: Sequence[int],
                 budgets: Sequence[int] | None = None) -> list[Generation]:
        if len(prompts) != 1:
            raise ValueError("ScriptedReplies plays one episode at a time")
        text = self.replies.pop(0) if self.replies else DONE_MESSAGE  # past the script: end the turn
        ids = self.renderer.encode(self.renderer.guard(text)) + [self.end]  # a task's text is plain text
        budget = min(sampling.max_new_tokens, *(budgets or [sampling.max_new_tokens]))
        if len(ids) > budget:  # what the engine does to a sampled reply that long
            cut = ids[:budget]
            return [Generation(self.tokenizer.decode(cut, skip_special_tokens=True), tuple(cut),
                               (0.0,) * len(cut), "length")]
        return [Generation(text, tuple(ids), (0.0,) * len(ids), "stop")]


def guided_rollout(env: Env, task: Task, renderer: ChatRenderer, config: Any, iteration: int) -> Trajectory | None:
    """`task`'s solution played through the rollout engine in the policy's reply format (logprobs still 0), or
    None when it has no solution that parses."""
    from coevolve.rollout import rollout

    docs = env.reset(task).tools()
    replies = solution_replies(task, renderer.reply_format, docs, config.max_replies_per_turn)
    if not replies:
        return None
    batch = rollout(env, [task], ScriptedReplies(renderer, replies), renderer, replace(config, group_size=1),
                    iteration=iteration)
    return batch.trajectories[0]


def all_failed(group: Sequence[Trajectory]) -> bool:
    """No rollout of the group succeeded (score 1): GRPO's advantages are all 0 there."""
    return bool(group) and all(trajectory.score < 1.0 for trajectory in group)


def guide_groups(trajectories: Sequence[Trajectory], group_size: int, tasks: Mapping[str, Task], env: Env,
                 renderer: ChatRenderer, config: Any, score: Scorer, iteration: int = 0) -> tuple[Trajectory, ...]:
    """`trajectories` (task-major, K = `group_size` per task) with the last rollout of every all-failure group
    whose task's solution solves it replaced by that guided rollout (module docstring). Groups with a success,
    tasks without a solution that scores 1, and K = 1 are left as they are."""
    if group_size < 2:
        return tuple(trajectories)
    out = list(trajectories)
    for start in range(0, len(out) - group_size + 1, group_size):
        group = out[start:start + group_size]
        task = tasks.get(group[0].task_id)
        if task is None or not all_failed(group) or any(t.task_id != task.id for t in group):
            continue
        guided = guided_rollout(env, task, renderer, config, iteration)
        if guided is None or guided.score < 1.0 or guided.failure is not None:
            continue  # a solution that does not solve the task here teaches nothing; the group stays as it was
        logprobs = score(guided.prompt_ids, guided.completion_ids)
        logprobs = [value if keep else 0.0 for value, keep in zip(logprobs, guided.completion_mask)]
        replaced = group[-1]
        out[start + group_size - 1] = replace(guided, id=replaced.id, sample_index=replaced.sample_index,
                                              logprobs=tuple(logprobs), guided=True)
    return tuple(out)


def model_scorer(model: Any, temperature: float) -> Scorer:
    """log_softmax(logits / temperature) of each completion token given everything before it, under `model` (the
    quantity token backends report for sampled tokens; see `coevolve.policy.backends`). One scorer serves one
    step's guided episodes, whose prompts open alike (system message, tools, worked examples): the keys and values
    of the last prompt are kept, and the next episode runs only from where it departs from them (the same
    log-probabilities: a position never sees what follows it). The LM head runs on the scored positions only."""
    import torch

    from coevolve.policy.hf_backend import cache_holding, cache_keyword, common_prefix_length

    temperature = temperature if temperature and temperature > 0 else 1.0
    keyword = cache_keyword(model)
    kept: dict[str, Any] = {"tokens": [], "layers": []}
    """The last prompt (all but its last token) and its keys and values per layer."""

    def cache_of(length: int) -> Any:
        return cache_holding(model, [(keys[:, :, :length], values[:, :, :length]) for keys, values in kept["layers"]])

    def score(prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
        if not completion_ids:
            return []
        device = next(model.parameters()).device
        ids = list(prompt_ids) + list(completion_ids)
        context = len(prompt_ids) - 1  # the positions before the first one whose output is scored
        shared = min(common_prefix_length([kept["tokens"], ids]), context)
        with torch.no_grad():
            if shared < context:  # keep this prompt's own keys and values for the next episode
                cache = cache_of(shared)
                model(input_ids=torch.tensor([ids[shared:context]], device=device), use_cache=True,
                      logits_to_keep=1, **{keyword: cache})
                kept["tokens"] = ids[:context]
                kept["layers"] = [(layer.keys, layer.values) for layer in cache.layers]
            logits = model(input_ids=torch.tensor([ids[context:]], device=device), use_cache=True,
                           logits_to_keep=len(completion_ids) + 1, **{keyword: cache_of(context)}).logits
        logits = logits[0, :-1].float() / temperature
        chosen = torch.tensor(list(completion_ids), device=device).unsqueeze(1)
        return torch.log_softmax(logits, dim=-1).gather(1, chosen).squeeze(1).tolist()

    return score
