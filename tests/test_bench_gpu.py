"""The GPU benchmark's plumbing on the CPU: bench/gpu.py's transformers side on a tiny model, its table (including a
failed iteration, reported rather than hidden), and bench/gpu.sh refusing a missing wheelhouse. The vLLM side needs
a GPU: tests/test_vllm_backend.py and tests/test_train_gpu.py cover it there."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SPEC = importlib.util.spec_from_file_location("bench_gpu", REPO / "bench" / "gpu.py")
bench_gpu = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench_gpu)


def test_cpu_smoke_run_writes_a_dated_section(tmp_path):
    target = tmp_path / "BENCHMARKS.md"
    done = subprocess.run([sys.executable, str(REPO / "bench" / "gpu.py"), "--device", "cpu", "--skip-vllm",
                           "--skip-train", "--model", "tiny", "--tasks", "2", "--group-size", "2",
                           "--max-new-tokens", "8", "--rounds", "1", "--out", str(tmp_path / "out"),
                           "--benchmarks", str(target)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    text = target.read_text()
    assert "<!-- bench:gpu-" in text and "CPU only" in text
    row = next(line for line in text.splitlines() if line.startswith("| transformers |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[1] == "4" and int(cells[2]) > 0 and cells[-1] == "1.00"  # 2 tasks x K=2; its own baseline


def test_table_reports_ratios_and_failed_iterations():
    args = argparse.Namespace(model="smollm2", tasks=32, group_size=8, max_new_tokens=64, rounds=2, train_steps=4,
                              device="cpu")
    rows = {"transformers": {"episodes": 256, "tokens": 10000, "seconds": 10.0, "episodes_per_s": 25.6,
                             "tokens_per_s": 1000.0},
            "vllm": {"episodes": 256, "tokens": 10400, "seconds": 2.0, "episodes_per_s": 128.0, "tokens_per_s": 5200.0}}
    iterations = {"transformers": {"seconds": 95.0, "phases": {"train": 60.0, "signals": 0.1, "synthesis": 2.0,
                                                               "eval": 20.0},
                                   "feedback_share": 0.0243, "before": 0.275, "after": 0.3},
                  "vllm": {"seconds": 12.0, "error": ["RuntimeError: CUDA out of memory"]}}
    text = bench_gpu.section(args, rows, iterations, "2026-11-30")
    assert "| vllm | 256 | 10400 | 2.00 | 128.0 | 5200 | 5.20 |" in text
    assert "| transformers | 95 | 60.0 | 0.1 | 2.0 | 20.0 | 2.4% | held-out 0.275 -> 0.300 |" in text
    assert "failed: `RuntimeError: CUDA out of memory`" in text


def test_gpu_script_refuses_a_missing_wheelhouse(tmp_path):
    done = subprocess.run(["bash", str(REPO / "bench" / "gpu.sh")], cwd=tmp_path, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "WHEELHOUSE": str(tmp_path / "nowhere"),
                               "VENV": str(tmp_path / "venv")}, timeout=60)
    assert done.returncode == 2 and "make gpu-wheels" in done.stderr
    assert not (tmp_path / "venv").exists()  # nothing was set up


def test_gpu_requirements_replace_the_base_pins_vllm_conflicts_with():
    done = subprocess.run(["bash", str(REPO / "bench" / "gpu.sh"), "--requirements"], capture_output=True,
                          text=True, timeout=60)
    pins = [line for line in done.stdout.splitlines() if line and not line.startswith("#")]
    names = [line.split("==")[0] for line in pins]
    assert done.returncode == 0 and len(names) == len(set(names))  # one pin per package
    assert "transformers==5.20.2" in pins and "numpy==2.3.5" in pins and "vllm==0.33.0" in pins
    assert "trl==1.16.0" in pins and "peft==0.21.2" in pins  # the rest of base.txt stays
    assert "trackio" not in names and "tensorboard==2.21.0" in pins  # trackio's pillow < 13 against vLLM's >= 13


def test_gpu_check_runs_on_the_cpu_at_a_tiny_size(tmp_path, smol_dir):
    """bench/gpu_check.py (the check prepared for a lent GPU with only PyTorch and transformers): its three parts
    run end to end on a tiny Qwen3 and its section reports them."""
    import json

    done = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_check.py"), "--device", "cpu", "--dtype",
                           "float32", "--sizes", "tiny", "--tasks", "2", "--group-size", "2", "--max-new-tokens", "8",
                           "--prompts-per-step", "1", "--grpo-steps", "1", "--tokenizer", str(smol_dir), "--out",
                           str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    tiny = results["sizes"]["tiny"]
    assert tiny["rollouts"]["ours_tokens"] > 0 and tiny["rollouts"]["generate_tokens"] > 0
    assert tiny["grpo"]["step_seconds"] > 0 and tiny["grpo"]["step_tokens"] > 0
    assert results["loop"]["iterations"] == [0, 1, 2]
    assert "| Qwen3 tiny |" in (tmp_path / "out" / "gpu_check.md").read_text()
