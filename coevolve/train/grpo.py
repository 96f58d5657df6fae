"""GRPO on TRL: the paper's objective over our multi-turn rollouts. The only module that imports TRL.

The objective (paper, "GRPO training objective"), per group of K trajectories tau_k of one task:

    J(theta) = 1/sum_k |tau_k| * sum_k sum_t min(r_kt A_k, clip(r_kt, 1 - eps_low, 1 + eps_high) A_k)
               - beta * KL(pi_theta || pi_ref)
    r_kt = pi_theta(o_kt | ...) / pi_old(o_kt | ...),    A_k = (R_k - mean(R)) / (std(R) + delta)

|tau_k| counts only the tokens the model generated: tool results, user turns and template tokens between replies
are in the sequence (the model attends to them) but carry no loss. How that maps onto TRL's `GRPOTrainer`:

- Rollouts: `GRPOTrainer(rollout_func=EnvRollouts(...))`. TRL hands us the generation batch's prompts (task ids,
  each repeated K = `num_generations` times); we run our batched engine (`coevolve.rollout`) against the env and
  return `prompt_ids` (the opening prompt), `completion_ids` (replies interleaved with env tokens), the sampling
  `logprobs`, and `env_mask` (1 = model token), which TRL multiplies into its loss mask.
- Reward: the env's score of each trajectory (`env_score`, passed through the rollout output to the reward function);
  or, with `grpo.reward: graded` (not the paper's), partial credit for unsolved trajectories whose calls match the
  ground truth (`coevolve.reward`; `train_reward`). Signals and held-out success always use the env's score.
- Advantages: TRL's `(R - group mean) / (std + 1e-4)`, std with Bessel's correction (`scale_rewards="group"`;
  the paper does not say which std; delta = 1e-4). Groups whose K rewards are equal get A = 0 exactly.
- Clipping: TRL's two-sided `epsilon` (= eps_low) and `epsilon_high`; the KL term is TRL's k3 estimator
  exp(ref - logp) - (ref - logp) - 1 per model token (DeepSeekMath's unbiased estimator of KL(pi_theta || pi_ref)),
  added to each token's loss, so it shares the token normalisation below. TRL multiplies it by r by default
  (DeepSeek-V3.2's off-policy correction); we follow the paper and do not, unless `grpo.kl_importance_correction`.
- Normalisation `grpo.loss_normalisation="tokens"` -> TRL `loss_type="dapo"`: the summed token losses of the whole
  optimisation step divided by the number of model tokens in it (over micro-batches and processes). For a step of
  one group this is exactly the paper's 1/sum_k |tau_k|. **Deviation:** with several groups per step
  (`prompts_per_step > 1`) the normaliser is the step's total token count, i.e. groups weigh by their token count,
  where averaging the paper's per-group J over groups would weigh them equally; the paper does not say how it
  batches groups. `sequence` -> TRL `grpo` (mean per trajectory, then over trajectories) and `constant` ->
  `dr_grpo` (Dr. GRPO) are offered for comparison.
- pi_old: with one pass per batch (`grpo.passes_per_batch = 1`, TRL's `num_iterations`) TRL uses the detached
  current logprobs (r = 1 in value, the gradient is the policy gradient); with more passes it stores the logprobs
  before the first update.
- Reference model: the initial policy (TRL reloads it from the policy's path), or `grpo.ref_model`, or with LoRA
  the base model under a disabled adapter.
- Truncated trajectories (`grpo.mask_truncated`) are dropped from the loss by zeroing their `env_mask`, using our
  own truncation record (TRL's check looks for an EOS at the end, which a multi-turn episode need not have).
- Work, not maths (in one process): micro-batches hold whole groups, not TRL's shuffled rows; the prompt prefix a
  micro-batch shares runs once, the one the whole step shares once a step (`coevolve.prefix`); a micro-batch with
  every advantage zero skips the model when beta = 0 (its loss and gradient are 0). The step's gradient is unchanged.
- The seam: everything private of TRL/transformers this module overrides or reads is listed in `TRL_SEAM` and
  checked against the installed TRL when a trainer is built (`check_trl`), so an upgrade that moves one fails at
  start with the supported versions named, not mid-run.
- The loop's GRPO steps (`coevolve.train.calls.train_steps`): `trainer.train()` once per CoEvolve iteration, resumed
  from the checkpoint the previous call saved, so optimizer, scheduler and RNG carry over as in one call (or a kill).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is "experimental" in TRL; we know

from coevolve.train.calls import CHECKPOINTS, checkpoint_step
from coevolve.train.checkpoints import CheckpointWriter, load_in_flight, writer_for
from coevolve.config import Config, ConfigError, micro_batches
from coevolve.envs.base import Env
from coevolve.policy.backends import SamplingConfig
from coevolve.policy.chat import ChatRenderer
from coevolve.records import Task, Trajectory
from coevolve.reward import env_score_reward, graded_reward, training_reward
from coevolve.rollout import FailureStreak, RolloutBatch, RolloutConfig, StepRollouts, group_runs, rollout

LOSS_TYPES = {"tokens": "dapo", "sequence": "grpo", "constant": "dr_grpo"}
"""grpo.loss_normalisation -> TRL loss_type (see the module docstring)."""


class TrainingError(RuntimeError):
    """Training cannot go on as asked (the message says why and what to do)."""


class EnvRollouts:
    """TRL `rollout_func`: our batched multi-turn engine over the env; see the module docstring.

    `backend`: a fixed token backend (tests, benchmarks), or None to generate with the model being trained
    (transformers, or TRL's vLLM engine / server when `use_vllm`)."""

    def __init__(self, env: Env, tasks: Sequence[Task], renderer: ChatRenderer, rollout_config: RolloutConfig,
                 seed: int = 0, iteration: int = 0, mask_truncated: bool = False, backend: Any = None,
                 on_step: Callable[[StepRollouts], None] | None = None, reward: str = "env",
                 partial_credit: float = 0.5, max_consecutive_failures: int = 0, guidance: str = "off") -> None:
        self.env, self.renderer, self.config = env, renderer, rollout_config
        self.guidance = guidance
        """`grpo.guidance`: `solution` replaces one rollout of an all-failure group by the task's solution."""
        self.reward, self.partial_credit = reward, partial_credit
        self.tasks = {task.id: task for task in tasks}
        self.seed, self.iteration, self.mask_truncated = seed, iteration, mask_truncated
        self.backend, self.on_step = backend, on_step
        self.failures = FailureStreak(max_consecutive_failures)
        self.last: StepRollouts | None = None
        self.slots: dict[str, str] = {}
        """Slot name (a row of `slot_dataset`) -> the task it stands for in the current iteration."""

    def set_tasks(self, tasks: Sequence[Task]) -> None:
        """Add tasks to the table (the loop grows D_t); ids already handed to TRL stay resolvable."""
        self.tasks.update({task.id: task for task in tasks})

    def assign_slots(self, tasks: Sequence[Task], iteration: int, count: int) -> None:
        """The loop's next iteration: slot i of `slot_dataset(count)` stands for tasks[i % len(tasks)] (a sample
        of D_t), and trajectories carry the iteration in their ids."""
        if not tasks:
            raise TrainingError(f"iteration {iteration}: no task to train on")
        self.set_tasks(tasks)
        self.slots = {slot_name(i): tasks[i % len(tasks)].id for i in range(count)}
        self.iteration = iteration

    @contextlib.contextmanager
    def generation_backend(self, trainer: Any) -> Iterator[Any]:
        """The backend rollouts generate with: the fixed one, TRL's vLLM engine or server, or the model being
        trained (unwrapped for generation, in eval mode)."""
        from coevolve.policy.backends import VLLMBackend, VLLMClientBackend

        if self.backend is not None:
            yield self.backend
        elif getattr(trainer, "use_vllm", False):
            generation = trainer.vllm_generation  # TRL synced its weights before calling us
            if trainer.args.vllm_mode == "server":
                yield VLLMClientBackend(generation.vllm_client, trainer.processing_class)
            else:
                yield VLLMBackend("", trainer.processing_class, engine=generation.llm)
        else:
            from trl.models import unwrap_model_for_generation

            from coevolve.policy.hf_backend import TransformersBackend

            with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator,
                                             gather_deepspeed3_params=trainer.args.ds3_gather_for_generation) as model:
                was_training = model.training
                model.eval()  # no dropout, and the KV cache works under gradient checkpointing
                try:
                    yield TransformersBackend(model, trainer.processing_class)
                finally:
                    model.train(was_training)

    def __call__(self, prompts: Sequence[Any], trainer: Any) -> dict[str, list]:
        started = time.perf_counter()
        task_ids = [self.slots.get(str(prompt), str(prompt)) for prompt in prompts]
        missing = sorted(set(task_ids) - set(self.tasks))
        if missing:
            raise TrainingError(f"the trainer asked for unknown task ids {missing[:3]}")
        step = trainer.state.global_step + 1
        process = trainer.accelerator.process_index
        distinct = group_runs(task_ids, self.config.group_size)  # K, said once: `rollout.group_size`
        group_size = self.config.group_size
        if distinct is None:  # a group split across processes: one episode per id (never with guidance:
            if self.guidance != "off":  # `run_setup.check_processes` refuses that before anything loads)
                raise TrainingError(f"a GRPO group of {group_size} was split across processes; guidance needs whole "
                                    "groups (grpo.micro_batch_size a multiple of rollout.group_size)")
            distinct, group_size = list(task_ids), 1
        # A seed per (run, step, process): a resumed run samples exactly what the uninterrupted one would have.
        sampling = SamplingConfig(temperature=trainer.args.temperature, top_p=trainer.args.top_p,
                                  top_k=trainer.args.top_k or 0, max_new_tokens=self.config.max_new_tokens,
                                  seed=(self.seed * 1_000_003 + step * 7919 + process) % 2**31)
        config = replace(self.config, group_size=group_size, sampling=sampling)
        with self.generation_backend(trainer) as backend:
            batch: RolloutBatch = rollout(self.env, [self.tasks[i] for i in distinct], backend, self.renderer,
                                          config, iteration=self.iteration)
            trajectories = batch.trajectories
            if self.guidance == "solution":
                trajectories = self._guided(trajectories, config, backend, trainer)
        trajectories = self._renamed(trajectories, step, process)
        record = StepRollouts(step, trajectories, time.perf_counter() - started)
        self.last = record
        if self.on_step is not None:
            self.on_step(record)  # logged first: the failures that stop the run are in rollouts.jsonl
        self.failures.observe(trajectories)
        masks = [list(t.completion_mask) for t in trajectories]
        if self.mask_truncated:
            masks = [[0] * len(mask) if t.truncated else mask for t, mask in zip(trajectories, masks)]
        return {
            "prompt_ids": [list(t.prompt_ids) for t in trajectories],
            "completion_ids": [list(t.completion_ids) for t in trajectories],
            "logprobs": [list(t.logprobs) for t in trajectories],
            "env_mask": masks,
            "env_score": [t.score for t in trajectories],
            "train_reward": [training_reward(t, self.tasks[t.task_id], self.reward, self.partial_credit)
                             for t in trajectories],
        }

    def _guided(self, trajectories: Sequence[Trajectory], config: RolloutConfig, backend: Any,
                trainer: Any) -> tuple[Trajectory, ...]:
        """`coevolve.guidance.guide_groups`, its logprobs from the model that sampled the step: the generation
        backend's own model, else (vLLM, a fixed backend) the model being trained, whose weights it holds."""
        from coevolve.guidance import guide_groups, model_scorer

        model = getattr(backend, "model", None)
        with contextlib.nullcontext(model) if model is not None else self._policy_model(trainer) as model:
            return guide_groups(trajectories, config.group_size, self.tasks, self.env, self.renderer, config,
                                model_scorer(model, trainer.args.temperature), self.iteration)

    @staticmethod
    @contextlib.contextmanager
    def _policy_model(trainer: Any) -> Iterator[Any]:
        from trl.models import unwrap_model_for_generation

        with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator,
                                         gather_deepspeed3_params=trainer.args.ds3_gather_for_generation) as model:
            yield model

    def _renamed(self, trajectories: Sequence[Trajectory], step: int, process: int) -> tuple[Trajectory, ...]:
        """Unique ids per step (a task can come back in a later step of the same iteration), k = occurrence."""
        seen: dict[str, int] = {}
        renamed = []
        for trajectory in trajectories:
            k = seen[trajectory.task_id] = seen.get(trajectory.task_id, -1) + 1
            suffix = f"-p{process}" if process else ""
            renamed.append(replace(trajectory, sample_index=k,
                                   id=f"{trajectory.task_id}-i{self.iteration}-s{step}{suffix}-k{k}"))
        return tuple(renamed)


