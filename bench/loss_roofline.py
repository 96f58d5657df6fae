"""The loss's forward and backward against their own roofline, at the shapes a short run of a shipped config fed them.

Question (issue "a run that costs half", item 3): the step clock's `loss` part (TRL's log-probability passes,
advantages, the loss's forward and backward) is 5-8 s a step on this CPU. How far is that above what its matrix
products need at this machine's measured throughput, and how much of the tokens it multiplies are padding?

Method: one `coevolve train --config configs/NAME.yaml` per config, in a child process, with `run.max_steps` and
`loop.steps_per_iteration` set to `--steps` (one iteration) and `loop.eval_limit` to `--eval-tasks`. Inside
`Trainer.training_step` and outside our rollout function (`EnvRollouts.__call__`, whose forwards are the
rollout's), every pass of the decoder (`LlamaModel.forward`: TRL's path, the shared prefix and its rows' suffixes,
`coevolve.prefix`) is recorded: rows, new tokens, the cache's length before it, each row's non-pad tokens (the
attention mask), and whether autograd records it; and every call of the LM head: the positions it scores (TRL's
fused head projects only positions whose label is not -100; otherwise `logits_to_keep` a row). The roofline is
`bench/roofline.py`'s: 2 x rows x new x (decoder linear weights) FLOPs at the throughput measured for
M = rows x new, attention's 4 x rows x new x (past + new) x hidden x layers at the best measured throughput (no
causal halving: an upper bound on attention's share), the LM head's 2 x scored x (head weights) at M = scored; a
pass under autograd costs three times its forward (the backward's two products per weight product: the input's
gradient and the weight's). `x roofline` = the step clock's loss seconds over the summed roofline seconds;
`x roofline (non-pad)` counts only the non-pad tokens, so the gap between the two is padding's. A flat micro-batch (every advantage 0) runs no forward since `zero_gradient_loss` and is not counted. What the
roofline leaves out (norms, activations, the log-softmax over the vocabulary, the cross-entropy's gather, Python,
the optimizer-free parts of the step clock's `loss`) is what the loss spends above it.

Usage: `python bench/loss_roofline.py [--configs quickstart lite-tools] [--steps 4] [--eval-tasks 4]
[--overrides section.key=value ...] [--no-write]`; writes the `loss_roofline` section of BENCHMARKS.md.
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


def backbone_seconds(roofline, rows: int, new: int, past: int, grad: bool,
                     real: list[tuple[int, int]] | None = None) -> float:
    """One recorded decoder pass (and, under autograd, its backward) at the roofline: `rows` x `new` tokens on top
    of a `past`-token cache, or only each row's `real` (new, context) non-pad tokens; the linear products at the
    throughput of the call's M = rows x new either way."""
    spans = real if real is not None else [(new, past + new)] * rows
    tokens = sum(count for count, _ in spans)
    linear = 2 * tokens * roofline.linear_weights / roofline.at(rows * new)
    attention = 4 * sum(count * context for count, context in spans) * roofline.hidden * roofline.layers / roofline.best
    return (linear + attention) * (3 if grad else 1)


def head_seconds(roofline, scored: int, grad: bool) -> float:
    """The LM head over `scored` positions (TRL's fused head projects only the positions it scores)."""
    return 2 * scored * roofline.head_weights / roofline.at(max(1, scored)) * (3 if grad else 1)


