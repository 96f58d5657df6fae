"""Every shipped GPU config rehearsed on the CPU: one iteration of its mode with its model swapped for a tiny
random model of the same architecture (Qwen3, with Qwen3's chat template) and vLLM off, everything else as
shipped except the sizes (tasks per step, reply and episode lengths) that a CPU cannot afford. The AppWorld
config is rehearsed in test_appworld_world.py (it needs AppWorld's offline-built data)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coevolve.config import load_config
from coevolve.loop import run
from conftest import trl_template

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
GPU_CONFIGS = sorted(path for path in CONFIGS.glob("bfcl-*qwen*.yaml"))
CPU_SIZES = ["vllm.enabled=false", "model.device=cpu", "model.dtype=float32", "grpo.bf16=false",
             "grpo.prompts_per_step=1", "rollout.max_new_tokens=8", "rollout.max_replies_per_turn=1",
             "rollout.max_episode_tokens=128", "run.max_steps=1", "loop.steps_per_iteration=1", "loop.eval_limit=2",
             "synthesis.max_contexts=2", "synthesis.llm_max_retries=0", "synthesis.llm_timeout_seconds=2",
             "run.report_to=[]"]
"""What a CPU cannot afford of a GPU config; the rest (mode, env, reply format, K, micro-batches, loss, beta and
its reference model, gradient checkpointing, synthesis settings) runs as shipped."""


def rehearsal(config_path: Path, model_dir: Path) -> list[str]:
    return [f"model.name={model_dir}", *CPU_SIZES]


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory, tokenizer):
    """A random tiny Qwen3 saved with Qwen3's chat template (the shipped configs name Qwen/Qwen3-4B)."""
    import copy

    from coevolve.policy.models import build_tiny_model
    from support import save_model

    qwen3 = copy.deepcopy(tokenizer)
    qwen3.chat_template = trl_template("qwen3")
    return save_model(build_tiny_model(qwen3, family="qwen3"), qwen3, tmp_path_factory.mktemp("qwen3"))


def test_the_coevolve_arm_and_its_baseline_differ_only_in_the_loop_and_the_steering_switches():
    """Plain GRPO (the paper's baseline) against coevolve: the same learner; with `--paper` (coevolve.config.STEERING
    back at the paper's values) nothing but the mode differs."""
    from coevolve.config import paper_overrides

    static = load_config(CONFIGS / "bfcl-qwen3-4b.yaml")
    coevolve, paper = (load_config(CONFIGS / "bfcl-qwen3-4b-coevolve.yaml", extra) for extra in ([], paper_overrides()))
    assert (static.run.mode, coevolve.run.mode) == ("static", "coevolve")
    assert coevolve.loop.sampler == "history" and coevolve.signals.unexplored_states
    for section in ("env", "model", "rollout", "grpo", "lora", "vllm", "loop", "signals"):
        assert getattr(static, section) == getattr(paper, section), section


@pytest.mark.parametrize("path", GPU_CONFIGS, ids=[p.name for p in GPU_CONFIGS])
def test_each_gpu_config_runs_one_iteration_on_the_cpu(path, qwen3_dir, tmp_path):
    shipped = load_config(path)
    assert shipped.model.name.startswith("Qwen/Qwen3") and shipped.vllm.enabled
    out = tmp_path / path.stem
    result = run(str(path), rehearsal(path, qwen3_dir), str(out), say=lambda text: None)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert result.final_step == 1 and [m["iteration"] for m in metrics] == [0, 1]
    config = load_config(out / "config.yaml")
    assert config.run.mode == shipped.run.mode and config.rollout.group_size == shipped.rollout.group_size
    assert config.grpo.beta == shipped.grpo.beta > 0 and config.grpo.gradient_checkpointing
    assert config.model.reply_format == "hermes" and (out / "final").exists()
    # A random model fails every rollout: no signal, so nothing to explore; were there one, the absent endpoint
    # would make synthesis skip (and count) what it could not do, never stop the run.
    assert set(metrics[1]["synthesis"].get("skipped", {})) <= {"explorer_error", "endpoint_error"}


@pytest.mark.parametrize("override, message", [
    ("model.name=/nonexistent/qwen", "nonexistent"),
    ("grpo.learnig_rate=1e-6", "learnig_rate"),
    ("grpo.micro_batch_size=3", "grpo.micro_batch_size"),
])
def test_a_missing_model_a_bad_key_or_an_impossible_split_exits_2_with_one_line(override, message, tmp_path, capsys):
    from coevolve.cli import main

    code = main(["train", "--config", str(CONFIGS / "bfcl-qwen3-4b.yaml"), "--output-dir", str(tmp_path / "run"),
                 *CPU_SIZES, override])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1, err