def task_dataset(tasks: Sequence[Task]) -> Any:
    """TRL's dataset: one row per task, the prompt being the task id (our rollout_func renders the real prompt)."""
    from datasets import Dataset

    if not tasks:
        raise TrainingError("no tasks to train on")
    return Dataset.from_dict({"prompt": [task.id for task in tasks]})


def slot_name(index: int) -> str:
    return f"slot-{index}"


def slot_dataset(count: int) -> Any:
    """The loop's dataset: `count` slots whose tasks change every iteration (`EnvRollouts.assign_slots`). One pass
    over it (an epoch of TRL's sampler) is one iteration: count = prompts_per_step x steps / passes_per_batch."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [slot_name(i) for i in range(count)]})


def checkpointing_argument(config_class: Any) -> str:
    """`activation_checkpointing` (transformers >= 5.21) or `gradient_checkpointing` (5.20 and before)."""
    import inspect

    parameters = inspect.signature(config_class).parameters
    return "activation_checkpointing" if "activation_checkpointing" in parameters else "gradient_checkpointing"


def grpo_args(config: Config, output_dir: Path, num_processes: int = 1) -> Any:
    """Our config -> `trl.GRPOConfig`. One generation per optimizer step: all prompts_per_step x K trajectories
    are rolled out together, then consumed in micro-batches with gradient accumulation."""
    from trl import GRPOConfig

    from coevolve.policy.models import pick_device

    grpo, rollout_section, run, vllm = config.grpo, config.rollout, config.run, config.vllm
    micro, accumulation = micro_batches(config, num_processes)
    device = pick_device(config.model.device)
    dtype = config.model.dtype
    if dtype == "auto":
        dtype = "bfloat16" if grpo.bf16 else "float32"
    return GRPOConfig(
        output_dir=str(output_dir / CHECKPOINTS),
        seed=run.seed,
        max_steps=run.max_steps,
        save_strategy="steps",
        save_steps=run.save_steps,
        save_total_limit=run.save_total_limit,
        logging_steps=run.logging_steps,
        report_to=list(run.report_to) or "none",
        run_name=output_dir.name,  # trackio and W&B: one tracker run per CoEvolve run, continued by a resume
        use_cpu=device == "cpu",
        bf16=grpo.bf16,
        fp16=False,
        model_init_kwargs={"dtype": dtype},
        learning_rate=grpo.learning_rate,
        lr_scheduler_type=grpo.lr_scheduler,
        warmup_steps=grpo.warmup_steps,
        weight_decay=grpo.weight_decay,
        max_grad_norm=grpo.max_grad_norm,
        # TRL's default is True. transformers renamed the argument after 5.20 (the GPU hosts' pin, which vLLM 0.33
        # requires); 5.24 reads the old name only as a deprecated alias, with a warning.
        **{checkpointing_argument(GRPOConfig): grpo.gradient_checkpointing},
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=accumulation,
        steps_per_generation=accumulation,
        num_generations=rollout_section.group_size,
        num_iterations=grpo.passes_per_batch,  # TRL's name for the passes over one batch (mu)
        max_completion_length=rollout_section.max_episode_tokens,
        temperature=rollout_section.temperature,
        top_p=rollout_section.top_p,
        top_k=rollout_section.top_k,
        beta=grpo.beta,
        use_bias_correction_kl=grpo.kl_importance_correction,
        epsilon=grpo.epsilon_low,
        epsilon_high=grpo.epsilon_high,
        loss_type=LOSS_TYPES[grpo.loss_normalisation],
        scale_rewards=grpo.scale_rewards,
        mask_truncated_completions=False,  # we mask truncation ourselves, from the rollout record
        disable_dropout=True,
        use_vllm=vllm.enabled,
        vllm_mode=vllm.mode,
        vllm_gpu_memory_utilization=vllm.gpu_memory_utilization,
        vllm_tensor_parallel_size=vllm.tensor_parallel_size,
        vllm_max_model_length=vllm.max_model_length,
        vllm_server_base_url=vllm.server_base_url,
        vllm_enable_sleep_mode=vllm.enable_sleep_mode,
        dataloader_num_workers=0,
        log_completions=False,
    )


def lora_config(config: Config) -> Any:
    if not config.lora.enabled:
        return None
    from peft import LoraConfig

    target = config.lora.target_modules
    return LoraConfig(r=config.lora.r, lora_alpha=config.lora.alpha, lora_dropout=config.lora.dropout,
                      target_modules=target if isinstance(target, str) else list(target), task_type="CAUSAL_LM")


def _compact_scoring_on_cpu(enabled: bool) -> None:
    """TRL's fused LM head scores every position of the sequence, prompt included, unless the device runs Triton:
    elsewhere it keeps tile shapes fixed to spare Neuron devices a recompilation per batch. A CPU has nothing to
    recompile, and with ~900-token prompts and ~100 completion tokens, full-vocabulary scores of the prompt are
    most of a CPU step. So on CPU we take TRL's own compact path (select the labelled positions, score those);
    the log-probabilities are the same (the other positions are zeroed either way). `grpo.compact_scoring_on_cpu:
    false` puts TRL's own choice back (the benchmark's baseline)."""
    import trl.trainer.utils as trl_utils

    original = getattr(trl_utils._use_triton, "__wrapped__", trl_utils._use_triton)

    def use_compact(device: Any) -> bool:
        return (enabled and device.type == "cpu") or original(device)

    use_compact.__wrapped__ = original  # type: ignore[attr-defined]
    trl_utils._use_triton = use_compact


def _trainer_class() -> type:
    import torch
    from trl import GRPOTrainer
    from trl.trainer.grpo_trainer import split_pixel_values_by_grid, split_tensor_dict, unsplit_pixel_values_by_grid

    from coevolve.prefix import flat_groups_last, permuted, score_in_chunks, step_prefix_of, zero_gradient_loss

    class CoevolveGRPOTrainer(GRPOTrainer):
        """TRL's trainer, with a task order that survives a resume, and (in one process) less work for the same
        gradient: whole groups per micro-batch (`_prepare_inputs`), the shared prompt prefix scored once
        (`_get_per_token_logps_and_entropies`), flat micro-batches skipped (`compute_loss`).

        TRL's sampler draws each epoch's shuffle from one generator seeded once, so the order of epoch e depends on
        how many epochs this process drew before: a run resumed in its second epoch replays the first epoch's
        order. transformers calls `set_epoch(e)` on the sampler at every epoch (after a resume too), so reseeding
        there makes the order a function of (seed, epoch) alone, and the resumed run sees the tasks the
        uninterrupted one would have."""

        def _get_train_sampler(self, dataset: Any = None) -> Any:
            sampler = super()._get_train_sampler(dataset)
            if getattr(sampler, "shuffle", False) and getattr(sampler, "seed", None) is not None:
                seed = sampler.seed
                sampler.set_epoch = lambda epoch: sampler.generator.manual_seed(seed + epoch)
            return sampler

        def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                               batch_size=None, compute_entropy=False, compute_aux_loss=False,
                                               **multimodal):
            """TRL's scoring, with the prompt prefix a micro-batch shares computed once (`coevolve.prefix`)."""
            base = super()._get_per_token_logps_and_entropies
            if not self.shared_prefix_enabled() or compute_aux_loss or any(v is not None for v in multimodal.values()):
                return base(model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                            compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **multimodal)
            # The step's prefix only where the weights' backward follows (the loss, not a no-grad pass).
            step = self.coevolve_step_prefix if torch.is_grad_enabled() and model.training else None
            return score_in_chunks(base, model, input_ids, attention_mask, logits_to_keep,
                                   batch_size or input_ids.size(0), compute_entropy, self.accelerator.autocast,
                                   (step, self.state.global_step) if step is not None else None)

        def _prepare_inputs(self, generation_batch):
            """TRL's buffering of one generation into micro-batches, with its random shuffle replaced by
            `flat_groups_last`: groups stay whole, those with a learning signal first. With one optimizer step per
            generation (how `grpo_args` sets TRL up) the step's gradient is a sum over micro-batches, so their
            composition changes nothing but the work: a micro-batch of one group shares its whole prompt
            (`coevolve.prefix`) and a micro-batch of flat groups is skipped (`compute_loss`)."""
            if not self.model.training or not self.single_process():
                return super()._prepare_inputs(generation_batch)
            generate_every = self.args.steps_per_generation * self.num_iterations
            if self._step % generate_every == 0 or self._buffered_inputs is None:
                batch = self._generate_and_score_completions(generation_batch)
                batch = split_pixel_values_by_grid(batch)
                order = flat_groups_last(batch["advantages"], self.coevolve_group_size)
                batch = {key: permuted(value, order) for key, value in batch.items()}
                self.coevolve_step_prefix = (step_prefix_of(batch["prompt_ids"], batch["prompt_mask"])
                                             if self.coevolve_share_step_prefix and self.shared_prefix_enabled()
                                             else None)
                self._buffered_inputs = [unsplit_pixel_values_by_grid(part)
                                         for part in split_tensor_dict(batch, self.args.steps_per_generation)]
            return self._buffered_inputs[self._step % self.args.steps_per_generation]

        def training_step(self, model, inputs, num_items_in_batch):
            """TRL's step; after an optimizer step's last micro-batch, the step prefix's one backward pass
            (`coevolve.prefix.StepPrefix`), before transformers clips the gradient and steps the optimizer."""
            output = super().training_step(model, inputs, num_items_in_batch)
            if self.coevolve_step_prefix is not None and self._step % self.args.gradient_accumulation_steps == 0:
                self.coevolve_step_prefix.backward()
            return output

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            """TRL's loss, except that a micro-batch whose advantages are all zero (every group in it scored alike)
            is not run through the model when nothing else is in the loss (beta = 0, no entropy bonus, no MoE
            auxiliary loss): its clipped-surrogate loss is exactly 0 and so is its gradient. Every trainable weight
            still gets its (zero) gradient, as TRL's would (`zero_gradient_loss`): AdamW's moments then move as
            they would have."""
            flat = (self.coevolve_skip_flat and self.single_process() and self.beta == 0.0
                    and not self._entropy_bonus_enabled and not self.aux_loss_enabled and not return_outputs
                    and not bool(inputs["advantages"].ne(0).any()))
            self._metrics["train"]["skipped_flat_micro_batches"].append(float(flat))
            if flat:
                return zero_gradient_loss(model)
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)

        def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
            """TRL's load, skipped when the model in memory holds exactly the checkpoint's weights: the previous
            `train()` call of this process trained them and saved that checkpoint (`train_steps`). The optimizer,
            scheduler and RNG state still come from the checkpoint."""
            if model is None and self.coevolve_weights_at == checkpoint_step(Path(resume_from_checkpoint)):
                return None
            return super()._load_from_checkpoint(resume_from_checkpoint, model)

        def _save_checkpoint(self, model, trial):
            """transformers' save, or under `run.async_save` a snapshot written in the background
            (`coevolve.train.checkpoints`)."""
            if self.coevolve_writer is None or trial is not None:  # `writer_for` kept collective saves
                return super()._save_checkpoint(model, trial)
            self.coevolve_writer.save(self)

        def _load_optimizer_and_scheduler(self, checkpoint):
            """transformers' load, or for the checkpoint still being written under `run.async_save` its optimizer
            state from the copy in memory (`coevolve.train.checkpoints.load_in_flight`)."""
            if not load_in_flight(self, checkpoint):
                super()._load_optimizer_and_scheduler(checkpoint)

        def create_optimizer(self, model=None):
            """TRL's AdamW, on fp32 copies of the weights under `grpo.master_weights` (`coevolve.master_weights`)."""
            from coevolve.master_weights import MasterWeightAdamW, with_master_weights

            optimizer = super().create_optimizer(model) if model is not None else super().create_optimizer()
            inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper, from an earlier train() call
            if self.coevolve_master_weights and not isinstance(inner, MasterWeightAdamW):
                self.optimizer = optimizer = with_master_weights(optimizer)
            return optimizer

        coevolve_skip_flat = True
        coevolve_shared_prefix = True
        coevolve_share_step_prefix = True
        coevolve_step_prefix = None  # the generation batch's `StepPrefix` (None: off, or too short to share)
        coevolve_master_weights = False
        coevolve_writer: CheckpointWriter | None = None
        coevolve_weights_at: int | None = None
        """The checkpoint step whose weights the model holds in memory (set by `train_steps`)."""

        def single_process(self) -> bool:
            return (self.accelerator.num_processes == 1 and not self.is_deepspeed_enabled
                    and not self.is_fsdp_enabled)

        def shared_prefix_enabled(self) -> bool:
            # Two forward calls before one backward: fine in one process; DDP/DeepSpeed/FSDP wrappers expect one.
            # Gradient checkpointing turns the key/value cache off.
            return (self.coevolve_shared_prefix and self.single_process()
                    and not getattr(self.args, "activation_checkpointing", False)
                    and not getattr(self.args, "gradient_checkpointing", False))

    return CoevolveGRPOTrainer