def child(config: str, steps: int, eval_tasks: int, out: Path, overrides: list[str]) -> None:
    """Run one short training, recording the loss's forward calls, and write them with the run's clock to `out`."""
    import torch
    import transformers
    import trl.trainer.grpo_trainer as grpo_trainer
    import trl.trainer.utils as trl_utils
    from transformers.models.llama.modeling_llama import LlamaModel

    from bench.roofline import measure
    from coevolve.cli import main as cli_main
    from coevolve.jsonl import read_jsonl
    from coevolve.train.grpo import EnvRollouts

    state = {"in_step": False, "in_rollout": False, "model": None}
    calls: list[dict] = []
    heads: list[dict] = []

    def flagged(flag, function):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            state[flag] = True
            try:
                return function(*args, **kwargs)
            finally:
                state[flag] = False
        return wrapper

    def recording() -> bool:
        return state["in_step"] and not state["in_rollout"]

    # The decoder: every forward of the loss runs it (TRL's path, the shared prefix and its rows' suffixes).
    original_backbone = LlamaModel.forward

    @functools.wraps(original_backbone)
    def recorded_backbone(self, *args, **kwargs):
        if recording():
            input_ids = kwargs.get("input_ids", args[0] if args else None)
            mask = kwargs.get("attention_mask")
            cache = kwargs.get("past_key_values")
            past = int(cache.get_seq_length()) if cache is not None else 0
            rows, new = (int(n) for n in input_ids.shape)
            real = ([(int(m[-new:].sum()), int(m.sum())) for m in mask] if mask is not None
                    else [(new, past + new)] * rows)
            calls.append({"rows": rows, "new": new, "past": past, "real": real, "grad": torch.is_grad_enabled()})
        return original_backbone(self, *args, **kwargs)

    # The LM head: TRL's fused head scores the positions whose label is not -100; otherwise `logits_to_keep`.
    def with_head_count(add):
        @functools.wraps(add)
        def added(model, *args, **kwargs):
            result = add(model, *args, **kwargs)
            forward = model.forward

            def counted(*f_args, **f_kwargs):
                if recording():
                    labels, ids = f_kwargs.get("labels"), f_kwargs.get("input_ids")
                    keep = f_kwargs.get("logits_to_keep") or 0
                    scored = (int((labels != -100).sum()) if f_kwargs.get("fused_lm_head") and labels is not None
                              else int(ids.shape[0]) * (int(keep) if keep else int(ids.shape[1])))
                    heads.append({"scored": scored, "grad": torch.is_grad_enabled()})
                    state["model"] = model
                return forward(*f_args, **f_kwargs)
            model.forward = counted
            return result
        return added

    LlamaModel.forward = recorded_backbone
    trl_utils.add_fused_lm_head = with_head_count(trl_utils.add_fused_lm_head)
    grpo_trainer.add_fused_lm_head = with_head_count(grpo_trainer.add_fused_lm_head)
    EnvRollouts.__call__ = flagged("in_rollout", EnvRollouts.__call__)
    transformers.Trainer.training_step = flagged("in_step", transformers.Trainer.training_step)
    with tempfile.TemporaryDirectory() as directory:
        run = Path(directory) / "run"
        code = cli_main(["train", "--config", str(REPO / "configs" / f"{config}.yaml"), "--output-dir", str(run),
                         f"run.max_steps={steps}", f"loop.steps_per_iteration={steps}",
                         f"loop.eval_limit={eval_tasks}", "run.report_to=[]", *overrides])
        if code:
            raise SystemExit(f"{config}: coevolve train exited {code}")
        loss = sum(line.get("train_seconds", {}).get("loss", 0.0) for line in read_jsonl(run / "metrics.jsonl"))
        shares = [line.get("skipped_flat_micro_batches", 0.0) for line in read_jsonl(run / "steps.jsonl")]
        flat = sum(shares) / max(1, len(shares))
    if state["model"] is None:
        raise SystemExit(f"{config}: no forward of the loss was recorded (a model other than Llama, or every "
                         "micro-batch flat: raise --steps)")
    roofline = measure(state["model"], next(state["model"].parameters()).dtype)
    heads_padded = sum(head_seconds(roofline, h["scored"], h["grad"]) for h in heads)
    at_shapes = sum(backbone_seconds(roofline, c["rows"], c["new"], c["past"], c["grad"]) for c in calls)
    at_tokens = sum(backbone_seconds(roofline, c["rows"], c["new"], c["past"], c["grad"], c["real"]) for c in calls)
    attention = sum(4 * c["rows"] * c["new"] * (c["past"] + c["new"]) * roofline.hidden * roofline.layers
                    / roofline.best * (3 if c["grad"] else 1) for c in calls)
    out.write_text(json.dumps({
        "config": config, "steps": steps, "loss": loss, "flat": flat, "calls": len(calls),
        "grad_calls": sum(c["grad"] for c in calls), "padded": sum(c["rows"] * c["new"] for c in calls),
        "tokens": sum(n for c in calls for n, _ in c["real"]), "rows": [c["rows"] for c in calls],
        "lengths": [c["new"] for c in calls], "at_shapes": at_shapes + heads_padded,
        "at_tokens": at_tokens + heads_padded, "attention_share": attention / (at_shapes + heads_padded),
        "head_share": heads_padded / (at_shapes + heads_padded), "scored": sum(h["scored"] for h in heads),
        "best": roofline.best,
        "throughput_at_mean_m": roofline.at(int(sum(c["rows"] * c["new"] for c in calls) / max(1, len(calls)))),
    }))


