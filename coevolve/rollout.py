"""Batched multi-turn rollouts: K episodes per task, all tasks together, one generation call per step.

    batch = rollout(env, tasks, backend, renderer, RolloutConfig(group_size=8))
    batch.trajectories   # task-major: the K trajectories of a task are consecutive (one GRPO group)

Every episode is a dialogue with a fresh env episode. At each step the engine gathers the context of every
still-active episode and makes ONE batched call to the backend; each reply is split into calls (`split_reply`,
or the backend's native tool calls), the calls go to the env (`Episode.act`, which never raises: malformed calls
come back as error observations), and the tool results, or, after a reply without calls, the next user turn,
are appended. Episodes finish at different steps and simply leave the batch.

Token record (token backends): `prompt_ids` is the opening prompt; `completion_ids` is everything after it,
the model's replies (mask 1, with their sampling logprobs) interleaved with the template/env/user tokens between
replies (mask 0, logprob 0.0). This is what TRL's `rollout_func` returns as `completion_ids` / `env_mask`.

Limits (all recorded as truncation, with a reason, in `Trajectory.reasons`):
- `max_new_tokens` per reply (the reply is cut, its partial calls still go to the env and usually fail);
- `max_replies_per_turn` replies with calls in one turn: the turn is closed as if the model had ended it;
- `max_turns`: user turns played (None = all of the task's); an unfinished task scores 0 (BFCL's force-quit);
- `max_episode_tokens`: completion tokens (model + env) per episode;
- the model's context (a token backend's `context_tokens`): an episode whose context reaches it ends there, and a
  prompt longer than it is refused before any generation (score 0, the reason in the record).
Chat backends (OpenAI-compatible HTTP) run the same loop on messages; their trajectories carry no token record,
and when calls were parsed from text (not native tool calls) the results come back as a user message, since
hosted APIs accept `tool` messages only as answers to native tool calls.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from coevolve.envs.base import ENV_FAILURE, Env, Episode
from coevolve.policy.backends import ChatBackend, Generation, SamplingConfig, TokenBackend
from coevolve.policy.chat import ChatRenderer, to_openai_tools
from coevolve.policy.replies import split_reply
from coevolve.records import Step, Task, Trajectory


@dataclass(frozen=True)
class RolloutConfig:
    group_size: int = 4
    """K: episodes per task (one GRPO group)."""
    max_new_tokens: int = 256
    """Token budget of one model reply (overrides `sampling.max_new_tokens`)."""
    max_replies_per_turn: int = 4
    max_turns: int | None = None
    max_episode_tokens: int = 4096
    sampling: SamplingConfig = field(default_factory=SamplingConfig)

    def __post_init__(self) -> None:
        if self.group_size < 1 or self.max_new_tokens < 1 or self.max_replies_per_turn < 1:
            raise ValueError(f"invalid rollout limits: {self}")


@dataclass(frozen=True)
class RolloutBatch:
    trajectories: tuple[Trajectory, ...]
    generation_calls: int
    generated_tokens: int
    seconds: float

    def groups(self) -> list[tuple[Trajectory, ...]]:
        """The trajectories of each task (task order of the call)."""
        grouped: dict[str, list[Trajectory]] = {}
        for trajectory in self.trajectories:
            grouped.setdefault(trajectory.task_id, []).append(trajectory)
        return [tuple(group) for group in grouped.values()]


class _Run:
    """One live episode: its env episode, conversation and token record."""

    def __init__(self, task: Task, sample_index: int, episode: Episode, renderer: ChatRenderer, tokens: bool,
                 sibling: "_Run | None" = None) -> None:
        self.task, self.sample_index, self.episode, self.renderer = task, sample_index, episode, renderer
        self.started = time.perf_counter()
        self.docs = episode.tools()
        if sibling is not None:  # another sample of the same task: the same opening, rendered once per task
            self.messages, self.prompt_ids = list(sibling.messages), sibling.prompt_ids
        else:
            self.messages = renderer.opening_messages(self.docs, episode.user_messages())
            self.prompt_ids = renderer.prompt_ids(self.messages, self.docs) if tokens else []
        self.completion_ids: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] = []
        self.steps: list[Step] = []
        self.notes: list[str] = []
        self.replies = 0
        self.failure: str | None = None
        self.replies_in_turn = 0
        self.turns_played = 0
        self.finished = False
        self.seconds = 0.0

    def context(self) -> list[int]:
        return self.prompt_ids + self.completion_ids

    def finish(self, note: str | None = None) -> None:
        if note:
            self.notes.append(note)
        self.finished = True
        self.seconds = time.perf_counter() - self.started

    def trajectory(self, iteration: int) -> Trajectory:
        score = self.episode.score()
        return Trajectory(
            id=f"{self.task.id}-i{iteration}-k{self.sample_index}",
            task_id=self.task.id,
            iteration=iteration,
            sample_index=self.sample_index,
            steps=tuple(self.steps),
            score=score.value,
            reasons=tuple(score.reasons) + tuple(self.notes),
            truncated=bool(self.notes),
            prompt_ids=tuple(self.prompt_ids),
            completion_ids=tuple(self.completion_ids),
            completion_mask=tuple(self.mask),
            logprobs=tuple(self.logprobs),
            seconds=self.seconds,
            failure=self.failure or next((f"environment: {check.reason}" for check in score.checks
                                          if check.kind == ENV_FAILURE and not check.passed), None),
        )


def _call_texts(generation: Generation, reply_format: str) -> tuple[str, ...]:
    if generation.tool_calls is not None:
        return tuple(generation.tool_calls)
    return split_reply(generation.text, reply_format).call_texts


def _next_messages(run: _Run, steps: Sequence[Step], config: RolloutConfig) -> list[dict[str, Any]] | None:
    """After a reply: what the env and user say next, or None when the episode is over."""
    episode = run.episode
    results = run.renderer.tool_messages([(step.call.name if step.call else "", step.observation) for step in steps])
    if steps:
        run.replies_in_turn += 1
        if episode.done:  # the env force-quit the episode
            run.finish()
            return None
        if run.replies_in_turn < config.max_replies_per_turn:
            return results
        run.notes.append(f"turn {episode.turn_index}: closed after {config.max_replies_per_turn} replies with calls "
                         "(max_replies_per_turn)")
    episode.end_turn()
    run.turns_played += 1
    run.replies_in_turn = 0
    if episode.done:
        run.finish()
        return None
    if config.max_turns is not None and run.turns_played >= config.max_turns:
        run.finish(f"stopped after {run.turns_played} turns (max_turns)")
        return None
    new_docs = episode.new_tools()
    run.docs = episode.tools()
    return results + run.renderer.user_turn(episode.user_messages(), new_docs)


def _apply_token_reply(run: _Run, generation: Generation, config: RolloutConfig, reply_format: str) -> None:
    run.completion_ids.extend(generation.token_ids)
    run.mask.extend([1] * len(generation.token_ids))
    run.logprobs.extend(generation.logprobs)
    run.messages.append({"role": "assistant", "content": generation.text})
    run.replies += 1
    if generation.finish_reason == "length":
        run.notes.append(f"reply {run.replies} cut at {len(generation.token_ids)} tokens (max_new_tokens)")
    calls = _call_texts(generation, reply_format)
    steps = run.episode.act(list(calls)) if calls else ()
    run.steps.extend(steps)
    following = _next_messages(run, steps, config)
    if following is None:
        return
    run.messages.extend(following)
    ended_with = generation.token_ids[-1] if generation.finish_reason == "stop" and generation.token_ids else None
    between = run.renderer.continuation(following, run.docs, reply_ended_with=ended_with)
    if len(run.completion_ids) + len(between) >= config.max_episode_tokens:
        run.finish(f"stopped at {len(run.completion_ids)} completion tokens (max_episode_tokens)")
        return
    run.completion_ids.extend(between)
    run.mask.extend([0] * len(between))
    run.logprobs.extend([0.0] * len(between))


def _apply_chat_reply(run: _Run, generation: Generation, config: RolloutConfig, reply_format: str) -> None:
    run.replies += 1
    if generation.error is not None:
        run.failure = f"backend: {generation.error}"
        run.finish(f"reply {run.replies}: backend failed ({generation.error})")
        return
    if generation.finish_reason == "length":
        run.notes.append(f"reply {run.replies} cut at max_new_tokens")
    calls = _call_texts(generation, reply_format)
    steps = run.episode.act(list(calls)) if calls else ()
    run.steps.extend(steps)
    native = generation.tool_calls is not None and bool(calls)
    assistant: dict[str, Any] = {"role": "assistant", "content": generation.text}
    if native:
        assistant["tool_calls"] = [
            {"id": f"call_{run.replies}_{i}", "type": "function",
             "function": {"name": step.call.name if step.call else "", "arguments": _arguments_json(call)}}
            for i, (call, step) in enumerate(zip(calls, steps))
        ]
    run.messages.append(assistant)
    following = _next_messages(run, steps, config)
    if following is None:
        return
    if native:
        for i, message in enumerate(following[:len(steps)]):
            message["tool_call_id"] = f"call_{run.replies}_{i}"
    elif steps:
        results = "\n".join(f"{m['name']} -> {m['content']}" for m in following[:len(steps)])
        following = [{"role": "user", "content": f"Results:\n{results}"}] + following[len(steps):]
    run.messages.extend(following)


def _arguments_json(call_text: str) -> str:
    try:
        return json.dumps(json.loads(call_text).get("arguments", {}))
    except (ValueError, AttributeError):
        return "{}"


def rollout(env: Env, tasks: Sequence[Task], backend: TokenBackend | ChatBackend, renderer: ChatRenderer,
            config: RolloutConfig = RolloutConfig(), iteration: int = 0,
            progress: Callable[[int, int], None] | None = None) -> RolloutBatch:
    """Run `config.group_size` episodes of every task, batched; see the module docstring."""
    started = time.perf_counter()
    tokens = isinstance(backend, TokenBackend)
    runs: list[_Run] = []
    for task in tasks:
        first = _Run(task, 0, env.reset(task), renderer, tokens)
        runs.append(first)
        runs.extend(_Run(task, k, env.reset(task), renderer, tokens, sibling=first) for k in range(1, config.group_size))
    # A token backend that can keep each episode's KV cache between its replies does so for this rollout only:
    # the next reply then prefills just the tool results and template tokens added since (`episode_caches`).
    caches = getattr(backend, "episode_caches", None) if tokens else None
    with caches() if caches is not None else contextlib.nullcontext():
        calls, generated = _generation_loop(runs, backend, renderer, config, tokens, progress)
    trajectories = tuple(run.trajectory(iteration) for run in runs)
    return RolloutBatch(trajectories, calls, generated, time.perf_counter() - started)


def _generation_loop(runs: Sequence[_Run], backend: TokenBackend | ChatBackend, renderer: ChatRenderer,
                     config: RolloutConfig, tokens: bool, progress: Callable[[int, int], None] | None
                     ) -> tuple[int, int]:
    """One batched generation call per step over the still-active episodes; returns (calls, generated tokens)."""
    stop_ids = renderer.stop_token_ids() if tokens else []
    base_sampling = replace(config.sampling, max_new_tokens=config.max_new_tokens)
    context_tokens = getattr(backend, "context_tokens", None) if tokens else None
    calls = generated = 0
    while True:
        if context_tokens:  # a context the model cannot hold is refused here, never run (a 617,933-token prompt was)
            for run in runs:
                if not run.finished and len(run.context()) >= context_tokens:
                    run.finish(f"the context is {len(run.context())} tokens, the model's is {context_tokens}: "
                               "refused before generation")
        active = [run for run in runs if not run.finished]
        if progress is not None:
            progress(len(runs) - len(active), len(runs))
        if not active:
            break
        calls += 1
        if tokens:
            sampling = base_sampling
            if base_sampling.seed is not None:  # a fresh, reproducible stream for every step
                sampling = replace(base_sampling, seed=base_sampling.seed + calls)
            # Each reply may use what is left of its episode's token budget, up to max_new_tokens.
            budgets = [min(config.max_new_tokens, config.max_episode_tokens - len(run.completion_ids),
                           (context_tokens or 1 << 62) - len(run.context())) for run in active]
            generations = backend.generate([run.context() for run in active], sampling, stop_ids, budgets)
            for run, generation in zip(active, generations):
                generated += len(generation.token_ids)
                _apply_token_reply(run, generation, config, renderer.reply_format)
        else:
            tool_lists = [to_openai_tools(run.docs) if renderer.tools_in_template else [] for run in active]
            generations = backend.chat([run.messages for run in active], tool_lists, base_sampling)
            for run, generation in zip(active, generations):
                _apply_chat_reply(run, generation, config, renderer.reply_format)
    return calls, generated


# ---------------------------------------------------------------------------------------------------------------
# What training keeps of a step's rollouts
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepRollouts:
    """The rollouts of one optimizer step: what the trainer learned from and what the loop's signals read."""

    step: int
    trajectories: tuple[Trajectory, ...]
    seconds: float

    @property
    def success_rate(self) -> float:
        """The policy's own success: guided rollouts (`coevolve.guidance`) are the solutions it was shown."""
        own = [t for t in self.trajectories if not t.guided]
        return sum(t.score >= 1.0 for t in own) / max(1, len(own))

    def summary(self) -> dict[str, Any]:
        groups: dict[str, list[float]] = {}
        for trajectory in self.trajectories:
            groups.setdefault(trajectory.task_id, []).append(trajectory.score)
        return {
            "step": self.step,
            "rollout/success_rate": self.success_rate,
            "rollout/mean_score": sum(t.score for t in self.trajectories) / max(1, len(self.trajectories)),
            "rollout/mixed_groups": sum(len(set(scores)) > 1 for scores in groups.values()),
            "rollout/groups": len(groups),
            "rollout/model_tokens": sum(sum(t.completion_mask) for t in self.trajectories),
            "rollout/truncated": sum(t.truncated for t in self.trajectories),
            "rollout/guided": sum(t.guided for t in self.trajectories),
            "rollout/seconds": round(self.seconds, 4),
        }


