"""One GRPO step with vLLM rollouts (colocated with training) on a tiny model saved locally: GPU hosts only.

Skips, saying why, without a CUDA GPU or without the `vllm` package (requirements/gpu.txt). Nothing is downloaded:
the model is built from a config and saved next to the test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parent.parent


def _skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine (the vLLM training smoke test needs one)"
    try:
        import vllm  # noqa: F401
    except ImportError:
        return "vllm is not installed (on a GPU host: bash bench/gpu.sh --setup, then run pytest with .venv-gpu)"
    return None


@pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))
def test_one_grpo_step_with_colocated_vllm_rollouts(tmp_path, tokenizer):
    from coevolve.policy.models import build_tiny_model
    from support import ls_tasks, save_model, write_tasks

    # head_dim 64 (hidden 256, 4 heads): a size vLLM's attention kernels take.
    model_dir = save_model(build_tiny_model(tokenizer, hidden_size=256, num_layers=2, seed=0, family="qwen2"),
                           tokenizer, tmp_path / "tiny-qwen2")
    tasks = write_tasks(ls_tasks(4), tmp_path / "tasks.jsonl")
    out = tmp_path / "run"
    # vLLM's colocated engine joins torch.distributed (external launcher): a one-process world.
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29533"}
    result = subprocess.run([
        sys.executable, "-m", "coevolve.cli", "train", "--config", str(REPO / "configs" / "lite-static.yaml"),
        "--output-dir", str(out), f"model.name={model_dir}", "model.demos=0", "model.device=cuda",
        f"env.tasks_file={tasks}", "run.max_steps=1", "run.save_steps=1", "rollout.max_new_tokens=16",
        "rollout.max_episode_tokens=64", "vllm.enabled=true", "vllm.mode=colocate",
        "vllm.gpu_memory_utilization=0.2", "vllm.max_model_length=2048",
    ], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    metrics = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1]
    assert metrics[0]["rollout/model_tokens"] > 0
    assert (out / "final" / "model.safetensors").exists()