def section(results: list[dict], command: str) -> str:
    rows = ["| config | steps | decoder calls (under autograd) | rows x new tokens per call (mean) | non-pad share "
            "of tokens | positions the LM head scored | loss s (step clock) | roofline s (its shapes) | x roofline | "
            "roofline s (non-pad tokens) | x roofline (non-pad) | attention / LM head share of the roofline |",
            "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    lines = []
    for r in results:
        calls = max(1, r["calls"])
        shape = f"{sum(r['rows']) / calls:.1f} x {sum(r['lengths']) / calls:.0f}"
        rows.append(f"| {r['config']} | {r['steps']} | {r['calls']} ({r['grad_calls']}) | {shape} | "
                    f"{r['tokens'] / max(1, r['padded']):.2f} | {r['scored']} | {r['loss']:.1f} | "
                    f"{r['at_shapes']:.2f} | {r['loss'] / r['at_shapes']:.2f}x | {r['at_tokens']:.2f} | "
                    f"{r['loss'] / r['at_tokens']:.2f}x | {r['attention_share']:.2f} / {r['head_share']:.2f} |")
        lines.append(f"- {r['config']}: the decoder's products ran at M = rows x new tokens, where this CPU reaches "
                     f"{r['throughput_at_mean_m'] / 1e9:.0f} GFLOP/s at the mean call's M (best measured "
                     f"{r['best'] / 1e9:.0f}); {r['flat']:.0%} of the micro-batches were flat and ran no forward.")
    return f"""## The loss against its roofline (`bench/loss_roofline.py`)

Question: how far above what its matrix products need at this machine's throughput is the step clock's `loss`
(TRL's log-probability passes, advantages, the loss's forward and backward), and how many of the tokens it
multiplies are padding?

Command: `{command}` ({machine_line()}). One short `coevolve train` per config (one iteration); every decoder pass
inside `Trainer.training_step` and outside the rollout recorded with its shape, and the positions the LM head
scored (module docstring);
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
    parser.add_argument("--overrides", nargs="*", default=[], metavar="section.key=value",
                        help="config overrides for every run (e.g. grpo.micro_batch_size=16)")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.steps, args.eval_tasks, Path(args.json), args.overrides)
        return
    results = []
    with tempfile.TemporaryDirectory() as directory:
        for config in args.configs:
            path = Path(directory) / f"{config}.json"
            done = subprocess.run([sys.executable, __file__, "--child", config, "--json", str(path), "--steps",
                                   str(args.steps), "--eval-tasks", str(args.eval_tasks), "--overrides",
                                   *args.overrides], cwd=REPO,
                                  capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"{config} failed:\n{done.stderr[-3000:]}")
            results.append(json.loads(path.read_text()))
    command = (f"python bench/loss_roofline.py --configs {' '.join(args.configs)} --steps {args.steps} "
               f"--eval-tasks {args.eval_tasks}" + (f" --overrides {' '.join(args.overrides)}" if args.overrides else ""))
    text = section(results, command)
    print(text)
    if not args.no_write:
        write_section("loss_roofline", text)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
