"""What a flat micro-batch (every advantage zero) costs the GRPO step: the autograd zero against `zero_gradient_loss`.

Question: `coevolve.train` skips the model for a micro-batch whose groups all scored alike, but the step still needs
every trainable weight's (zero) gradient, as TRL's loss would leave it. Until now that zero came from
`sum((w * 0).sum() for w in weights)`: a product over every weight forward and another backward. How much of a
step did that cost, against `coevolve.prefix.zero_gradient_loss` (a zero gradient for each weight that has none,
and a detached zero to call `backward()` on)?

Method: SmolLM2-135M (the shipped weights, fp32, CPU, every weight trainable as in the quickstart's full
fine-tune). Per round, for each side: gradients cleared (`set_to_none`, as after an optimizer step), then the
quickstart's micro-batches of one step all flat (`--micro-batches`, 4 = its prompts per step), each one's loss and
`backward()`; the seconds of that loop, the best of `--rounds` interleaved rounds. The two sides' gradients are
compared (they must be equal: zero everywhere). How often a quickstart step is all flat is the runs' own figure
(`skipped_flat_micro_batches` in `steps.jsonl`); this measures what each flat micro-batch cost.

Usage: `python bench/flat_micro_batch.py [--micro-batches 4] [--rounds 5] [--no-write]`; writes the
`flat_micro_batch` section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import machine_line, write_section  # noqa: E402


def autograd_zero(model):
    """The loss this replaced: zero, connected to every trainable weight through a product."""
    return sum((weight * 0).sum() for weight in model.parameters() if weight.requires_grad)


def flat_step_seconds(model, loss_of, micro_batches: int) -> tuple[float, list]:
    """Seconds of one step's flat micro-batches (loss and backward each), from cleared gradients; the gradients."""
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    for _ in range(micro_batches):
        loss_of(model).backward()
    seconds = time.perf_counter() - start
    return seconds, [weight.grad for weight in model.parameters()]


def main(argv: list[str] | None = None) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    from coevolve.policy.models import shipped_model_dir
    from coevolve.prefix import zero_gradient_loss

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)

    model = AutoModelForCausalLM.from_pretrained(str(shipped_model_dir()), dtype=torch.float32)
    model.train()
    weights = sum(weight.numel() for weight in model.parameters() if weight.requires_grad)
    sides = {"autograd zero (before)": autograd_zero, "zero_gradient_loss": zero_gradient_loss}
    best = {name: float("inf") for name in sides}
    grads = {}
    flat_step_seconds(model, autograd_zero, 1)  # warm-up: the allocator's first gradients
    for round_index in range(args.rounds):
        for name, loss_of in sides.items():
            seconds, grads[name] = flat_step_seconds(model, loss_of, args.micro_batches)
            best[name] = min(best[name], seconds)
        print(f"round {round_index + 1}: " + ", ".join(f"{name} {best[name]:.3f} s" for name in sides), flush=True)
    before, after = grads.values()
    identical = all(a is not None and b is not None and torch.equal(a, b) and not bool(b.ne(0).any())
                    for a, b in zip(before, after))
    baseline = best["autograd zero (before)"]
    rows = "\n".join(f"| {name} | {seconds:.3f} | {seconds / args.micro_batches * 1000:.0f} | "
                     f"{baseline / seconds:.1f}x | {'yes' if identical else 'NO'} |"
                     for name, seconds in best.items())
    markdown = f"""## A flat micro-batch's zero gradient (`bench/flat_micro_batch.py`)

Question: a micro-batch whose advantages are all zero skips the model, but every weight still needs its zero
gradient. What did `sum((w * 0).sum())` cost, against `zero_gradient_loss` (zeros set where no gradient is, and
a detached zero to run `backward()` on)?

Command: `python bench/flat_micro_batch.py --micro-batches {args.micro_batches} --rounds {args.rounds}`
({machine_line()}; torch {torch.__version__}, {torch.get_num_threads()} threads). SmolLM2-135M fp32, all
{weights / 1e6:.0f}M weights trainable; one step's {args.micro_batches} flat micro-batches from cleared gradients,
best of {args.rounds} interleaved rounds.

| zero loss | seconds per all-flat step | ms per flat micro-batch | before / this | gradients equal (all zero) |
|---|---:|---:|---:|---|
{rows}
"""
    print(markdown)
    if not identical:
        print("the two sides' gradients differ: not written", file=sys.stderr)
        return 1
    if not args.no_write:
        write_section("flat_micro_batch", markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
