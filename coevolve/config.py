"""Run configuration: typed sections read from YAML, dotted overrides from the command line, written back resolved.

    config = load_config("configs/lite-static.yaml", ["grpo.learning_rate=2e-6", "run.max_steps=4"])
    write_config(config, run_dir / "config.yaml")     # every default filled in: the run can be repeated from it

Unknown sections or keys are errors (a typo must not silently fall back to a default), and every value is checked
for its type, so a bad config fails before any model is loaded. Names follow what they are (`group_size`,
`prompts_per_step`), not TRL's argument names: `coevolve.train` maps them onto `trl.GRPOConfig`.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from coevolve.policy.chat import DEMO_CHOICES

MODES = ("zero-shot", "static", "synthetic", "random", "coevolve")
"""The paper's ablation ladder (coevolve.loop): zero-shot (evaluate only), static (GRPO on D_0), synthetic
(one synthesis pass before training, then static), random (exploration without signals after every iteration),
coevolve (signal-guided feedback after every iteration)."""
FEEDBACK_MODES = ("random", "coevolve")
LOSS_NORMALISATIONS = ("tokens", "sequence", "constant")


class ConfigError(ValueError):
    """A config file or override that cannot be used; the message names the key and the fix."""


@dataclass(frozen=True)
class RunSection:
    mode: str = "static"
    output_dir: str = "runs/default"
    max_steps: int = 20
    """Optimizer steps in the whole run."""
    save_steps: int = 10
    """Checkpoint every N optimizer steps (and at the end)."""
    save_total_limit: int | None = 2
    seed: int = 0
    logging_steps: int = 1
    report_to: tuple[str, ...] = ()
    """TRL/transformers loggers, e.g. ["tensorboard"]; empty = none."""


@dataclass(frozen=True)
class EnvSection:
    name: str = "bfcl-lite"
    split: str | None = "train"
    """Task split for envs that have one (bfcl-lite); D_0 is this split."""
    category: str | None = None
    """BFCL-V3 multi-turn category (env `bfcl`)."""
    limit: int | None = None
    """Train on the first N tasks only."""
    tasks_file: str | None = None
    """D_0 from a JSON-lines file of tasks (`Task.to_json`, e.g. exported from a pool) instead of the env's split;
    the tasks must run in this env."""
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    """More keyword arguments for the env's constructor (AppWorld: root, python, step_timeout_s, dense_reward,
    max_workers; see `coevolve.envs.appworld.AppWorldConfig`)."""


@dataclass(frozen=True)
class ModelSection:
    name: str = "smollm2"
    """A Hub id, a local folder, or `smollm2` (the shipped SmolLM2-135M-Instruct)."""
    dtype: str = "auto"
    device: str = "auto"
    reply_format: str = "python"
    """How the model writes calls: `python` (BFCL's list of calls), `hermes` (`<tool_call>` JSON) or `code` (fenced
    code blocks, one action each: AppWorld's way)."""
    demos: int = 3
    """Worked examples (train tasks solved by their ground truth) in every prompt."""
    demo_choice: str = "first-tool"
    """Which train tasks become the examples: `first-tool` (in order, a new first tool each) or `coverage` (the
    most tools not yet shown, multi-call tasks included); see coevolve.policy.chat.build_demonstrations."""
    chat_template: str | None = None
    """A Jinja file to use instead of the tokenizer's template (e.g. a tool-aware one)."""
    tool_style: str = "json"
    """How the system prompt lists the tools: `json` (BFCL's docs) or `signatures` (one line per tool, ~1/3 of
    the tokens); see coevolve.policy.chat."""


@dataclass(frozen=True)
class RolloutSection:
    group_size: int = 4
    """K: rollouts per task, one GRPO group (TRL's num_generations)."""
    max_new_tokens: int = 64
    """Tokens in one model reply."""
    max_replies_per_turn: int = 2
    max_turns: int | None = None
    max_episode_tokens: int = 512
    """Completion tokens (model + env) of a whole episode; also TRL's max_completion_length."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0


@dataclass(frozen=True)
class GRPOSection:
    prompts_per_step: int = 2
    """Tasks per optimizer step; the step trains on prompts_per_step x group_size trajectories."""
    micro_batch_size: int | None = None
    """Trajectories per forward/backward pass (per device); None = one group (group_size). Gradients accumulate
    over the step, so this changes memory, not the objective."""
    learning_rate: float = 1e-6
    epsilon_low: float = 0.2
    """Clip range below 1 (the paper's epsilon)."""
    epsilon_high: float = 0.2
    """Clip range above 1; > epsilon_low is DAPO's clip-higher."""
    beta: float = 0.0
    """KL coefficient; > 0 loads the reference model (or, with LoRA, disables the adapter to get it)."""
    kl_importance_correction: bool = False
    """Multiply each token's KL by the ratio r (DeepSeek-V3.2's unbiased off-policy KL gradient; TRL's default).
    False = the paper's plain beta * KL."""
    ref_model: str | None = None
    """Reference policy for the KL term; None = the initial policy."""
    loss_normalisation: str = "tokens"
    """`tokens`: 1/sum of model tokens over the step (the paper's 1/sum_k |tau_k|, TRL `dapo`);
    `sequence`: mean over each trajectory's tokens, then over trajectories (TRL `grpo`);
    `constant`: 1/(trajectories x max_episode_tokens) (Dr. GRPO, TRL `dr_grpo`)."""
    scale_rewards: str = "group"
    """Advantage = (R - group mean) / (std + 1e-4) with std over the `group`, the `batch`, or `none` (no division)."""
    num_iterations: int = 1
    """Optimisation passes over each batch of rollouts (mu); > 1 makes the ratio r differ from 1."""
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    warmup_steps: int = 0
    lr_scheduler: str = "constant"
    bf16: bool = False
    gradient_checkpointing: bool = False
    mask_truncated: bool = False
    """Drop trajectories cut by a limit from the loss (DAPO's overlong filtering)."""
    reward: str = "env"
    """What GRPO maximises: `env` = the env's score (the paper); `graded` = the env score when solved, else
    `partial_credit` x how well the calls match the ground truth (`coevolve.reward`). Held-out success is the env's."""
    partial_credit: float = 0.5
    """With reward `graded`: the most an unsolved trajectory can earn (below 1, so solving always ranks first)."""
    shared_prefix: bool = True
    """Score the prompt prefix common to a micro-batch once (the same log-probabilities and gradients, a fraction
    of the work; `coevolve.prefix`). Applies in one process without gradient checkpointing; else TRL's path."""


@dataclass(frozen=True)
class LoraSection:
    enabled: bool = False
    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: str | tuple[str, ...] = "all-linear"


@dataclass(frozen=True)
class VLLMSection:
    enabled: bool = False
    mode: str = "colocate"
    """`colocate` (vLLM shares the training GPUs) or `server` (a `trl vllm-serve` process)."""
    gpu_memory_utilization: float = 0.3
    tensor_parallel_size: int = 1
    max_model_length: int | None = None
    server_base_url: str | None = None
    enable_sleep_mode: bool = False


@dataclass(frozen=True)
class LoopSection:
    """The CoEvolve loop: iterations of GRPO steps, each followed by signals, feedback and (every E) evaluation."""

    steps_per_iteration: int = 5
    """GRPO optimizer steps per iteration (run.max_steps in all: the last iteration may be shorter)."""
    eval_every: int = 1
    """Held-out evaluation after every E-th iteration (0: only before training and after the last iteration)."""
    eval_env: str | None = None
    """Env of the held-out evaluation (cross-domain evaluation); None: the training env."""
    eval_split: str | None = "test"
    eval_category: str | None = None
    eval_limit: int | None = 40
    """Held-out tasks evaluated (the first N of the split: a fixed set, never trained on)."""
    signals: tuple[str, ...] = ("forgetting", "boundary", "rare")
    """Signals that steer the feedback (switch one off for the paper's signal ablations)."""
    window: int = 3
    """W of the forgetting signal."""
    theta_percent: float = 1.0
    """θ of the rare signal."""
    synthetic_fraction: float | None = None
    """Share of synthetic tasks in each iteration's sample of D_t (None: sample D_t as a whole)."""
    synthetic_contexts: int = 16
    """Mode synthetic: exploration contexts (random tasks of D_0) of the one synthesis pass before training."""


@dataclass(frozen=True)
class FeedbackSection:
    """The feedback phase: exploration, abstraction and validation (coevolve.feedback builds it from this)."""

    explorer: str = "offline"
    """`offline` (no LLM), `llm` (the endpoint below when `llm_base_url` is set, else the policy being trained)."""
    abstractor: str = "template"
    """`template` (no LLM) or `llm` (needs `llm_base_url`)."""
    step_budget: int = 6
    """Calls per exploration episode."""
    episodes_per_context: int = 1
    max_contexts: int = 16
    """Signal events explored per iteration (forgetting first, then boundary, then rare)."""
    time_budget_seconds: float | None = None
    """Wall-clock cap of one feedback phase; what is left when it runs out is skipped and counted."""
    focus_weight: float = 0.7
    max_solution_calls: int = 3
    """Longest solution the abstractors write."""
    dedup_threshold: float = 0.9
    """Near-duplicate threshold on (query + solution similarity) / 2; see coevolve.validate."""
    check_execution: bool = True
    """False: the paper's no-validation ablation (shape, safety and duplicate checks only)."""
    max_call_chars: int = 512
    """Longest call in a synthesized solution (AppWorld's calls carry whole code cells: raise it there)."""
    llm_base_url: str | None = None
    llm_model: str = "local"
    llm_api_key_env: str = "OPENAI_API_KEY"
    llm_timeout_seconds: float = 60.0
    llm_max_retries: int = 3
    """Endpoint errors (connection, timeout, 429, 5xx) retried with exponential backoff, then the episode is skipped."""
    llm_max_format_retries: int = 2
    """Malformed abstractor replies sent back with the reason, at most this many times."""


@dataclass(frozen=True)
class Config:
    run: RunSection = field(default_factory=RunSection)
    env: EnvSection = field(default_factory=EnvSection)
    model: ModelSection = field(default_factory=ModelSection)
    rollout: RolloutSection = field(default_factory=RolloutSection)
    grpo: GRPOSection = field(default_factory=GRPOSection)
    lora: LoraSection = field(default_factory=LoraSection)
    vllm: VLLMSection = field(default_factory=VLLMSection)
    loop: LoopSection = field(default_factory=LoopSection)
    feedback: FeedbackSection = field(default_factory=FeedbackSection)

    def __post_init__(self) -> None:
        _check(self.run.mode in MODES, "run.mode", f"must be one of {MODES}")
        _check(self.loop.steps_per_iteration >= 1 and self.loop.eval_every >= 0, "loop.steps_per_iteration/eval_every",
               "steps_per_iteration >= 1, eval_every >= 0")
        _check(self.loop.steps_per_iteration % self.grpo.num_iterations == 0, "loop.steps_per_iteration",
               "must be a multiple of grpo.num_iterations (each batch of tasks is trained on num_iterations times)")
        unknown = sorted(set(self.loop.signals) - {"forgetting", "boundary", "rare"})
        _check(not unknown, "loop.signals", f"unknown signal(s) {unknown}; choose among forgetting, boundary, rare")
        _check(self.run.max_steps >= 1 and self.run.save_steps >= 1, "run.max_steps/save_steps", "must be >= 1")
        _check(self.rollout.group_size >= 2, "rollout.group_size", "GRPO needs at least 2 rollouts per task")
        _check(self.grpo.prompts_per_step >= 1, "grpo.prompts_per_step", "must be >= 1")
        _check(self.grpo.loss_normalisation in LOSS_NORMALISATIONS, "grpo.loss_normalisation",
               f"must be one of {LOSS_NORMALISATIONS}")
        _check(self.grpo.scale_rewards in ("group", "batch", "none"), "grpo.scale_rewards", "group, batch or none")
        _check(self.grpo.reward in ("env", "graded"), "grpo.reward", "env or graded")
        _check(0.0 <= self.grpo.partial_credit < 1.0, "grpo.partial_credit", "a number in [0, 1)")
        _check(self.grpo.beta >= 0 and self.grpo.epsilon_low >= 0 and self.grpo.epsilon_high >= 0,
               "grpo.beta/epsilon_*", "must be >= 0")
        _check(self.model.reply_format in ("python", "hermes", "code"), "model.reply_format", "python, hermes or code")
        _check(self.model.tool_style in ("json", "signatures"), "model.tool_style", "json or signatures")
        _check(self.model.demo_choice in DEMO_CHOICES, "model.demo_choice", " or ".join(DEMO_CHOICES))
        _check(self.vllm.mode in ("colocate", "server"), "vllm.mode", "colocate or server")
        _check(self.feedback.explorer in ("offline", "llm"), "feedback.explorer", "offline or llm")
        _check(self.feedback.abstractor in ("template", "llm"), "feedback.abstractor", "template or llm")
        _check(self.feedback.abstractor != "llm" or self.feedback.llm_base_url is not None, "feedback.llm_base_url",
               "the llm abstractor needs an OpenAI-compatible endpoint (e.g. `coevolve serve` or `vllm serve`)")
        _check(self.feedback.step_budget >= 1 and self.feedback.max_contexts >= 0, "feedback.step_budget/max_contexts",
               "step_budget >= 1, max_contexts >= 0")
        micro = self.grpo.micro_batch_size or self.rollout.group_size
        _check((self.grpo.prompts_per_step * self.rollout.group_size) % micro == 0, "grpo.micro_batch_size",
               "must divide prompts_per_step x group_size")

    def to_dict(self) -> dict[str, Any]:
        return _plain(dataclasses.asdict(self))


def _check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Check `value` against a field's annotation (bool, int, float, str, None, tuple[str, ...], unions)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(annotation):
            try:
                return _coerce(value, option, key)
            except ConfigError:
                continue
        raise ConfigError(f"{key}: {value!r} is not a {annotation}")
    if annotation is type(None):
        if value is None:
            return None
        raise ConfigError(f"{key}: expected null, got {value!r}")
    if origin is dict:
        if not isinstance(value, Mapping) or not all(isinstance(name, str) for name in value):
            raise ConfigError(f"{key}: expected a mapping with string keys, got {value!r}")
        return dict(value)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return tuple(_coerce(item, typing.get_args(annotation)[0], key) for item in value)
    if annotation is bool:
        if isinstance(value, bool):
            return value
    elif annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads `1e-6` (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif annotation is str:
        if isinstance(value, str):
            return value
    raise ConfigError(f"{key}: expected {getattr(annotation, '__name__', annotation)}, got {value!r}")


def _section(cls: type, values: Mapping[str, Any], name: str) -> Any:
    if not isinstance(values, Mapping):
        raise ConfigError(f"{name}: expected a mapping of keys, got {values!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"{name}: unknown key(s) {unknown}; known: {sorted(known)}")
    return cls(**{key: _coerce(value, hints[key], f"{name}.{key}") for key, value in values.items()})


def from_dict(data: Mapping[str, Any] | None) -> Config:
    data = dict(data or {})
    hints = typing.get_type_hints(Config)
    unknown = sorted(set(data) - set(hints))
    if unknown:
        raise ConfigError(f"unknown section(s) {unknown}; known: {sorted(hints)}")
    return Config(**{name: _section(hints[name], values or {}, name) for name, values in data.items()})


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """`section.key=value` strings; the value is read as YAML (`4`, `1e-6`, `true`, `null`, `[a, b]`). A mapping
    field takes one more level: `env.options.root=/data/appworld`."""
    import yaml

    data = {name: dict(values or {}) for name, values in data.items()}
    for override in overrides:
        key, sep, text = override.partition("=")
        parts = key.strip().split(".")
        if not sep or len(parts) not in (2, 3) or not all(parts):
            raise ConfigError(f"override {override!r}: expected section.key=value, e.g. grpo.learning_rate=1e-6")
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError as error:
            raise ConfigError(f"override {override!r}: {error}") from None
        section = data.setdefault(parts[0], {})
        if len(parts) == 3:
            inner = section.get(parts[1])
            if inner is not None and not isinstance(inner, Mapping):
                raise ConfigError(f"override {override!r}: {parts[0]}.{parts[1]} is not a mapping")
            section[parts[1]] = {**(inner or {}), parts[2]: value}
        else:
            section[parts[1]] = value
    return data


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> Config:
    import yaml

    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except OSError as error:
            raise ConfigError(f"cannot read config {path}: {error.strerror}") from None
        except yaml.YAMLError as error:
            raise ConfigError(f"config {path} is not valid YAML: {error}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config {path}: expected sections (run:, env:, model:, ...) at the top level")
        data = loaded or {}
    return from_dict(apply_overrides(data, overrides))


def write_config(config: Config, path: str | Path) -> None:
    """Write the resolved config atomically (a crash leaves the old file or the new one, never half of one)."""
    import yaml

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(config.to_dict(), sort_keys=False)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(handle.name, path)
