"""Rollout levers at a shipped config's own shapes: each lever on against off, in one process, same tokens.

Question (issue "a run that costs half", item 2): at the rollout shapes of `configs/quickstart.yaml` (a step's
`prompts_per_step` tasks x `group_size` samples, its reply and episode budgets, its prompt: tool signatures and
worked examples), how many seconds does a step's rollout take with each generation lever on and off, and how far
is each from the roofline at the shapes it ran (`bench/roofline.py`)?

Levers (`TransformersBackend` options; off = the code before the lever):
- `compact_in_place`: a request that leaves the batch (stop token or budget) no longer makes every remaining
  row's KV cache be copied into a newly allocated room; the kept rows move down inside the room they are in.
  Pure data movement: the tokens and log-probabilities must be identical, and this script checks they are.
- `split_prefix` (`coevolve.policy.prefix_attention`): the prompt prefix every request shares is held once, not
  laid into every row, and attention is split at it and merged by log-sum-exp. The same softmax up to float
  rounding: the script reports how many tokens differ from the path before it and the largest log-probability
  difference.

`--held-out N` also times one greedy pass over the first N held-out tasks per path (the loop's held-out pass:
one sample a task, every task in one batch), where the shared prefix is held by N rows at once.

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
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import machine_line, write_section  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PATHS = {"lever off (new room per leave)": {"compact_in_place": False, "split_prefix": False},
         "compact_in_place": {"compact_in_place": True, "split_prefix": False},
         "compact_in_place + split_prefix": {"compact_in_place": True, "split_prefix": True}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="quickstart")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--held-out", type=int, default=0, help="also time a greedy pass over N held-out tasks")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    import torch

    from bench.roofline import Counter, measure
    from coevolve.config import load_config
    from coevolve.policy.backends import SamplingConfig
    from coevolve.policy.hf_backend import TransformersBackend
    from coevolve.policy.models import load_model
    from coevolve.rollout import rollout
    from coevolve.run_setup import build_env, build_eval, build_renderer, load_tasks

    config = load_config(str(REPO / "configs" / f"{args.config}.yaml"))
    env = build_env(config)
    tokenizer, renderer, tasks = build_renderer(config, env, load_tasks(config, env))
    model, _ = load_model(config.model.name, dtype="float32", device="cpu")
    model.eval()
    per_step = config.grpo.prompts_per_step
    steps = [tasks[index * per_step:(index + 1) * per_step] for index in range(args.steps + 1)]
    engine = config.rollout.engine()

    def sampled(seed: int):
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
    eval_env, eval_tasks = build_eval(config, env)
    eval_tasks = eval_tasks[:args.held_out]
    greedy = replace(engine, group_size=1, sampling=SamplingConfig(temperature=0.0, seed=0))
    best: dict[str, dict] = {}
    outputs: dict[str, list] = {}
    for round_index in range(args.rounds):
        for name, backend in backends.items():
            started = time.perf_counter()
            batches = [rollout(env, step, backend, renderer, sampled(1000 * round_index + index))
                       for index, step in enumerate(steps[1:])]
            seconds = time.perf_counter() - started
            forwards = counters[name].take()
            held = None
            if eval_tasks:
                started = time.perf_counter()
                batches.append(rollout(eval_env, eval_tasks, backend, renderer, greedy))
                held = time.perf_counter() - started
                counters[name].take()
            tokens = [(t.completion_ids, t.logprobs) for batch in batches for t in batch.trajectories]
            if round_index == 0:
                outputs[name] = tokens
            model_tokens = sum(sum(t.completion_mask) for batch in batches[:args.steps] for t in batch.trajectories)
            print(f"round {round_index} {name}: {seconds:.1f} s, {model_tokens} model tokens, held-out {held} s",
                  flush=True)
            if name not in best or seconds < best[name]["seconds"]:
                best[name] = {**best.get(name, {}), "seconds": seconds, "forwards": forwards, "tokens": model_tokens}
            if held is not None and held < best[name].get("held", float("inf")):
                best[name]["held"] = held
    names = list(outputs)
    rows = ["| path | seconds per step (best round) | model tokens | x roofline (its shapes) | off / this | "
            + (f"held-out pass s ({len(eval_tasks)} tasks, greedy) | off / this | " if eval_tasks else "")
            + "tokens differing from the path above | largest logprob difference |",
            "|---|---:|---:|---:|---:|" + ("---:|---:|" if eval_tasks else "") + "---:|---:|"]
    baseline = best[names[0]]
    for index, name in enumerate(names):
        result = best[name]
        shaped = roofline.seconds(result["forwards"])
        above = outputs[names[index - 1]] if index else outputs[name]
        differing, total, gap = _compare(above, outputs[name])
        held = (f"{result['held']:.1f} | {baseline['held'] / result['held']:.2f}x | " if eval_tasks else "")
        rows.append(f"| {name} | {result['seconds'] / args.steps:.2f} | {result['tokens']} | "
                    f"{result['seconds'] / shaped:.2f} | {baseline['seconds'] / result['seconds']:.2f}x | {held}"
                    f"{differing} of {total} | {gap:.1e} |")
    table = "\n".join(rows)
    print(table)
    command = f"python bench/decode_levers.py --config {args.config} --steps {args.steps} --rounds {args.rounds}" \
        + (f" --held-out {args.held_out}" if args.held_out else "")
    text = f"""## Rollout levers at the quickstart's shapes (`bench/decode_levers.py`)

Question: at `configs/{args.config}.yaml`'s rollout shapes ({per_step} tasks x K={config.rollout.group_size} a
step, replies of up to {config.rollout.max_new_tokens} tokens, {config.rollout.max_episode_tokens} a episode),
what does each generation lever save, against the same code with it off, in one process?

Command: `{command}` ({machine_line()}; torch {torch.__version__}, {torch.get_num_threads()} threads). The first
{args.steps} steps' tasks of the training split after one warm-up step, the config's sampling seeded per round,
best of {args.rounds} interleaved rounds. `compact_in_place`: a request leaving the batch moves the kept rows
down inside their KV room instead of copying them all into a new one (pure data movement). `split_prefix`: the
prefix every prompt shares held once and attention split at it (the same softmax up to float rounding; tokens
compared with the path above, in round 0, the held-out pass included).

{table}
"""
    if not args.no_write:
        write_section("decode_levers", text)


def _compare(reference: list, output: list) -> tuple[int, int, float]:
    """(sampled tokens that differ, tokens, largest |logprob difference| over the tokens both sampled alike)."""
    differing = total = 0
    gap = 0.0
    for (ids_a, logps_a), (ids_b, logps_b) in zip(reference, output):
        total += max(len(ids_a), len(ids_b))
        differing += sum(a != b for a, b in zip(ids_a, ids_b)) + abs(len(ids_a) - len(ids_b))
        for a, b, la, lb in zip(ids_a, ids_b, logps_a, logps_b):
            if a != b:
                break
            gap = max(gap, abs(la - lb))
    return differing, total, gap


if __name__ == "__main__":
    main()
