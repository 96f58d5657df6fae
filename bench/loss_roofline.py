"""The loss's forward and backward against their own roofline, at the shapes a short run of a shipped config fed them.

Question (issue "a run that costs half", item 3): the step clock's `loss` part (TRL's log-probability passes,
advantages, the loss's forward and backward) is 5-8 s a step on this CPU. How far is that above what its matrix
products need at this machine's measured throughput, and how much of the tokens it multiplies are padding?

Method: one `coevolve train --config configs/NAME.yaml` per config, in a child process, with `run.max_steps` and
`loop.steps_per_iteration` set to `--steps` (one iteration) and `loop.eval_limit` to `--eval-tasks`. Inside
`Trainer.training_step` and outside our rollout function (`EnvRollouts.__call__`, whose forwards are the
rollout's), every call of the model's `forward` is recorded: rows, padded length, non-pad tokens (the attention
mask's sum), the positions the LM head scores (`logits_to_keep`), and whether autograd records it. The roofline of a
call is `bench/roofline.py`'s: 2 x rows x length x (decoder linear weights) FLOPs at the throughput measured for
M = rows x length, the LM head's 2 x rows x kept x (head weights) at M = rows x kept, attention's
4 x rows x length^2 x hidden x layers at the best measured throughput (no causal halving: an upper bound on
attention's share); a call under autograd costs three times its forward (the backward's two products per weight
product: the input's gradient and the weight's). `x roofline` = the step clock's loss seconds over the summed
roofline seconds; `x roofline (non-pad)` counts only the non-pad tokens, so the gap between the two is padding's.
A flat micro-batch (every advantage 0) runs no forward since `zero_gradient_loss` and is not counted. What the
roofline leaves out (norms, activations, the log-softmax over the vocabulary, the cross-entropy's gather, Python,
the optimizer-free parts of the step clock's `loss`) is what the loss spends above it.

Usage: `python bench/loss_roofline.py [--configs quickstart lite-tools] [--steps 4] [--eval-tasks 4]
[--no-write]`; writes the `loss_roofline` section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import machine_line, write_section  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def call_seconds(roofline, rows: int, length: int, kept: int, grad: bool, real: list[int] | None = None) -> float:
    """One recorded forward (and, under autograd, its backward) at the roofline: over its padded shape, or over
    each row's `real` (non-pad) tokens only, the products at the throughput of the call's M either way."""
    lengths = real if real is not None else [length] * rows
    tokens = sum(lengths)
    scored = sum(min(kept, n) for n in lengths)
    linear = 2 * tokens * roofline.linear_weights / roofline.at(rows * length)
    head = 2 * scored * roofline.head_weights / roofline.at(rows * kept)
    attention = 4 * sum(n * n for n in lengths) * roofline.hidden * roofline.layers / roofline.best
    return (linear + head + attention) * (3 if grad else 1)


def child(config: str, steps: int, eval_tasks: int, out: Path) -> None:
    """Run one short training, recording the loss's forward calls, and write them with the run's clock to `out`."""
    import torch
    import transformers
    from transformers.models.llama.modeling_llama import LlamaForCausalLM

    from bench.roofline import measure
    from coevolve.cli import main as cli_main
    from coevolve.jsonl import read_jsonl
    from coevolve.train.grpo import EnvRollouts

    state = {"in_step": False, "in_rollout": False, "model": None}
    calls: list[dict] = []

    def flagged(flag, function):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            state[flag] = True
            try:
                return function(*args, **kwargs)
            finally:
                state[flag] = False
        return wrapper

    original_forward = LlamaForCausalLM.forward

    @functools.wraps(original_forward)
    def recorded_forward(self, *args, **kwargs):
        if state["in_step"] and not state["in_rollout"]:
            input_ids = kwargs.get("input_ids", args[0] if args else None)
            mask = kwargs.get("attention_mask")
            rows, length = (int(n) for n in input_ids.shape)
            keep = kwargs.get("logits_to_keep") or 0
            calls.append({"rows": rows, "length": length, "kept": int(keep) if keep else length,
                          "real": mask.sum(dim=1).tolist() if mask is not None else [length] * rows,
                          "grad": torch.is_grad_enabled()})
            state["model"] = self
        return original_forward(self, *args, **kwargs)

    LlamaForCausalLM.forward = recorded_forward
    EnvRollouts.__call__ = flagged("in_rollout", EnvRollouts.__call__)
    transformers.Trainer.training_step = flagged("in_step", transformers.Trainer.training_step)
    with tempfile.TemporaryDirectory() as directory:
        run = Path(directory) / "run"
        code = cli_main(["train", "--config", str(REPO / "configs" / f"{config}.yaml"), "--output-dir", str(run),
                         f"run.max_steps={steps}", f"loop.steps_per_iteration={steps}",
                         f"loop.eval_limit={eval_tasks}", "run.report_to=[]"])
        if code:
            raise SystemExit(f"{config}: coevolve train exited {code}")
        loss = sum(line.get("train_seconds", {}).get("loss", 0.0) for line in read_jsonl(run / "metrics.jsonl"))
        shares = [line.get("skipped_flat_micro_batches", 0.0) for line in read_jsonl(run / "steps.jsonl")]
        flat = sum(shares) / max(1, len(shares))
    if state["model"] is None:
        raise SystemExit(f"{config}: no forward of the loss was recorded (a model other than Llama, or every "
                         "micro-batch flat: raise --steps)")
    roofline = measure(state["model"], next(state["model"].parameters()).dtype)
    at_shapes = sum(call_seconds(roofline, c["rows"], c["length"], c["kept"], c["grad"]) for c in calls)
    at_tokens = sum(call_seconds(roofline, c["rows"], c["length"], c["kept"], c["grad"], c["real"]) for c in calls)
    attention = sum(4 * c["rows"] * c["length"] ** 2 * roofline.hidden * roofline.layers / roofline.best
                    * (3 if c["grad"] else 1) for c in calls)
    out.write_text(json.dumps({
        "config": config, "steps": steps, "loss": loss, "flat": flat, "calls": len(calls),
        "grad_calls": sum(c["grad"] for c in calls), "padded": sum(c["rows"] * c["length"] for c in calls),
        "tokens": sum(sum(c["real"]) for c in calls), "rows": [c["rows"] for c in calls],
        "lengths": [c["length"] for c in calls], "at_shapes": at_shapes, "at_tokens": at_tokens,
        "attention_share": attention / at_shapes if at_shapes else 0.0, "best": roofline.best,
        "throughput_at_mean_m": roofline.at(int(sum(c["rows"] * c["length"] for c in calls) / max(1, len(calls)))),
    }))


def section(results: list[dict], command: str) -> str:
    rows = ["| config | steps | forward calls (under autograd) | rows x length per call (mean) | non-pad share of "
            "tokens | loss s (step clock) | roofline s (its shapes) | x roofline | roofline s (non-pad tokens) | "
            "x roofline (non-pad) | attention share of the roofline |",
            "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines = []
    for r in results:
        calls = max(1, r["calls"])
        shape = f"{sum(r['rows']) / calls:.1f} x {sum(r['lengths']) / calls:.0f}"
        rows.append(f"| {r['config']} | {r['steps']} | {r['calls']} ({r['grad_calls']}) | {shape} | "
                    f"{r['tokens'] / max(1, r['padded']):.2f} | {r['loss']:.1f} | {r['at_shapes']:.2f} | "
                    f"{r['loss'] / r['at_shapes']:.2f}x | {r['at_tokens']:.2f} | {r['loss'] / r['at_tokens']:.2f}x | "
                    f"{r['attention_share']:.2f} |")
        lines.append(f"- {r['config']}: the products ran at M = rows x length, where this CPU reaches "
                     f"{r['throughput_at_mean_m'] / 1e9:.0f} GFLOP/s at the mean call's M (best measured "
                     f"{r['best'] / 1e9:.0f}); {r['flat']:.0%} of the micro-batches were flat and ran no forward.")
    return f"""## The loss against its roofline (`bench/loss_roofline.py`)