def build_trainer(config: Config, output_dir: Path, model_path: str, tokenizer: Any, rollouts: EnvRollouts,
                  tasks: Sequence[Task], callbacks: Sequence[Any] = (), dataset: Any = None) -> Any:
    """A `trl.GRPOTrainer` whose rollouts are ours and whose reward is the env score; its dataset is `dataset`
    (the loop's slots) or one row per task."""
    from accelerate import PartialState

    check_trl()
    _compact_scoring_on_cpu(config.grpo.compact_scoring_on_cpu)
    args = grpo_args(config, output_dir, PartialState().num_processes)
    trainer = _trainer_class()(
        model=model_path,
        reward_funcs=graded_reward if config.grpo.reward == "graded" else env_score_reward,
        args=args,
        train_dataset=dataset if dataset is not None else task_dataset(tasks),
        processing_class=tokenizer,
        peft_config=lora_config(config),
        rollout_func=rollouts,
        callbacks=list(callbacks),
    )
    trainer.coevolve_group_size = config.rollout.group_size  # K, ours; TRL's num_generations was set from it
    if trainer.num_generations != trainer.coevolve_group_size:
        raise TrainingError(f"TRL groups {trainer.num_generations} rollouts, rollout.group_size is "
                            f"{trainer.coevolve_group_size}")
    trainer.coevolve_shared_prefix = config.grpo.shared_prefix
    trainer.coevolve_share_step_prefix = config.grpo.shared_step_prefix
    trainer.coevolve_skip_flat = config.grpo.skip_flat_micro_batches
    trainer.coevolve_master_weights = config.grpo.master_weights
    trainer.coevolve_writer = writer_for(trainer) if config.run.async_save else None
    check_trainer(trainer)
    if config.grpo.ref_model and config.grpo.beta > 0:
        _replace_reference(trainer, config)
    return trainer


