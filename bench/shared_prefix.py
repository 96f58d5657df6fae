"""The GRPO loss's forward and backward on CPU: TRL's per-row scoring vs shared-prompt scoring, in one process.

Question: how much of a quickstart step's training work do the exact shortcuts of `coevolve.train` remove?
(1) `coevolve.prefix`: the prompt prefix a micro-batch shares is run once, with the groups kept whole in
micro-batches (instead of TRL's shuffle); (1b) the prefix the whole step shares runs once per step, its gradient
carried back after the last micro-batch (`StepPrefix`, `grpo.shared_step_prefix`); (2) micro-batches whose
advantages are all zero skip the model.

Method: SmolLM2-135M (fp32, CPU) with TRL's fused LM head (T=0.5), the quickstart's prompt (signatures tool list,
3 worked examples) for `--tasks` BFCL-lite train tasks, K=`--group-size` replies each sampled by our engine
(T=0.5, <= 32 tokens). The generation batch is laid out as TRL lays it out (left-padded prompts, right-padded
completions) and cut into micro-batches of K rows: `trl` = TRL's `_get_per_token_logps_and_entropies` on TRL's
shuffled micro-batches; `shared` = ours on whole groups. Each side: forward and backward of an advantage-weighted
log-probability sum over every micro-batch, median of `--repeats` passes after one warm-up pass. The two sides'
log-probabilities are compared (they must agree). Shortcut (2) is a fraction of micro-batches that cost nothing:
it is read from the quickstart runs' `steps.jsonl` (`skipped_flat_micro_batches`) when `runs/bench-quickstart`
holds them, and the step's training work with both shortcuts is estimated from it.

Usage: `python bench/shared_prefix.py [--tasks 4] [--group-size 4] [--repeats 3] [--no-write]`; writes the
`shared_prefix` section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("COEVOLVE_CACHE", str(Path(__file__).resolve().parent.parent / ".cache"))
warnings.filterwarnings("ignore")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import machine_line, write_section  # noqa: E402
from coevolve.jsonl import read_jsonl  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def generation_batch(tasks: int, group_size: int):
    """(model, input_ids, attention_mask, completion width, prompt length) for `tasks` x K sampled replies."""
    import torch
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    from coevolve.envs.bfcl_lite import BFCLLiteEnv
    from coevolve.policy.backends import SamplingConfig
    from coevolve.policy.chat import ChatRenderer, build_demonstrations
    from coevolve.policy.hf_backend import TransformersBackend
    from coevolve.policy.models import load_tokenizer, shipped_model_dir

    model_dir = str(shipped_model_dir())
    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    env = BFCLLiteEnv("train")
    all_tasks = env.tasks()
    demos = build_demonstrations(env, all_tasks[-20:], "python", 3)
    renderer = ChatRenderer(tokenizer, "python", demonstrations=demos, tool_style="signatures")
    prompts = []
    for task in all_tasks[:tasks]:
        episode = env.reset(task)
        prompts.append(renderer.prompt_ids(renderer.opening_messages(episode.tools(), episode.user_messages()),
                                           episode.tools()))
    rows = [prompt for prompt in prompts for _ in range(group_size)]
    stop = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    model.eval()
    replies = TransformersBackend(model, tokenizer).generate(
        rows, SamplingConfig(temperature=0.5, max_new_tokens=32, seed=0), stop)
    completions = [list(reply.token_ids) for reply in replies]
    prompt_width, completion_width = max(map(len, rows)), max(map(len, completions))
    pad = tokenizer.pad_token_id or 0
    ids, mask = [], []
    for prompt, completion in zip(rows, completions):
        left, right = prompt_width - len(prompt), completion_width - len(completion)
        ids.append([pad] * left + prompt + completion + [pad] * right)
        mask.append([0] * left + [1] * (len(prompt) + len(completion)) + [0] * right)
    add_fused_lm_head(model, temperature=0.5, outputs=("log_probs", "entropy"))
    model.train()
    return model, torch.tensor(ids), torch.tensor(mask), completion_width, sum(map(len, prompts)) / len(prompts)


def time_pass(model, micro_batches, score, finish=lambda: None) -> tuple[float, list]:
    """Seconds for forward + backward over all micro-batches (and `finish`, the step's last backward), and the
    log-probabilities (row order kept)."""
    import torch

    model.zero_grad(set_to_none=True)
    started = time.perf_counter()
    outputs = []
    for rows, ids, mask, keep in micro_batches:
        logps = score(ids, mask, keep)
        advantages = torch.linspace(-1.0, 1.0, len(rows))[:, None]
        (logps * advantages * mask[:, -keep:]).sum().backward()
        outputs.append((rows, logps.detach()))
    finish()
    return time.perf_counter() - started, outputs


def skipped_fraction() -> tuple[float | None, int]:
    """Mean share of micro-batches skipped (all advantages zero) over the quickstart bench runs' steps."""
    shares = []
    for path in sorted((REPO / "runs" / "bench-quickstart").glob("seed-*/steps.jsonl")):
        for record in read_jsonl(path):
            if "skipped_flat_micro_batches" in record:
                shares.append(record["skipped_flat_micro_batches"])
    return (statistics.mean(shares) if shares else None), len(shares)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    import torch
    from trl import GRPOTrainer

    from coevolve.prefix import shared_prefix_length, shared_prefix_logps, step_prefix_of

    torch.manual_seed(0)
    model, ids, mask, keep, prompt_tokens = generation_batch(args.tasks, args.group_size)
    owner = SimpleNamespace(accelerator=SimpleNamespace(autocast=contextlib.nullcontext, is_main_process=True))
    K, total = args.group_size, ids.size(0)

    def trl_score(batch_ids, batch_mask, width):
        return GRPOTrainer._get_per_token_logps_and_entropies(owner, model, batch_ids, batch_mask, width,
                                                              compute_entropy=True)[0]

    def shared_score(batch_ids, batch_mask, width):
        shared = shared_prefix_length(batch_ids, batch_mask, batch_ids.size(1) - width)
        return shared_prefix_logps(model, batch_ids, batch_mask, width, shared, True, contextlib.nullcontext)[0]

    prompt_width = ids.size(1) - keep
    step = step_prefix_of(ids[:, :prompt_width], mask[:, :prompt_width])

    def step_score(batch_ids, batch_mask, width):
        shared = shared_prefix_length(batch_ids, batch_mask, batch_ids.size(1) - width)
        return shared_prefix_logps(model, batch_ids, batch_mask, width, shared, True, contextlib.nullcontext,
                                   step_prefix=(step, 0))[0]

    shuffled = torch.randperm(total, generator=torch.Generator().manual_seed(0)).tolist()
    whole = list(range(total))
    layouts = {"trl": (shuffled, trl_score, lambda: None), "shared": (whole, shared_score, lambda: None),
               "step": (whole, step_score, step.backward)}
    seconds: dict[str, list[float]] = {name: [] for name in layouts}
    logps: dict[str, torch.Tensor] = {}
    for repeat in range(args.repeats + 1):
        for name, (order, score, finish) in layouts.items():
            micro = [(order[i:i + K], ids[order[i:i + K]], mask[order[i:i + K]], keep) for i in range(0, total, K)]
            took, outputs = time_pass(model, micro, score, finish)
            if repeat:  # the first pass warms up
                seconds[name].append(took)
            full = torch.zeros(total, keep)
            for rows, values in outputs:
                full[rows] = values
            logps[name] = full
            print(f"pass {repeat} {name:6s} {took:6.2f}s", flush=True)
    completion = mask[:, -keep:].bool()
    difference = max(float((logps["trl"] - logps[name])[completion].abs().max()) for name in ("shared", "step"))
    trl_s, shared_s = statistics.median(seconds["trl"]), statistics.median(seconds["shared"])
    step_s = statistics.median(seconds["step"])
    shared_tokens = shared_prefix_length(ids[:K], mask[:K], ids.size(1) - keep)
    skip, skip_steps = skipped_fraction()
    both = shared_s * (1 - skip) if skip is not None else None
    print(f"trl {trl_s:.2f}s shared {shared_s:.2f}s step {step_s:.2f}s ratio {shared_s / trl_s:.3f} "
          f"{step_s / trl_s:.3f}; max |logp diff| {difference:.2e}; skipped share {skip}")
    if args.no_write:
        return
    skip_line = ("No quickstart runs with `skipped_flat_micro_batches` were found under `runs/bench-quickstart` "
                 "(run `bench/quickstart.py` first), so shortcut (2) is not estimated here."
                 if skip is None else
                 f"Shortcut (2): over the {skip_steps} steps of the quickstart bench runs, **{skip:.0%}** of "
                 f"micro-batches had every advantage zero and skipped the model, so the training work of an average "
                 f"quickstart step is about {both:.2f} s of the {trl_s:.2f} s TRL's path would spend on this batch: "
                 f"**{both / trl_s:.3f}** with both shortcuts (an estimate: it applies this batch's cost per "
                 f"micro-batch to the runs' skip share).")
    write_section("shared_prefix", f"""
## GRPO loss on CPU: TRL's per-row scoring vs shared-prompt scoring (`bench/shared_prefix.py`)

Question: how much of a quickstart step's training work (forward and backward of the loss) do the exact
shortcuts remove: (1) the prompt prefix a micro-batch shares run once, groups kept whole in micro-batches; (1b)
the prefix the whole step shares run once per step (`grpo.shared_step_prefix`); (2) micro-batches whose
advantages are all zero skipping the model? Baseline: TRL's
`_get_per_token_logps_and_entropies` on TRL's shuffled micro-batches, same model, same batch, same process.

Command: `python bench/shared_prefix.py --tasks {args.tasks} --group-size {args.group_size} --repeats
{args.repeats}`. Machine: {machine_line()}. SmolLM2-135M fp32 with TRL's fused LM head; the quickstart prompt
(~{prompt_tokens:.0f} tokens: signatures tool list, 3 worked examples), {args.tasks} BFCL-lite tasks x K={K}
sampled replies (<= {keep} tokens), micro-batches of K rows; median of {args.repeats} passes after a warm-up.

| path | forward + backward over the step's {total // K} micro-batches, s | ratio |
|---|---|---|
| TRL (shuffled micro-batches, every row from its first token) | {trl_s:.2f} | 1.000 |
| shared prefix (whole groups, {shared_tokens} prompt tokens run once per micro-batch) | {shared_s:.2f} | {shared_s / trl_s:.3f} |
| + step prefix (the {len(step)} tokens every row shares run once per step) | {step_s:.2f} | {step_s / trl_s:.3f} |

Shared prefix / step prefix: **{shared_s / step_s:.2f}x**.

The two paths' log-probabilities differ by at most {difference:.1e} (float rounding; `tests/test_prefix.py` checks
log-probabilities, entropies, gradients and the weights after three training steps against TRL's path).
{skip_line}
""")


if __name__ == "__main__":
    main()