Question: how far above what its matrix products need at this machine's throughput is the step clock's `loss`
(TRL's log-probability passes, advantages, the loss's forward and backward), and how many of the tokens it
multiplies are padding?

Command: `{command}` ({machine_line()}). One short `coevolve train` per config (one iteration); every forward
of the model inside `Trainer.training_step` and outside the rollout recorded with its shape (module docstring);
the roofline from `bench/roofline.py`'s throughput measured in the same process, a call under autograd counted as
three forwards.

{chr(10).join(rows)}

{chr(10).join(lines)}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", nargs="+", default=["quickstart", "lite-tools"])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--eval-tasks", type=int, default=4)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.steps, args.eval_tasks, Path(args.json))
        return
    results = []
    with tempfile.TemporaryDirectory() as directory:
        for config in args.configs:
            path = Path(directory) / f"{config}.json"
            done = subprocess.run([sys.executable, __file__, "--child", config, "--json", str(path), "--steps",
                                   str(args.steps), "--eval-tasks", str(args.eval_tasks)], cwd=REPO,
                                  capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"{config} failed:\n{done.stderr[-3000:]}")
            results.append(json.loads(path.read_text()))
    command = (f"python bench/loss_roofline.py --configs {' '.join(args.configs)} --steps {args.steps} "
               f"--eval-tasks {args.eval_tasks}")
    text = section(results, command)
    print(text)
    if not args.no_write:
        write_section("loss_roofline", text)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
