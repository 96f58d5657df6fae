"""Rollout levers at a shipped config's own shapes: each lever on against off, in one process, same tokens.

Question (issue "a run that costs half", item 2): at the rollout shapes of `configs/quickstart.yaml` (a step's
`prompts_per_step` tasks x `group_size` samples, its reply and episode budgets, its prompt: tool signatures and
worked examples), how many seconds does a step's rollout take with each generation lever on and off, and how far
is each from the roofline at the shapes it ran (`bench/roofline.py`)?

Levers (`TransformersBackend` options; off = the code before the lever):
- `compact_in_place`: a request that leaves the batch (stop token or budget) no longer makes every remaining
  row's KV cache be copied into a newly allocated room; the kept rows move down inside the room they are in.
  Pure data movement: the tokens and log-probabilities must be identical, and this script checks they are.

Method: the config's env, training tasks and renderer (`coevolve.run_setup`), the shipped model in float32, the
config's sampling (temperature, seeded per round); per round every path rolls out the same `--steps` steps of
tasks (the first tasks of the training split, `prompts_per_step` per step) in turn; the best round per path is
reported after one warm-up step. Ratios are off / on in the same process.

Usage: `python bench/decode_levers.py [--config quickstart] [--steps 3] [--rounds 3] [--no-write]`; writes the
`decode_levers` section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import machine_line, write_section  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PATHS = {"lever off (new room per leave)": {"compact_in_place": False},
         "compact_in_place": {"compact_in_place": True}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="quickstart")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    import torch

    from bench.roofline import Counter, measure
    from coevolve.config import load_config
    from coevolve.policy.backends import SamplingConfig
    from coevolve.policy.hf_backend import TransformersBackend
    from coevolve.policy.models import load_model
    from coevolve.rollout import rollout
    from coevolve.run_setup import build_env, build_renderer, load_tasks

    config = load_config(str(REPO / "configs" / f"{args.config}.yaml"))
    env = build_env(config)
    tokenizer, renderer, tasks = build_renderer(config, env, load_tasks(config, env))
    model, _ = load_model(config.model.name, dtype="float32", device="cpu")
    model.eval()
    per_step = config.grpo.prompts_per_step
    steps = [tasks[index * per_step:(index + 1) * per_step] for index in range(args.steps + 1)]
    engine = config.rollout.engine()

    def sampled(seed: int):
        from dataclasses import replace

        return replace(engine, sampling=SamplingConfig(temperature=config.rollout.temperature,
                                                       top_p=config.rollout.top_p, top_k=config.rollout.top_k,
                                                       seed=seed))

    backends = {name: TransformersBackend(model, tokenizer, **options) for name, options in PATHS.items()}
    counters = {name: Counter(backend) for name, backend in backends.items()}
    roofline = measure(model, torch.float32)
    for backend in backends.values():  # warm-up: first-call allocations, lazy imports
        rollout(env, steps[0], backend, renderer, sampled(0))
    for counter in counters.values():
        counter.take()
    best: dict[str, dict] = {}
    outputs: dict[str, list] = {}
    for round_index in range(args.rounds):
        for name, backend in backends.items():
            started = time.perf_counter()
            batches = [rollout(env, step, backend, renderer, sampled(1000 * round_index + index))
                       for index, step in enumerate(steps[1:])]
            seconds = time.perf_counter() - started
            forwards = counters[name].take()
            tokens = [(t.completion_ids, t.logprobs) for batch in batches for t in batch.trajectories]
            if round_index == 0:
                outputs[name] = tokens
            model_tokens = sum(sum(t.completion_mask) for batch in batches for t in batch.trajectories)
            print(f"round {round_index} {name}: {seconds:.1f} s, {model_tokens} model tokens", flush=True)
            if name not in best or seconds < best[name]["seconds"]:
                best[name] = {"seconds": seconds, "forwards": forwards, "tokens": model_tokens}
    reference = next(iter(outputs.values()))
    same = {name: output == reference for name, output in outputs.items()}
    baseline = best[next(iter(PATHS))]["seconds"]
    rows = ["| path | seconds per step (best round) | model tokens | x roofline (its shapes) | off / this | "
            "tokens and logprobs identical to off |", "|---|---:|---:|---:|---:|---|"]
    for name, result in best.items():
        shaped = roofline.seconds(result["forwards"])
        rows.append(f"| {name} | {result['seconds'] / args.steps:.2f} | {result['tokens']} | "
                    f"{result['seconds'] / shaped:.2f} | {baseline / result['seconds']:.2f}x | "
                    f"{'yes' if same[name] else 'NO'} |")
    table = "\n".join(rows)
    print(table)
    command = f"python bench/decode_levers.py --config {args.config} --steps {args.steps} --rounds {args.rounds}"
    text = f"""## Rollout levers at the quickstart's shapes (`bench/decode_levers.py`)

Question: at `configs/{args.config}.yaml`'s rollout shapes ({per_step} tasks x K={config.rollout.group_size} a
step, replies of up to {config.rollout.max_new_tokens} tokens, {config.rollout.max_episode_tokens} a episode),
what does each generation lever save, against the same code with it off, in one process?

Command: `{command}` ({machine_line()}; torch {torch.__version__}, {torch.get_num_threads()} threads). The first
{args.steps} steps' tasks of the training split after one warm-up step, the config's sampling seeded per round,
best of {args.rounds} interleaved rounds. `compact_in_place`: a request leaving the batch moves the kept rows
down inside their KV room instead of copying them all into a new one (pure data movement).

{table}
"""
    if not args.no_write:
        write_section("decode_levers", text)


if __name__ == "__main__":
    main()