def _replace_reference(trainer: Any, config: Config) -> None:
    """Use `grpo.ref_model` as pi_ref instead of the initial policy (prepared the way TRL prepares its own)."""
    from trl.models import prepare_deepspeed, prepare_fsdp
    from trl.trainer.utils import add_fused_lm_head, create_model_from_path, disable_dropout_in_model

    from coevolve.policy.models import resolve_model

    if config.lora.enabled:
        raise ConfigError("grpo.ref_model: with LoRA the reference is the base model (adapter disabled); unset it")
    reference = create_model_from_path(resolve_model(config.grpo.ref_model), **trainer.args.model_init_kwargs)
    disable_dropout_in_model(reference)
    add_fused_lm_head(reference, temperature=trainer.temperature,
                      cast_lm_head_to_fp32=trainer.args.cast_lm_head_to_fp32)
    if trainer.is_deepspeed_enabled:
        reference = prepare_deepspeed(reference, trainer.accelerator)
    elif trainer.is_fsdp_enabled:
        reference = prepare_fsdp(reference, trainer.accelerator)
    else:
        reference = trainer.accelerator.prepare_model(reference, evaluation_mode=True)
    trainer.ref_model = reference


# ---------------------------------------------------------------------------------------------------------------
# The seam: what of TRL's and transformers' private surface we override or read, checked at start
# ---------------------------------------------------------------------------------------------------------------

