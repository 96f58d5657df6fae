"""GRPO training through TRL on CPU: a static run on BFCL-lite tasks, LoRA, checkpoints, and resume after SIGKILL."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coevolve.config import load_config
from coevolve.loop import run
from coevolve.train import LOSS_TYPES, grpo_args
from support import ls_tasks, write_tasks

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "lite-static.yaml"


def overrides(model_dir: Path, tasks_file: Path, *extra: str) -> list[str]:
    """A small static run: 4 `ls()` tasks, 2 per step, K=4, short replies, a large learning rate (so weights move)."""
    return [
        f"model.name={model_dir}", "model.demos=0", "model.device=cpu", f"env.tasks_file={tasks_file}",
        "rollout.group_size=4", "rollout.max_new_tokens=12", "rollout.max_replies_per_turn=1",
        "rollout.max_episode_tokens=64", "rollout.temperature=1.0", "grpo.prompts_per_step=2",
        "grpo.learning_rate=1e-3", "run.seed=0", "loop.eval_limit=4", *extra,
    ]


@pytest.fixture()
def tasks_file(tmp_path) -> Path:
    return write_tasks(ls_tasks(4), tmp_path / "tasks.jsonl")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_grpo_args_carry_the_papers_knobs(tmp_path):
    config = load_config(None, ["rollout.group_size=8", "grpo.prompts_per_step=4", "grpo.micro_batch_size=16",
                                "grpo.epsilon_low=0.2", "grpo.epsilon_high=0.28", "grpo.beta=0.04",
                                "grpo.learning_rate=3e-6", "rollout.temperature=0.9", "model.device=cpu"])
    args = grpo_args(config, tmp_path)
    assert (args.num_generations, args.epsilon, args.epsilon_high, args.beta) == (8, 0.2, 0.28, 0.04)
    assert args.loss_type == "dapo" and args.scale_rewards == "group" and not args.use_bias_correction_kl
    assert args.learning_rate == 3e-6 and args.temperature == 0.9
    # 4 tasks x 8 rollouts = 32 trajectories per step: one generation, two micro-batches of 16 accumulated.
    assert args.generation_batch_size == 32 and args.per_device_train_batch_size == 16
    assert args.gradient_accumulation_steps == args.steps_per_generation == 2
    assert {LOSS_TYPES[name] for name in ("tokens", "sequence", "constant")} == {"dapo", "grpo", "dr_grpo"}


def test_static_run_trains_and_leaves_a_readable_run_directory(tmp_path, ls_policy_dir, tasks_file):
    out = tmp_path / "run"
    result = run(None, overrides(ls_policy_dir, tasks_file, "run.max_steps=2", "run.save_steps=2"), str(out))
    assert (result.start_step, result.final_step) == (0, 2)
    metrics = read_jsonl(out / "steps.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(math.isfinite(m["loss"]) for m in metrics)
    assert any(m["rollout/mixed_groups"] > 0 and m["grad_norm"] > 0 for m in metrics)  # something to learn from
    rollouts = read_jsonl(out / "rollouts.jsonl")
    assert len(rollouts) == 2 * 2 * 4 and {r["step"] for r in rollouts} == {1, 2}
    assert all("completion_ids" not in r and r["task_id"] for r in rollouts)
    before, after = weights(ls_policy_dir), weights(out / "final")
    changed = [name for name in before if not (before[name] == after[name]).all()]
    assert changed, "no parameter changed after two GRPO steps"
    assert (out / "checkpoints" / "checkpoint-2" / "optimizer.pt").exists()
    resolved = load_config(out / "config.yaml")
    assert resolved.run.max_steps == 2 and resolved.env.tasks_file == str(tasks_file)
    assert json.loads((out / "summary.json").read_text())["steps"] == 2


def test_lora_trains_an_adapter_and_leaves_the_base_alone(tmp_path, ls_policy_dir, tasks_file):
    from safetensors.torch import load_file

    out = tmp_path / "lora"
    run(None, overrides(ls_policy_dir, tasks_file, "run.max_steps=1", "run.save_steps=1", "lora.enabled=true",
                        "lora.r=4", "lora.alpha=8", "lora.dropout=0.0"), str(out))
    adapter = load_file(str(out / "final" / "adapter_model.safetensors"))
    lora_b = [tensor for name, tensor in adapter.items() if "lora_B" in name]
    assert lora_b and any(t.abs().max() > 0 for t in lora_b)  # B starts at zero: nonzero means it trained
    assert not (out / "final" / "model.safetensors").exists()


def test_existing_run_needs_resume(tmp_path, ls_policy_dir, tasks_file):
    from coevolve.config import ConfigError

    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    with pytest.raises(ConfigError, match="--resume"):
        run(None, overrides(ls_policy_dir, tasks_file), str(out))


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "coevolve.cli", "train", *args]


def test_resume_after_sigkill_continues_exactly(tmp_path, ls_policy_dir, tasks_file):
    """Kill the trainer between checkpoints (after step 3's rollouts, checkpoint at 2), resume, and compare with a
    run that was never interrupted: same steps, same rollouts (data position and sampling), same final weights
    (which the optimizer's and scheduler's restored state determine)."""
    settings = overrides(ls_policy_dir, tasks_file, "run.max_steps=4", "run.save_steps=2",
                         "grpo.lr_scheduler=linear")
    reference = tmp_path / "reference"
    run(str(CONFIG), settings, str(reference))

    killed = tmp_path / "killed"
    process = subprocess.Popen(cli("--config", str(CONFIG), "--output-dir", str(killed), *settings), cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = killed / "rollouts.jsonl"
    deadline = time.time() + 300
    try:
        while time.time() < deadline and process.poll() is None:
            if log.exists() and '"step": 3' in log.read_text():
                break
            time.sleep(0.05)
        assert process.poll() is None, "the run ended before it could be killed"
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert not (killed / "checkpoints" / "checkpoint-4").exists()
    assert json.loads((killed / "checkpoints" / "checkpoint-2" / "trainer_state.json").read_text())["global_step"] == 2

    resumed = subprocess.run(cli("--output-dir", str(killed), "--resume"), cwd=REPO, capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "trained steps 3..4" in resumed.stdout

    assert [m["step"] for m in read_jsonl(killed / "steps.jsonl")] == [1, 2, 3, 4]
    assert [m["iteration"] for m in read_jsonl(killed / "metrics.jsonl")] == [0, 1]
    keep = ("id", "step", "task_id", "sample_index", "score")
    got = [{k: r[k] for k in keep} for r in read_jsonl(killed / "rollouts.jsonl")]
    want = [{k: r[k] for k in keep} for r in read_jsonl(reference / "rollouts.jsonl")]
    assert got == want  # no step lost or duplicated; the same tasks in the same order, sampled alike
    final, expected = weights(killed / "final"), weights(reference / "final")
    assert all((final[name] - expected[name]).abs().max() < 1e-5 for name in expected)

    # A finished run resumed again has nothing to do; raising max_steps continues it (never a silent zero-step run).
    again = subprocess.run(cli("--output-dir", str(killed), "--resume"), cwd=REPO, capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0 and "nothing to train" in again.stdout


def test_cli_reports_config_errors(tmp_path):
    bad_key = subprocess.run(cli("--config", str(CONFIG), "grpo.learnig_rate=1",
                                 "--output-dir", str(tmp_path / "a")), capture_output=True, text=True, timeout=120)
    assert bad_key.returncode == 2 and "learnig_rate" in bad_key.stderr and "Traceback" not in bad_key.stderr
    no_config = subprocess.run(cli(), capture_output=True, text=True, timeout=120)
    assert no_config.returncode == 2 and "--config" in no_config.stderr


def test_a_run_that_trains_no_step_is_an_error(tmp_path, ls_policy_dir, tasks_file, monkeypatch):
    """The failure a resumed run is known for (it believes it is done and trains nothing) must not pass silently:
    simulated here by a trainer whose `train()` returns without a step."""
    import trl

    from coevolve.train import TrainingError

    monkeypatch.setattr(trl.GRPOTrainer, "train", lambda self, **kwargs: None)
    with pytest.raises(TrainingError, match=r"iteration 1 trained to step 0, not 2"):
        run(str(CONFIG), overrides(ls_policy_dir, tasks_file, "run.max_steps=2"), str(tmp_path / "run"))


def test_checkpointing_argument_follows_the_installed_transformers_name():
    from trl import GRPOConfig

    from coevolve.train import checkpointing_argument

    class Old:  # transformers <= 5.20
        def __init__(self, gradient_checkpointing=False): ...

    class New:
        def __init__(self, activation_checkpointing=False, gradient_checkpointing=None): ...

    assert checkpointing_argument(Old) == "gradient_checkpointing"
    assert checkpointing_argument(New) == "activation_checkpointing"
    assert checkpointing_argument(GRPOConfig) == "activation_checkpointing"  # transformers 5.24, our CPU pin


@pytest.mark.parametrize("precision", [(), ("model.dtype=bfloat16", "grpo.master_weights=true")],
                         ids=["float32", "bfloat16-master-weights"])
def test_grpo_steps_in_several_train_calls_equal_one_call(tmp_path, ls_policy_dir, tokenizer, precision):
    """The loop calls `trainer.train()` once per iteration, resumed from the checkpoint the previous call saved:
    the same rollouts and the same weights as one uninterrupted call over all the steps (in bf16 too, where the
    fp32 master weights come back from the checkpoint's optimizer state)."""
    import torch

    from coevolve.envs.bfcl_lite import BFCLLiteEnv
    from coevolve.policy.chat import ChatRenderer
    from coevolve.train import EnvRollouts, build_trainer
    from coevolve.train.calls import train_steps

    tasks = ls_tasks(4)
    config = load_config(None, overrides(ls_policy_dir, tmp_path / "unused.jsonl", "run.max_steps=4",
                                         "run.save_steps=100", "run.save_total_limit=1", *precision))

    def trained(directory: Path, stops: list[int]):
        seen = []
        rollouts = EnvRollouts(BFCLLiteEnv("train"), tasks, ChatRenderer(tokenizer, "python"),
                               config.rollout.engine(), seed=0,
                               on_step=lambda record: seen.append([(t.id, t.score) for t in record.trajectories]))
        trainer = build_trainer(config, directory, str(ls_policy_dir), tokenizer, rollouts, tasks)
        for stop in stops:
            assert train_steps(trainer, directory, stop) == stop
        return seen, {name: value.detach().clone() for name, value in trainer.model.state_dict().items()}

    import functools

    import transformers

    loads = []
    original = transformers.Trainer._load_from_checkpoint

    @functools.wraps(original)  # the adapter's seam check reads its signature
    def counted(self, *args, **kwargs):
        loads.append(args)
        return original(self, *args, **kwargs)

    transformers.Trainer._load_from_checkpoint = counted
    try:
        split_rollouts, split_weights = trained(tmp_path / "split", [2, 4])
    finally:
        transformers.Trainer._load_from_checkpoint = original
    assert loads == []  # the second call resumed from checkpoint-2 without reading back the weights it holds
    whole_rollouts, whole_weights = trained(tmp_path / "whole", [4])
    assert split_rollouts == whole_rollouts and len(split_rollouts) == 4
    assert all(torch.equal(split_weights[name], whole_weights[name]) for name in whole_weights)
    if precision:
        from safetensors.torch import load_file

        assert all(value.dtype == torch.bfloat16 for value in whole_weights.values() if value.is_floating_point())
        before = load_file(str(ls_policy_dir / "model.safetensors"))
        assert any(not torch.equal(before[name].to(torch.bfloat16), whole_weights[name]) for name in before
                   if name in whole_weights)
        saved = torch.load(tmp_path / "split" / "checkpoints" / "checkpoint-4" / "optimizer.pt", weights_only=True)
        assert all(master.dtype == torch.float32 for master in saved["coevolve_master_weights"])


def test_a_trl_without_the_private_surface_we_override_is_refused_at_start(monkeypatch):
    import trl
    from trl import GRPOTrainer

    from coevolve.train import TrainingError, check_trl

    check_trl()  # the pinned TRL has everything
    monkeypatch.delattr(GRPOTrainer, "_prepare_inputs")
    with pytest.raises(TrainingError, match=rf"supports trl >=1\.16\.0,<1\.17\.0.*{trl.__version__}.*"
                                            r"lacks GRPOTrainer\._prepare_inputs"):
        check_trl()
