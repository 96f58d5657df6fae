"""What one `trainer.train()` call per CoEvolve iteration costs, against one call over all the steps, in one run.

Question: the loop (`coevolve.loop.grpo_steps`) trains each iteration's steps with its own `trainer.train()` call,
resumed from the checkpoint the previous call saved at its last step (`coevolve.train.train_steps`), so that one
iteration reads as one function. TRL's own way is one `train()` call over every step, with the loop's phases in a
callback. What does the per-iteration call cost (checkpoint reload: weights, optimizer, scheduler, RNG; the
trainer's set-up), and does it train the very same thing?

Method: the same config, model, tasks and seeds, two trainers built the same way in this process:
- `one call`: `train_steps(trainer, dir, S)` once (S = `--steps`),
- `per iteration`: `train_steps(trainer, dir, s)` for s = I, 2I, ..., S (I = `--steps-per-iteration`).
Both save a checkpoint at every iteration's end (`run.save_steps` = I: the loop does so in either design). Wall
seconds of the training calls only, and of the checkpoint reload inside them (`_load_from_checkpoint` + `_load_optimizer_and_scheduler` +
`_load_rng_state`, timed by wrapping them); the rollouts and final weights are compared for equality.
Model: the shipped SmolLM2-135M (`--model smollm2`, the quickstart's) or a random tiny Llama (`--model tiny`).

Usage: `python bench/loop_calls.py [--model smollm2|tiny] [--steps 8] [--steps-per-iteration 2] [--no-write]`;
writes the `loop_calls` section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("COEVOLVE_CACHE", str(Path(__file__).resolve().parent.parent / ".cache"))
warnings.filterwarnings("ignore")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import machine_line, write_section  # noqa: E402

RELOADS = ("_load_from_checkpoint", "_load_optimizer_and_scheduler", "_load_rng_state")


def model_folder(name: str, scratch: Path) -> str:
    from coevolve.policy.models import build_tiny_model, load_tokenizer, shipped_model_dir

    if name == "smollm2":
        return str(shipped_model_dir())
    tokenizer = load_tokenizer(str(shipped_model_dir()))
    model = build_tiny_model(tokenizer)
    model.save_pretrained(scratch / "tiny")
    tokenizer.save_pretrained(scratch / "tiny")
    return str(scratch / "tiny")


def train(config, model_dir: str, directory: Path, stops: list[int]) -> dict:
    import torch

    from coevolve.envs.bfcl_lite import BFCLLiteEnv
    from coevolve.policy.chat import ChatRenderer, build_demonstrations
    from coevolve.policy.models import load_tokenizer
    from coevolve.train import EnvRollouts, build_trainer
    from coevolve.train.calls import train_steps

    env = BFCLLiteEnv("train")
    tasks = env.tasks()
    demos = build_demonstrations(env, tasks, "python", 4, "coverage")
    tokenizer = load_tokenizer(model_dir)
    renderer = ChatRenderer(tokenizer, "python", demonstrations=demos, tool_style="signatures")
    seen: list = []
    rollouts = EnvRollouts(env, tasks[8:], renderer, config.rollout.engine(), seed=config.run.seed,
                           on_step=lambda record: seen.append([(t.id, t.score) for t in record.trajectories]))
    trainer = build_trainer(config, directory, model_dir, tokenizer, rollouts, tasks[8:8 + config.grpo.prompts_per_step
                                                                                       * config.loop.steps_per_iteration])
    reload_seconds = [0.0]
    for name in RELOADS:  # time the checkpoint reload inside train()
        original = getattr(trainer, name)

        def timed(*args, _original=original, **kwargs):
            started = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                reload_seconds[0] += time.perf_counter() - started

        setattr(trainer, name, timed)
    started = time.perf_counter()
    for stop in stops:
        train_steps(trainer, directory, stop)
    seconds = time.perf_counter() - started
    weights = {name: value.detach().clone() for name, value in trainer.model.state_dict().items()}
    return {"seconds": seconds, "reload": reload_seconds[0], "rollouts": seen, "weights": weights,
            "equal_to": lambda other: all(torch.equal(weights[k], other[k]) for k in weights)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2", choices=("smollm2", "tiny"))
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--steps-per-iteration", type=int, default=2)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    from coevolve.config import load_config

    scratch = Path(tempfile.mkdtemp(prefix="coevolve-bench-loop-"))
    model_dir = model_folder(args.model, scratch)
    iteration = args.steps_per_iteration
    config = load_config(Path(__file__).resolve().parent.parent / "configs" / "quickstart.yaml", [
        f"model.name={model_dir}", "model.device=cpu", f"run.max_steps={args.steps}",
        f"run.save_steps={iteration}",  # both designs checkpoint at every iteration's end, as the loop does
        f"loop.steps_per_iteration={iteration}"])
    stops = list(range(iteration, args.steps + 1, iteration))
    whole = train(config, model_dir, scratch / "one", [args.steps])
    split = train(config, model_dir, scratch / "per-iteration", stops)
    same = split["rollouts"] == whole["rollouts"] and split["equal_to"](whole["weights"])
    calls = len(stops)
    overhead = (split["seconds"] - whole["seconds"]) / max(1, calls - 1)
    print(f"one call {whole['seconds']:.1f} s (reload {whole['reload']:.2f} s); {calls} calls {split['seconds']:.1f} s "
          f"(reload {split['reload']:.2f} s); same rollouts and weights: {same}")
    text = "\n".join([
        "## One `train()` call per iteration vs one call over all steps (`bench/loop_calls.py`)",
        "",
        "Question: the loop trains each iteration with its own `trainer.train()` call, resumed from the checkpoint "
        "the previous call saved (so one iteration is one function). What does that cost next to TRL's one call, "
        "and does it train the same thing?",
        "",
        f"Command: `python bench/loop_calls.py --model {args.model} --steps {args.steps} --steps-per-iteration "
        f"{iteration}` (the quickstart's config and prompt; {machine_line()})",
        "",
        "| | training calls | wall seconds | checkpoint reload seconds | ratio |",
        "|---|---|---|---|---|",
        f"| one call over {args.steps} steps (baseline) | 1 | {whole['seconds']:.1f} | {whole['reload']:.2f} | 1.000 |",
        f"| one call per iteration of {iteration} steps | {calls} | {split['seconds']:.1f} | {split['reload']:.2f} | "
        f"{split['seconds'] / whole['seconds']:.3f} |",
        "",
        f"Same rollouts, step for step, and bit-identical weights after the last step: **{same}**. Extra wall "
        f"seconds per additional call: {overhead:.2f} (of which reloading the checkpoint: "
        f"{(split['reload'] - whole['reload']) / max(1, calls - 1):.2f}). The reload grows with the model and its "
        "optimizer state (AdamW keeps two fp32 moments per weight), so on a multi-billion-parameter model it is "
        "seconds to a minute per iteration: small next to an iteration of GPU steps, but not free.",
    ])
    if not args.no_write:
        write_section("loop_calls", text)
    print(text)


if __name__ == "__main__":
    main()