TRL_SUPPORTED = ("1.16.0", "1.17.0")
"""TRL versions this adapter is written against: at least the first, below the second (requirements pin 1.16.0)."""
TRL_SEAM = {
    "trl.trainer.utils": ("_use_triton", "create_model_from_path", "add_fused_lm_head", "disable_dropout_in_model"),
    "trl.trainer.grpo_trainer": ("GRPOTrainer", "split_pixel_values_by_grid", "split_tensor_dict",
                                 "unsplit_pixel_values_by_grid"),
    "trl.models": ("unwrap_model_for_generation", "prepare_deepspeed", "prepare_fsdp"),
}
"""Module -> the names we import from it (private ones included)."""
OVERRIDDEN = {
    "_get_train_sampler": ("dataset",),
    "_get_per_token_logps_and_entropies": ("model", "input_ids", "attention_mask", "logits_to_keep", "batch_size",
                                           "compute_entropy", "compute_aux_loss"),
    "_prepare_inputs": ("generation_batch",),
    "_generate_and_score_completions": (),
    "compute_loss": ("model", "inputs", "return_outputs", "num_items_in_batch"),
    "training_step": ("model", "inputs", "num_items_in_batch"),
    "_load_from_checkpoint": ("resume_from_checkpoint",),
    "_save_checkpoint": ("model", "trial"),
    "_load_optimizer_and_scheduler": ("checkpoint",),
    "_save_rng_state": ("output_dir",),
}
"""GRPOTrainer methods we override or call -> the parameters we pass or take."""
TRAINER_ATTRIBUTES = ("_step", "_buffered_inputs", "_metrics", "_entropy_bonus_enabled", "aux_loss_enabled",
                      "num_generations", "num_iterations", "beta", "use_vllm", "hp_search_backend")