def group_runs(task_ids: Sequence[str], group_size: int) -> list[str] | None:
    """The distinct ids in order when `task_ids` come as runs of exactly `group_size` copies of each (whole GRPO
    groups, as TRL's sampler gives them to a process whose micro-batches hold whole groups), else None: a group is
    split across processes (each of its ids is then one episode)."""
    if group_size < 1 or len(task_ids) % group_size:
        return None
    distinct = [task_ids[start] for start in range(0, len(task_ids), group_size)]
    whole = all(task_ids[start:start + group_size] == [task_ids[start]] * group_size
                for start in range(0, len(task_ids), group_size))
    return distinct if whole and len(set(distinct)) == len(distinct) else None


def trajectory_summary(trajectory: Trajectory) -> dict[str, Any]:
    """A trajectory without its token record (the run directory keeps what a person and the signals read)."""
    tokens = ("prompt_ids", "completion_ids", "completion_mask", "logprobs")
    # Drop the token record before `asdict`, which would deep-copy a thousand ids per trajectory first.
    data = replace(trajectory, **{key: () for key in tokens}).to_dict()
    for key in tokens:
        del data[key]
    return data


class RolloutFailures(RuntimeError):
    """Too many rollouts in a row failed outside the agent; the message names the cause."""


class FailureStreak:
    """Counts rollouts in a row that failed outside the agent (`Trajectory.failure`: backend or env worker) and
    stops training at `limit` with the cause: a dead endpoint or a crashing env would otherwise train on zeros."""

    def __init__(self, limit: int) -> None:
        self.limit, self.streak = limit, 0

    def observe(self, trajectories: Sequence[Trajectory]) -> None:
        for trajectory in trajectories:
            self.streak = self.streak + 1 if trajectory.failure else 0
            if self.limit and self.streak >= self.limit:
                raise RolloutFailures(f"{self.streak} rollouts in a row failed outside the agent, the last with "
                                    f"{trajectory.failure}; stopping (rollout.max_consecutive_failures="
                                    f"{self.limit}). Fix the cause and continue with --resume")
