"""Where a GRPO step's seconds go, to the op: torch's profiler over a short run of the shipped CPU configs.

Question (issue "a run that costs half", item 1): of the rollout's decode, the loss's forward and backward and a
held-out pass, how much is the decoder's matrix products, the LM head over the vocabulary, attention, sampling,
the KV cache's copies, norms and other elementwise work, and how much is spent outside any op (Python per token,
dispatch, the env and rendering)? The roofline figure (BENCHMARKS.md "Multi-turn rollout") says the rollout runs
at 2.92x the seconds its products need at their shapes; this says what fills the gap.

Method: one `coevolve train --config configs/NAME.yaml` per config, in a child process, with `run.max_steps` set
to `--steps` (one iteration) and `loop.eval_limit` to `--eval-tasks`, under `torch.profiler.profile` (CPU, input
shapes recorded). Regions are marked with `record_function` around the methods that do the work, so nothing in
the project changes for this script:
- `generate` = `TransformersBackend.generate` during training rollouts (prefill + decode + sampling);
- `rollout, outside generate` = the rest of TRL's call of our rollout function (env steps, rendering, records);
- `loss forward` = `Trainer.training_step` outside the rollout and the backward (TRL's log-probability passes,
  advantages, the loss);
- `loss backward` = `torch.Tensor.backward`;
- `held-out generate` / `held-out, outside generate` = the same split inside `evaluate_model`.
Every op's *self* time goes to the innermost region around it and to a category by op name (the LM head is a
matrix product with the vocabulary as a dimension). `outside ops` = the region's wall minus the self time of
every op in it: Python, the dispatcher, and whatever the process does between ops. The profiler adds its own
cost per op (most to the many small ops of decoding), so the shares are what this script reports, and the
figures without the profiler stay those of `bench/step_time.py`.

Usage: `python bench/profile_step.py [--configs quickstart lite-tools] [--steps 2] [--eval-tasks 8]
[--no-write]`; writes the `profile_step` section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import machine_line, write_section  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
REGIONS = ("generate", "rollout, outside generate", "loss forward", "loss backward", "held-out generate",
           "held-out, outside generate")
TOP_OPS = 8
"""Ops listed per region, by self time."""
CATEGORIES = ("linear layers", "LM head", "attention", "sampling", "cache copies", "norms and elementwise",
              "other ops", "outside ops")
MATMUL = {"aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::_mkldnn_linear",
          "aten::mkldnn_linear", "aten::baddbmm", "aten::addmv", "aten::mv", "aten::dot"}
ATTENTION = ("attention",)
SAMPLING = {"aten::multinomial", "aten::log_softmax", "aten::_log_softmax", "aten::softmax", "aten::_softmax",
            "aten::gather", "aten::isin", "aten::argmax", "aten::topk", "aten::sort", "aten::exp",
            "aten::_log_softmax_backward_data", "aten::_softmax_backward_data", "aten::uniform_",
            "aten::exponential_", "aten::div_", "aten::nonzero", "aten::item", "aten::_local_scalar_dense"}
COPIES = {"aten::copy_", "aten::index_select", "aten::index", "aten::cat", "aten::repeat_interleave",
          "aten::clone", "aten::contiguous", "aten::empty", "aten::empty_strided", "aten::new_empty",
          "aten::zeros", "aten::new_zeros", "aten::zero_", "aten::fill_", "aten::full", "aten::index_put_",
          "aten::_index_put_impl_", "aten::masked_fill", "aten::masked_fill_", "aten::resize_", "aten::to",
          "aten::_to_copy", "aten::slice", "aten::select", "aten::view", "aten::reshape", "aten::expand",
          "aten::as_strided", "aten::transpose", "aten::t", "aten::unsqueeze", "aten::squeeze", "aten::permute"}
ELEMENTWISE = {"aten::mul", "aten::add", "aten::sub", "aten::div", "aten::pow", "aten::mean", "aten::rsqrt",
               "aten::silu", "aten::neg", "aten::cos", "aten::sin", "aten::embedding", "aten::rms_norm",
               "aten::_fused_rms_norm", "aten::add_", "aten::mul_", "aten::silu_backward", "aten::sum",
               "aten::embedding_backward", "aten::embedding_dense_backward", "aten::where", "aten::clamp",
               "aten::cumsum", "aten::sigmoid", "aten::tanh", "aten::mse_loss", "aten::exp_", "aten::maximum",
               "aten::minimum", "aten::sqrt", "aten::max", "aten::min", "aten::neg_", "aten::ne", "aten::eq",
               "aten::lt", "aten::gt", "aten::le", "aten::ge", "aten::bitwise_and", "aten::bitwise_or",
               "aten::logical_not", "aten::abs", "aten::reciprocal"}


def category(name: str, shapes: list, vocabulary: int) -> str:
    """The category of an op by its name (and, for a matrix product, whether the vocabulary is one of its sizes)."""
    if name in MATMUL:
        flat = [size for shape in shapes if isinstance(shape, (list, tuple)) for size in shape]
        return "LM head" if vocabulary in flat else "linear layers"
    if any(word in name for word in ATTENTION):
        return "attention"
    if name in SAMPLING:
        return "sampling"
    if name in COPIES:
        return "cache copies"
    if name.startswith("autograd::") or name.endswith(("Backward0", "Backward1")):
        return "other ops"  # the engine's wrappers: the products and elementwise ops they run are their children
    if name in ELEMENTWISE or name.startswith("aten::_fused"):
        return "norms and elementwise"
    return "other ops"


def _marked(label_of, function):
    from torch.profiler import record_function

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with record_function(f"coevolve::{label_of()}"):
            return function(*args, **kwargs)
    return wrapper


def child(config: str, steps: int, eval_tasks: int, out: Path) -> None:
    """Run one short training under the profiler and write the per-region, per-category seconds to `out`."""
    import torch
    import transformers
    from torch.profiler import ProfilerActivity, profile

    import coevolve.evaluate as evaluate
    from coevolve.cli import main as cli_main
    from coevolve.policy.hf_backend import TransformersBackend
    from coevolve.train.grpo import EnvRollouts

    inside_eval = [False]

    def evaluating(function):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            inside_eval[0] = True
            try:
                return _marked(lambda: "held-out, outside generate", function)(*args, **kwargs)
            finally:
                inside_eval[0] = False
        return wrapper

    evaluate.evaluate_model = evaluating(evaluate.evaluate_model)
    TransformersBackend.generate = _marked(lambda: "held-out generate" if inside_eval[0] else "generate",
                                           TransformersBackend.generate)
    EnvRollouts.__call__ = _marked(lambda: "rollout, outside generate", EnvRollouts.__call__)
    transformers.Trainer.training_step = _marked(lambda: "loss forward", transformers.Trainer.training_step)
    torch.Tensor.backward = _marked(lambda: "loss backward", torch.Tensor.backward)
    with tempfile.TemporaryDirectory() as directory, \
            profile(activities=[ProfilerActivity.CPU], record_shapes=True) as profiler:
        code = cli_main(["train", "--config", str(REPO / "configs" / f"{config}.yaml"), "--output-dir",
                         str(Path(directory) / "run"), f"run.max_steps={steps}",
                         f"loop.steps_per_iteration={steps}", f"loop.eval_limit={eval_tasks}",
                         "run.report_to=[]"])
    if code:
        raise SystemExit(f"{config}: coevolve train exited {code}")
    from coevolve.policy.models import load_tokenizer

    vocabulary = len(load_tokenizer("smollm2"))
    seconds: dict[str, dict[str, float]] = {region: defaultdict(float) for region in REGIONS}
    ops: dict[str, dict[str, float]] = {region: defaultdict(float) for region in REGIONS}
    wall: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    region_of: dict[int, str | None] = {}  # event id -> its innermost region, so each chain is walked once

    def innermost(event) -> str | None:
        chain, region = [], None
        while event is not None:
            if event.id in region_of:
                region = region_of[event.id]
                break
            if event.name.startswith("coevolve::"):
                region = event.name.removeprefix("coevolve::")
                break
            chain.append(event.id)
            event = event.cpu_parent
        for identifier in chain:
            region_of[identifier] = region
        return region

    for event in profiler.events():
        if event.name.startswith("coevolve::"):
            label = event.name.removeprefix("coevolve::")
            inner = [child.time_range.elapsed_us() for child in event.cpu_children
                     if child.name.startswith("coevolve::")]  # a nested region counts in its own row
            wall[label] += (event.time_range.elapsed_us() - sum(inner)) / 1e6
            calls[label] += 1
            continue
        region = innermost(event)
        if region is None:
            continue
        kind = category(event.name, event.input_shapes or [], vocabulary)
        seconds[region][kind] += event.self_cpu_time_total / 1e6
        ops[region][f"{event.name} ({kind})"] += event.self_cpu_time_total / 1e6
    table = {}
    for region in REGIONS:
        parts = dict(seconds[region])
        parts["outside ops"] = max(0.0, wall[region] - sum(parts.values()))
        top = sorted(ops[region].items(), key=lambda item: -item[1])[:TOP_OPS]
        table[region] = {"wall": wall[region], "calls": calls[region], "parts": parts, "top": top}
    out.write_text(json.dumps({"config": config, "steps": steps, "eval_tasks": eval_tasks, "regions": table}))


def section(results: list[dict], command: str) -> str:
    lines = [
        "## Where a step's seconds go, to the op (`bench/profile_step.py`)", "",
        "Question: of the rollout's decode, the loss's forward and backward and a held-out pass, what share is "
        "the decoder's matrix products, the LM head over the vocabulary, attention, sampling, the KV cache's "
        "copies, norms and elementwise work, and what is spent outside any op (Python per token, dispatch, env "
        "and rendering)?", "",
        f"Command: `{command}` ({machine_line()}). One short `coevolve train` per config under torch's profiler "
        "(CPU, shapes recorded), regions marked around the methods that do the work (module docstring). "
        "Shares of each region's wall time under the profiler, which inflates many small ops most; the seconds "
        "without it are `bench/step_time.py`'s.", ""]
    header = "| config | region | calls | wall s (profiled) | " + " | ".join(f"{c} %" for c in CATEGORIES) + " |"
    lines += [header, "|" + "---|" * 4 + "---:|" * len(CATEGORIES)]
    for result in results:
        for region in REGIONS:
            row = result["regions"][region]
            if not row["wall"]:
                continue
            shares = [100 * row["parts"].get(c, 0.0) / row["wall"] for c in CATEGORIES]
            lines.append(f"| {result['config']} ({result['steps']} steps, {result['eval_tasks']} held-out) | "
                         f"{region} | {row['calls']} | {row['wall']:.1f} | " + " | ".join(f"{s:.0f}" for s in shares)
                         + " |")
    lines += ["", "The ops with the most self time, per region (% of the region's profiled wall):", ""]
    for result in results:
        for region in ("generate", "loss forward", "loss backward", "held-out generate"):
            row = result["regions"][region]
            if row["wall"]:
                listed = ", ".join(f"{name} {100 * value / row['wall']:.0f}" for name, value in row["top"])
                lines.append(f"- {result['config']}, {region}: {listed}.")
    lines.append("")
    for result in results:
        generate = result["regions"]["generate"]
        if generate["wall"]:
            parts = generate["parts"]
            products = parts.get("linear layers", 0.0) + parts.get("LM head", 0.0)
            lines.append(f"- {result['config']}: in training generation, matrix products (decoder and LM head) take "
                         f"{100 * products / generate['wall']:.0f}% of the wall, the LM head alone "
                         f"{100 * parts.get('LM head', 0.0) / generate['wall']:.0f}%, attention "
                         f"{100 * parts.get('attention', 0.0) / generate['wall']:.0f}%, outside ops "
                         f"{100 * parts.get('outside ops', 0.0) / generate['wall']:.0f}%.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", nargs="+", default=["quickstart", "lite-tools"])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--eval-tasks", type=int, default=8)
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
    command = (f"python bench/profile_step.py --configs {' '.join(args.configs)} --steps {args.steps} "
               f"--eval-tasks {args.eval_tasks}")
    text = section(results, command)
    print(text)
    if not args.no_write:
        write_section("profile_step", text)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
