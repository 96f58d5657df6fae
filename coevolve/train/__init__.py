"""TRL's one home: everything that knows `trl.GRPOTrainer` or transformers' trainer callbacks lives in this package.

- `coevolve.train.grpo`: the paper's objective on TRL: the rollout hook (`EnvRollouts`, TRL's `rollout_func` over
  our multi-turn engine), the trainer subclass, `GRPOConfig` from our config, the seam of TRL's private surface
  checked at start;
- `coevolve.train.calls`: one `trainer.train()` call per iteration (`train_steps`), every callback (metrics, step
  clock, checkpoint config, the console's bar), checkpoint I/O, and `attach_trainer`, which builds a run's trainer;
- `coevolve.train.checkpoints`: checkpoints written by a background thread from a copy (`run.async_save`).
The loop (`coevolve.loop`) calls these and holds the algorithm only; a verl backend would be another such package.
"""

from coevolve.train.grpo import (LOSS_TYPES, OVERRIDDEN, TRAINER_ATTRIBUTES, TRL_SEAM, TRL_SUPPORTED, EnvRollouts,
                                 TrainingError, build_trainer, check_trainer, check_trl, checkpointing_argument,
                                 env_score_reward, graded_reward, grpo_args, lora_config, slot_dataset, slot_name,
                                 task_dataset)

__all__ = ["LOSS_TYPES", "OVERRIDDEN", "TRAINER_ATTRIBUTES", "TRL_SEAM", "TRL_SUPPORTED", "EnvRollouts", "TrainingError",
           "build_trainer", "check_trainer", "check_trl", "checkpointing_argument", "env_score_reward", "graded_reward",
           "grpo_args", "lora_config", "slot_dataset", "slot_name", "task_dataset"]
