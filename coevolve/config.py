"""Run configuration: typed sections read from YAML, dotted overrides from the command line, written back resolved.

    config = load_config("configs/lite-static.yaml", ["grpo.learning_rate=2e-6", "run.max_steps=4"])
    write_config(config, run_dir / "config.yaml")     # every default filled in: the run can be repeated from it

Unknown sections or keys are errors (a typo must not silently fall back to a default), and every value is checked
for its type, so a bad config fails before any model is loaded. Names follow what they are (`group_size`,
`prompts_per_step`), not TRL's argument names: `coevolve.train` maps them onto `trl.GRPOConfig`.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from coevolve.curriculum import CurriculumConfig
from coevolve.config_text import MAX_CONFIG_BYTES, ConfigError, apply_overrides, read_yaml
from coevolve.explore import ExploreConfig
from coevolve.jsonl import atomic_write_text
from coevolve.policy.chat import STRIP_REFUSED, DemoChoice
from coevolve.policy.models import DEVICE
from coevolve.pool import BatchMix
from coevolve.rollout import RolloutConfig
from coevolve.signals import SignalConfig
from coevolve.validate import ValidationConfig

Mode = Literal["zero-shot", "static", "synthetic", "random", "coevolve"]
"""The paper's ablation ladder (coevolve.loop): zero-shot (evaluate only), static (GRPO on D_0), synthetic
(one synthesis pass before training, then static), random (exploration without signals after every iteration),
coevolve (signal-guided synthesis after every iteration)."""
LossNormalisation = Literal["tokens", "sequence", "constant"]


@dataclass(frozen=True)
class RunSection:
    mode: Mode = "static"
    output_dir: str = "runs/default"
    max_steps: int = 20
    """Optimizer steps in the whole run."""
    save_steps: int = 10
    """Checkpoint every N optimizer steps (and at the end)."""
    save_total_limit: int | None = 2
    async_save: bool = False
    """Write checkpoints in a background thread from a copy in memory (`coevolve.train.checkpoints`): training,
    the iteration's commit and the next iteration's steps go on while they are written; the same files; a kill
    mid-write redoes the iteration on resume. One process only (several save as transformers does)."""
    seed: int = 0
    logging_steps: int = 1
    report_to: tuple[str, ...] = ()
    """TRL/transformers loggers, e.g. ["tensorboard"]; empty = none."""


@dataclass(frozen=True)
class EnvSection:
    name: str = "bfcl-lite"
    split: str | None = "train"
    """Task split for envs that have one (bfcl-lite, appworld, python task files; bfcl: a seeded half of the
    category, `coevolve.envs.bfcl.bfcl_split`); D_0 is this split, the held-out set `loop.eval_split`."""
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
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    device: str = "auto"
    """`auto` (CUDA when present, else CPU), `cpu`, `cuda`, `cuda:N`, `mps`."""
    reply_format: Literal["python", "hermes", "code"] = "python"
    """How the model writes calls: `python` (BFCL's list of calls), `hermes` (`<tool_call>` JSON) or `code` (fenced
    code blocks, one action each: AppWorld's way)."""
    demos: int = 3
    """Worked examples (train tasks solved by their ground truth) in every prompt."""
    demo_choice: DemoChoice = "first-tool"
    """Which train tasks become the examples: `first-tool` (in order, a new first tool each) or `coverage` (the
    most tools not yet shown, multi-call tasks included); see coevolve.policy.chat.build_demonstrations."""
    demo_without_tools: tuple[str, ...] = ()
    """Tools whose tasks never become worked examples (the `oracle data` arm of bench/replicate.py: D_0 holds the
    shifted tasks, the prompt stays exactly as in the arms whose D_0 lacks them)."""
    demo_max_calls: int | None = None
    """Only tasks with at most this many ground-truth calls become worked examples (the two-call shift's `oracle
    data` arm, likewise); None: any."""
    chat_template: str | None = None
    """A Jinja file to use instead of the tokenizer's template (e.g. a tool-aware one)."""
    tool_style: Literal["json", "signatures"] = "json"
    """How the system prompt lists the tools: `json` (BFCL's docs) or `signatures` (one line per tool, ~1/3 of
    the tokens); see coevolve.policy.chat."""
    reasoning: Literal["keep", "strip", "off"] = "keep"
    """Reasoning across turns, for models that think (Qwen3): `keep` = what the model writes, its `<think>` block
    included, stays in the context as sampled (the trainer scores exactly those tokens); `off` = the template's
    no-thinking mode (Qwen3's `enable_thinking=False`). `strip` (Qwen3's inference habit of dropping earlier
    turns' reasoning) is refused: the context would change between turns, so one episode would not be one token
    sequence."""


@dataclass(frozen=True)
class RolloutSection:
    """The rollout engine's limits (`coevolve.rollout.RolloutConfig`, whose defaults these are) and the training
    samples' sampling settings. `coevolve eval` takes its defaults from here too (it samples greedily unless
    told otherwise)."""

    group_size: int = RolloutConfig.group_size
    """K: rollouts per task, one GRPO group."""
    max_new_tokens: int = RolloutConfig.max_new_tokens
    """Tokens in one model reply."""
    max_replies_per_turn: int = RolloutConfig.max_replies_per_turn
    max_turns: int | None = RolloutConfig.max_turns
    max_episode_tokens: int = RolloutConfig.max_episode_tokens
    """Completion tokens (model + env) of a whole episode; also the trainer's longest completion."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_consecutive_failures: int = 32
    """Training stops, naming the cause, after this many rollouts in a row failed outside the agent (the backend
    or endpoint failed, the env's worker crashed or hung); 0 = never. Each such rollout scores 0 and is counted
    in metrics.jsonl (`failures`)."""

    def engine(self) -> RolloutConfig:
        """The engine's limits (sampling is set per call: per step in training, greedy in evaluation)."""
        return RolloutConfig(group_size=self.group_size, max_new_tokens=self.max_new_tokens,
                             max_replies_per_turn=self.max_replies_per_turn, max_turns=self.max_turns,
                             max_episode_tokens=self.max_episode_tokens)


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
    loss_normalisation: LossNormalisation = "tokens"
    """`tokens`: 1/sum of model tokens over the step (the paper's 1/sum_k |tau_k|, TRL `dapo`);
    `sequence`: mean over each trajectory's tokens, then over trajectories (TRL `grpo`);
    `constant`: 1/(trajectories x max_episode_tokens) (Dr. GRPO, TRL `dr_grpo`)."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """Advantage = (R - group mean) / (std + 1e-4) with std over the `group`, the `batch`, or `none` (no division)."""
    passes_per_batch: int = 1
    """Optimisation passes over each step's batch of rollouts (mu in the GRPO papers); > 1 makes the ratio r
    differ from 1. Not the CoEvolve iteration (see `loop.steps_per_iteration`)."""
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    warmup_steps: int = 0
    lr_scheduler: str = "constant"
    bf16: bool = False
    """Mixed precision by autocast (accelerate's `bf16`): for GPUs. On a CPU, load the model in bf16 and set
    `master_weights` instead (autocast there was ~25x slower than fp32; `coevolve.master_weights`)."""
    master_weights: bool = False
    """Keep fp32 copies of the weights in the optimizer (`coevolve.master_weights`): with `model.dtype: bfloat16`,
    sampling, the loss and the reference model compute in bf16 while AdamW's small updates are not rounded away."""
    gradient_checkpointing: bool = False
    mask_truncated: bool = False
    """Drop trajectories cut by a limit from the loss (DAPO's overlong filtering)."""
    guidance: Literal["off", "solution"] = "off"
    """`solution`: a group whose K rollouts all fail on a task with a verified solution (a seed task's ground
    truth, a synthesized task's validated one) gets one rollout replaced by that solution, played in the env in the
    policy's reply format and scored by it (LUFFY-style off-policy guidance; `coevolve.guidance`). Not the paper's."""
    reward: Literal["env", "graded"] = "env"
    """What GRPO maximises: `env` = the env's score (the paper); `graded` = the env score when solved, else
    `partial_credit` x how well the calls match the ground truth (`coevolve.reward`). Held-out success is the env's."""
    partial_credit: float = 0.5
    """With reward `graded`: the most an unsolved trajectory can earn (below 1, so solving always ranks first)."""
    shared_prefix: bool = True
    """A micro-batch's common prompt prefix scored once (same gradients; `coevolve.prefix`; one process only)."""
    shared_step_prefix: bool = True
    """With `shared_prefix`: the prefix all of a step's prompts share runs once a step (`coevolve.prefix`)."""
    skip_flat_micro_batches: bool = True
    """Skip the forward/backward of a micro-batch whose advantages are all zero when nothing else is in the loss
    (beta = 0): its loss and gradient are exactly zero (`coevolve.train`). False = TRL's work, for comparison."""
    compact_scoring_on_cpu: bool = True
    """On CPU, score only the completion positions (TRL's compact path; the same log-probabilities). False =
    TRL's default full-sequence scoring, for comparison."""


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
    mode: Literal["colocate", "server"] = "colocate"
    """`colocate` (vLLM shares the training GPUs) or `server` (a `trl vllm-serve` process)."""
    gpu_memory_utilization: float = 0.3
    tensor_parallel_size: int = 1
    max_model_length: int | None = None
    server_base_url: str | None = None
    enable_sleep_mode: bool = False


@dataclass(frozen=True)
class LoopSection:
    """The CoEvolve loop: iterations of GRPO steps, each followed by signals, synthesis and (every E) evaluation."""

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
    allow_heldout_overlap: bool = False
    """A run refuses a held-out set that shares a task with D_0 (the same id, or the same env, initial state and
    query: a score there measures memory). True only on purpose (e.g. the paper's own BFCL protocol, where D_0 comes
    from exploring the env and all 200 entries are evaluated)."""
    eval_before_training: bool = True
    """Evaluate the held-out set before training (iteration 0). Runs that share a base model share that figure:
    bench/replicate.py evaluates it once per setting (its zero-shot arm) and turns it off in the training arms."""
    synthetic_fraction: float | None = BatchMix.synthetic_fraction
    """Share of synthetic tasks in each iteration's sample of D_t (None: sample D_t as a whole)."""
    signal_weights: dict[str, float] = dataclasses.field(default_factory=dict)
    """Draw weight of a synthetic task by the signal that made it (`forgetting`, `boundary`, `rare`, `random`;
    `unexplored`: made for a tool no rollout had called, instead of its signal's); absent kinds and seed tasks
    weigh 1 (`coevolve.pool.BatchMix`). Empty: D_t's tasks are drawn uniformly, as in the paper."""
    recur_fraction: float = 0.0
    """Share of each iteration's sample given to tasks solved (success rate >= signals.threshold) in one of the last
    signals.window iterations: recurring tasks give forgetting a history H_recent to compare with. Same rollout
    budget (they take slots of the sample); the cost is fewer distinct tasks per iteration."""
    synthetic_contexts: int = 16
    """Mode synthetic: exploration contexts (random tasks of D_0) of the one synthesis pass before training."""
    d0: Literal["entries", "explored"] = "entries"
    """D_0: the env's tasks (`entries`), or (`explored`: the paper's BFCL protocol) what one synthesis pass over
    `synthetic_contexts` random entries admits; entries then only start explorations, so all may be evaluated."""

    sampler: Literal["uniform", "history"] = "uniform"
    """How each iteration's sample of D_t is drawn: `uniform` (the paper's; weighed only by `signal_weights`) or
    `history`: each task weighed by its own tries, new tasks soon after admission, learnable ones (mixed outcomes)
    favoured, mastered and failing ones decaying and retested now and then (`coevolve.curriculum`). Not with
    `recur_fraction`: the history sampler retests solved tasks itself."""
    curriculum: dict[str, float] = dataclasses.field(default_factory=dict)
    """The history sampler's weights, key by key (`coevolve.curriculum.CurriculumConfig`: window, never_tried,
    learnable, mastered, failing, floor); empty: its defaults."""

    def __post_init__(self) -> None:
        BatchMix(signal_weights=self.signal_weights)  # an unknown kind or a bad weight: ValueError, named
        CurriculumConfig.of(self.curriculum)  # an unknown key or a bad weight: ValueError, named
        if self.sampler == "history" and self.recur_fraction:
            raise ValueError("loop.sampler: history retests solved tasks itself (coevolve.curriculum); set "
                             "loop.recur_fraction: 0 with it")
        if self.curriculum and self.sampler != "history":
            raise ValueError("loop.curriculum weighs the history sampler only: set loop.sampler: history")


@dataclass(frozen=True)
class SynthesisSection:
    """Synthesis: exploration, abstraction and validation of new tasks (`coevolve.synthesis` builds it from this)."""

    explorer: Literal["offline", "policy", "llm"] = "offline"
    """`offline` (no LLM), `policy` (the policy being trained explores, through its own prompt) or `llm` (the
    OpenAI-compatible endpoint at `llm_base_url`)."""
    abstractor: Literal["template", "llm"] = "template"
    """`template` (no LLM) or `llm` (needs `llm_base_url`)."""
    step_budget: int = ExploreConfig.step_budget
    """Calls per exploration episode."""
    episodes_per_context: int = ExploreConfig.episodes_per_context
    max_contexts: int = 16
    """Signal events explored per iteration (the kinds take turns: forgetting, boundary, rare, forgetting, ...)."""
    rest_contexts: Literal["signal", "random"] = "signal"
    """What explores after the contexts on states D_t lacks (`signals.unexplored_states`): the signal events (the
    paper's steering) or, `random`, as many random tasks (random exploration's breadth; not the paper's)."""
    time_budget_seconds: float | None = None
    """Wall-clock cap of one synthesis phase; what is left when it runs out is skipped and counted."""
    focus_weight: float = ExploreConfig.focus_weight
    """Offline explorer: probability that a step's tool is one the signal's evidence names."""
    focus_retries: int = ExploreConfig.focus_retries
    """Offline explorer: draws again of a focus call (unexplored tool or order) that the env refused."""
    max_solution_calls: int = ValidationConfig.max_solution_calls
    """Longest solution the abstractors write and the validator accepts."""
    dedup_threshold: float = ValidationConfig.dedup_threshold
    """Near-duplicate threshold on (query + solution similarity) / 2; see coevolve.validate."""
    check_execution: bool = ValidationConfig.check_execution
    """False: the paper's no-validation ablation (shape, safety and duplicate checks only)."""
    max_call_chars: int = ValidationConfig.max_call_chars
    """Longest call in a synthesized solution (AppWorld's calls carry whole code cells: raise it there)."""
    llm_base_url: str | None = None
    llm_model: str = "local"
    llm_api_key_env: str = "OPENAI_API_KEY"
    llm_timeout_seconds: float = 60.0
    llm_max_retries: int = 3
    """Endpoint errors (connection, timeout, 429, 5xx) retried with exponential backoff, then the episode is skipped."""
    llm_max_format_retries: int = 2
    """Malformed abstractor replies sent back with the reason, at most this many times."""

    def exploration(self) -> ExploreConfig:
        return ExploreConfig(step_budget=self.step_budget, episodes_per_context=self.episodes_per_context,
                             focus_weight=self.focus_weight, focus_retries=self.focus_retries)

    def validation(self) -> ValidationConfig:
        return ValidationConfig(dedup_threshold=self.dedup_threshold, check_execution=self.check_execution,
                                max_solution_calls=self.max_solution_calls, max_call_chars=self.max_call_chars)


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
    signals: SignalConfig = field(default_factory=SignalConfig)
    synthesis: SynthesisSection = field(default_factory=SynthesisSection)

    def __post_init__(self) -> None:
        for key, spec in RANGES.items():
            section, name = key.split(".")
            _check_range(key, getattr(getattr(self, section), name), spec)
        _check(self.loop.steps_per_iteration % self.grpo.passes_per_batch == 0, "loop.steps_per_iteration",
               "must be a multiple of grpo.passes_per_batch (each batch of tasks is trained on passes_per_batch times)")
        _check(bool(self.run.output_dir.strip()), "run.output_dir", "must name a folder")
        _check(bool(DEVICE.match(self.model.device)), "model.device",
               f"{self.model.device!r} is not one of auto, cpu, cuda, cuda:N, mps")
        _check(self.rollout.max_episode_tokens >= self.rollout.max_new_tokens, "rollout.max_episode_tokens",
               f"must be at least rollout.max_new_tokens ({self.rollout.max_new_tokens}): one reply must fit")
        _check(self.model.reasoning != "strip", "model.reasoning", STRIP_REFUSED.split(": ", 1)[1])
        synthesis = self.synthesis
        for role in ("explorer", "abstractor"):
            _check(getattr(synthesis, role) != "llm" or synthesis.llm_base_url is not None, "synthesis.llm_base_url",
                   f"synthesis.{role}: llm needs an OpenAI-compatible endpoint (e.g. `coevolve serve` or `vllm "
                   "serve`); for the policy itself as explorer, set synthesis.explorer: policy")
        micro_batches(self, 1)  # the run checks again with its number of processes (`run_setup.check_processes`)

    def to_dict(self) -> dict[str, Any]:
        return _plain(dataclasses.asdict(self))


STEERING = {
    "grpo.guidance": ("off", "solution"),
    "signals.unexplored": (False, True),
    "signals.unexplored_states": (False, True),
    "loop.sampler": ("uniform", "history"),
}
"""The paper-faithful switches in one place: key -> (the paper's value, every section's default; the value the shipped
coevolve configs set from the replication's training-side counts, README "Steering"). `coevolve train --paper`."""


def _steering_overrides(which: int) -> list[str]:  # strings quoted: YAML 1.1 reads a bare `off` as false
    return [f"{key}={str(pair[which]).lower() if isinstance(pair[which], bool) else repr(pair[which])}"
            for key, pair in STEERING.items()]


def paper_overrides() -> list[str]:
    """The dotted overrides that give any config the paper's coevolve (`coevolve train --paper`)."""
    return _steering_overrides(0)


def shipped_overrides() -> list[str]:
    """The dotted overrides that set every STEERING switch as the shipped coevolve configs do."""
    return _steering_overrides(1)


def steering_of(config: Config) -> dict[str, Any]:
    """Each STEERING switch as `config` sets it."""
    return {key: getattr(getattr(config, key.split(".")[0]), key.split(".")[1]) for key in STEERING}


RANGES = {
    "run.max_steps": ">= 1", "run.save_steps": ">= 1", "run.save_total_limit": ">= 1", "run.seed": ">= 0",
    "run.logging_steps": ">= 1",
    "env.limit": ">= 1",
    "model.demos": ">= 0", "model.demo_max_calls": ">= 1",
    "rollout.group_size": ">= 2", "rollout.max_new_tokens": ">= 1", "rollout.max_replies_per_turn": ">= 1",
    "rollout.max_turns": ">= 1", "rollout.max_episode_tokens": ">= 1", "rollout.temperature": "> 0",
    "rollout.top_p": "(0, 1]", "rollout.top_k": ">= 0", "rollout.max_consecutive_failures": ">= 0",
    "grpo.prompts_per_step": ">= 1", "grpo.micro_batch_size": ">= 1", "grpo.learning_rate": "> 0",
    "grpo.epsilon_low": "[0, 1)", "grpo.epsilon_high": ">= 0", "grpo.beta": ">= 0", "grpo.passes_per_batch": ">= 1",
    "grpo.max_grad_norm": "> 0", "grpo.weight_decay": ">= 0", "grpo.warmup_steps": ">= 0",
    "grpo.partial_credit": "[0, 1)",
    "lora.r": ">= 1", "lora.alpha": "> 0", "lora.dropout": "[0, 1)",
    "vllm.gpu_memory_utilization": "(0, 1]", "vllm.tensor_parallel_size": ">= 1", "vllm.max_model_length": ">= 1",
    "loop.steps_per_iteration": ">= 1", "loop.eval_every": ">= 0", "loop.eval_limit": ">= 1",
    "loop.synthetic_fraction": "[0, 1]", "loop.synthetic_contexts": ">= 0",
    "signals.window": ">= 0", "signals.threshold": "[0, 1]", "signals.theta_percent": "[0, 100]",
    "signals.rare_below": ">= 1", "loop.recur_fraction": "[0, 1]",
    "synthesis.step_budget": ">= 1", "synthesis.episodes_per_context": ">= 1", "synthesis.max_contexts": ">= 0",
    "synthesis.time_budget_seconds": ">= 0", "synthesis.focus_weight": "[0, 1]", "synthesis.focus_retries": ">= 0",
    "synthesis.max_solution_calls": ">= 1",
    "synthesis.dedup_threshold": "(0, 1]", "synthesis.max_call_chars": ">= 1", "synthesis.llm_timeout_seconds": "> 0",
    "synthesis.llm_max_retries": ">= 0", "synthesis.llm_max_format_retries": ">= 0",
}
"""The range of every numeric config key (None, where a key allows it, is always in range); floats must also be
finite. `tests/test_config.py` checks that no numeric key is missing here."""
_RANGE = re.compile(r"^(?:(>=|>) (-?[\d.]+)|([\[(])(-?[\d.]+), (-?[\d.]+)([\])]))$")


def _check_range(key: str, value: Any, spec: str) -> None:
    if value is None or isinstance(value, str):  # None or a named choice (`signals.theta_percent: auto`)
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}: {value!r} is not a finite number")
    match = _RANGE.match(spec)
    if match is None:
        raise ValueError(f"bad range {spec!r} for {key}")  # a mistake in RANGES, not the user's
    if match.group(1):
        bound = float(match.group(2))
        ok = value >= bound if match.group(1) == ">=" else value > bound
        wanted = f"{match.group(1)} {match.group(2)}"
    else:
        low, high = float(match.group(4)), float(match.group(5))
        ok = (value >= low if match.group(3) == "[" else value > low) and \
             (value <= high if match.group(6) == "]" else value < high)
        wanted = f"in {spec}"
    if not ok:
        raise ConfigError(f"{key}: {value!r} is out of range; it must be {wanted}")


def micro_batches(config: "Config", num_processes: int) -> tuple[int, int]:
    """(trajectories per micro-batch, micro-batches per process and step): a step's prompts_per_step x K
    trajectories split into whole micro-batches on every process, or a one-line refusal. The one place this is
    checked: at load (one process) and when a run knows its processes."""
    trajectories = config.grpo.prompts_per_step * config.rollout.group_size
    micro = config.grpo.micro_batch_size or config.rollout.group_size
    if trajectories % (micro * num_processes):
        raise ConfigError(f"grpo.micro_batch_size: grpo.prompts_per_step x rollout.group_size = {trajectories} "
                          f"trajectories a step do not split into micro-batches of {micro} (grpo.micro_batch_size) "
                          f"on {num_processes} process{'es' if num_processes > 1 else ''}; make it a multiple of "
                          f"{micro * num_processes}")
    return micro, trajectories // (micro * num_processes)


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
    """Check `value` against a field's annotation (bool, int, float, str, None, Literal choices, tuple[X, ...],
    unions): the one place a choice or a type is checked."""
    origin = typing.get_origin(annotation)
    if origin is Literal:
        choices = typing.get_args(annotation)
        if value in choices and isinstance(value, str):
            return value
        raise ConfigError(f"{key}: {value!r} is not one of {', '.join(choices)}")
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
    checked = {key: _coerce(value, hints[key], f"{name}.{key}") for key, value in values.items()}
    try:
        return cls(**checked)
    except ValueError as error:  # an internal config's own range checks (SignalConfig, ...)
        raise ConfigError(f"{name}: {error}") from None


RENAMED_KEYS = {
    ("grpo", "num_iterations"): ("grpo", "passes_per_batch"),
    ("loop", "signals"): ("signals", "enabled"),
    ("loop", "window"): ("signals", "window"),
    ("loop", "theta_percent"): ("signals", "theta_percent"),
}
"""Keys renamed in 0.2 (old -> new); the old ones still work, with a warning, until the next release."""
RENAMED_SECTIONS = {"feedback": "synthesis"}


def _renamed(data: Mapping[str, Any]) -> dict[str, Any]:
    """`data` with every renamed key moved to its new place and a FutureWarning naming the new key; an old and a
    new key given together is an error (which one would win is not obvious)."""
    data = {name: dict(values) if isinstance(values, Mapping) else values for name, values in data.items()}
    moves = [((old, key), (new, key)) for old, new in RENAMED_SECTIONS.items()
             if isinstance(data.get(old), Mapping) for key in data[old]] + list(RENAMED_KEYS.items())
    for (section, key), (new_section, new_key) in moves:
        if not isinstance(data.get(section), dict) or key not in data[section]:
            continue
        target = data.setdefault(new_section, {})
        if not isinstance(target, dict):
            continue  # the section check below names it
        if new_key in target:
            raise ConfigError(f"{section}.{key} and {new_section}.{new_key} are the same setting; keep "
                              f"{new_section}.{new_key}")
        warnings.warn(f"config: {section}.{key} is now {new_section}.{new_key}; the old name works until the next "
                      "release", FutureWarning, stacklevel=3)
        target[new_key] = data[section].pop(key)
    for old in RENAMED_SECTIONS:
        if data.get(old) == {}:
            del data[old]
    return data


def from_dict(data: Mapping[str, Any] | None) -> Config:
    data = _renamed(data or {})
    hints = typing.get_type_hints(Config)
    unknown = sorted(set(data) - set(hints))
    if unknown:
        raise ConfigError(f"unknown section(s) {unknown}; known: {sorted(hints)}")
    return Config(**{name: _section(hints[name], values or {}, name) for name, values in data.items()})


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> Config:
    data: dict[str, Any] = {}
    if path is not None:
        try:
            if Path(path).is_file() and Path(path).stat().st_size > MAX_CONFIG_BYTES:
                raise ConfigError(f"config {path}: larger than {MAX_CONFIG_BYTES} bytes")
            text = Path(path).read_text(encoding="utf-8")
        except OSError as error:
            raise ConfigError(f"cannot read config {path}: {error.strerror or error}") from None
        except UnicodeDecodeError as error:
            raise ConfigError(f"config {path} is not UTF-8 text (byte {error.start})") from None
        loaded = read_yaml(text, f"config {path}")
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config {path}: expected sections (run:, env:, model:, ...) at the top level")
        data = loaded or {}
    return from_dict(apply_overrides(data, overrides))


def write_config(config: Config, path: str | Path) -> None:
    """Write the resolved config atomically (a crash leaves the old file or the new one, never half of one)."""
    import yaml

    atomic_write_text(Path(path), yaml.safe_dump(config.to_dict(), sort_keys=False))