"""Attributes of a built GRPOTrainer we read."""


def check_trl() -> None:
    """Refuse, with the versions named, a TRL whose private surface is not the one this adapter overrides."""
    import importlib
    import inspect

    import trl
    from packaging.version import Version

    low, high = TRL_SUPPORTED
    where = f"coevolve's GRPO adapter supports trl >={low},<{high} (requirements pin {low}); installed: {trl.__version__}"
    missing = [f"{module}.{name}" for module, names in TRL_SEAM.items()
               for name in names if not hasattr(importlib.import_module(module), name)]
    from trl import GRPOTrainer

    for method, parameters in OVERRIDDEN.items():
        function = getattr(GRPOTrainer, method, None)
        if function is None:
            missing.append(f"GRPOTrainer.{method}")
            continue
        known = inspect.signature(function).parameters
        missing += [f"GRPOTrainer.{method}({name}=...)" for name in parameters if name not in known]
    if missing:
        raise TrainingError(f"{where}, which lacks {', '.join(missing)}")
    if not Version(low) <= Version(trl.__version__) < Version(high):
        import warnings

        warnings.warn(f"{where}; its private surface matched, so training goes on", RuntimeWarning, stacklevel=2)


def check_trainer(trainer: Any) -> None:
    missing = [name for name in TRAINER_ATTRIBUTES if not hasattr(trainer, name)]
    if missing:
        import trl

        raise TrainingError(f"coevolve's GRPO adapter supports trl >={TRL_SUPPORTED[0]},<{TRL_SUPPORTED[1]}; "
                            f"trl {trl.__version__}'s GRPOTrainer has no {', '.join(missing)}")
