"""Zero-shot success of the offline default (shipped SmolLM2-135M-Instruct) on the BFCL-lite held-out split.

Question: before any training, how often does the offline default solve held-out BFCL-lite tasks, and which
prompt gives GRPO a usable signal? Measured before this script: 0/160 parseable calls with the tools alone in the prompt;
this script compares the prompt variants `coevolve eval` offers, on the same 40 held-out tasks:
- the reply format (BFCL's Python-call list vs Hermes `<tool_call>` JSON), and
- worked examples in the prompt (`--demos N`: train-split tasks solved by their ground truth, real tool results),
greedy, plus one sampled run (K samples at temperature T) that counts the groups with mixed outcomes, the
groups GRPO can learn from. Success is the env's binary score (BFCL state + response checks).
Usage: `python bench/zero_shot.py [--tasks 40] [--samples 4] [--temperature 0.7]`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench._report import machine_line, write_section  # noqa: E402


def run(model, tokenizer, tasks, train_env, test_env, reply_format, demos, samples, temperature):
    from coevolve.evaluate import evaluate_model
    from coevolve.policy.backends import SamplingConfig
    from coevolve.policy.chat import ChatRenderer, build_demonstrations
    from coevolve.policy.hf_backend import TransformersBackend
    from coevolve.rollout import RolloutConfig

    examples = build_demonstrations(train_env, train_env.tasks(), reply_format, demos)
    renderer = ChatRenderer(tokenizer, reply_format, demonstrations=examples)
    config = RolloutConfig(group_size=samples, max_new_tokens=64, max_replies_per_turn=3, max_episode_tokens=400,
                           sampling=SamplingConfig(temperature=temperature, seed=0))
    started = time.perf_counter()
    report, batch = evaluate_model(test_env, tasks, TransformersBackend(model, tokenizer), renderer, config, "model")
    seconds = time.perf_counter() - started
    parsed = sum(any(step.call is not None for step in t.steps) for t in batch.trajectories)
    mixed = sum(0 < sum(t.score for t in group) < len(group) for group in batch.groups())
    return {"format": reply_format, "demos": demos, "samples": samples, "temperature": temperature,
            "episodes": len(batch.trajectories), "success": report.correct, "accuracy": report.accuracy,
            "parsed": parsed, "mixed": mixed, "groups": len(batch.groups()), "seconds": seconds,
            "prompt_tokens": len(batch.trajectories[0].prompt_ids)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=40)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--sampled-tasks", type=int, default=20)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--variants", default="python:0,hermes:0,python:3,hermes:3,python:3:sampled",
                        help="comma list of FORMAT:DEMOS[:sampled]; sampled = K samples at --temperature")
    args = parser.parse_args()

    import torch

    from coevolve.envs import make_env
    from coevolve.policy.models import load_model

    torch.manual_seed(0)
    model, tokenizer = load_model("smollm2", device="cpu")
    train_env, test_env = make_env("bfcl-lite", split="train"), make_env("bfcl-lite", split="test")
    tasks = test_env.tasks()[: args.tasks]
    variants = []
    for spec in args.variants.split(","):
        reply_format, demos, *sampled = spec.split(":")
        if sampled:
            variants.append((reply_format, int(demos), args.samples, args.temperature, tasks[: args.sampled_tasks]))
        else:
            variants.append((reply_format, int(demos), 1, 0.0, tasks))
    rows = []
    for reply_format, demos, samples, temperature, chosen in variants:
        row = run(model, tokenizer, chosen, train_env, test_env, reply_format, demos, samples, temperature)
        rows.append(row)
        print(row, flush=True)
    lines = [
        "## Zero-shot: the offline default on BFCL-lite held-out",
        "",
        "Question: how often does the shipped SmolLM2-135M-Instruct solve held-out BFCL-lite tasks before any "
        "training, and which prompt gives GRPO a signal (groups with both successes and failures)?",
        "",
        f"Command: `python bench/zero_shot.py --tasks {args.tasks} --samples {args.samples} "
        f"--sampled-tasks {args.sampled_tasks} --temperature {args.temperature} --variants {args.variants}`. "
        f"Machine: {machine_line()}. "
        "Transformers backend, fp32, one reply <= 64 tokens, <= 3 replies with calls; demos are train-split tasks.",
        "",
        "| format | demos | samples x T | episodes | success | accuracy | episodes with a parsed call | mixed groups "
        "| prompt tokens | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        mixed = f"{row['mixed']}/{row['groups']}" if row["samples"] > 1 else "-"
        lines.append(f"| {row['format']} | {row['demos']} | {row['samples']} x {row['temperature']} | "
                     f"{row['episodes']} | {row['success']} | {row['accuracy']:.3f} | {row['parsed']}/{row['episodes']} "
                     f"| {mixed} | {row['prompt_tokens']} | {row['seconds']:.0f} |")
    lines += ["", "Accuracy is the env's binary score (mean over samples). Seconds are wall time on a shared 2-core "
              "machine and drift with its load; they are not a speed figure (see the rollout section)."]
    write_section("zero_shot", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
