"""GPU check for a lent machine with only PyTorch and transformers: our rollout engine vs transformers' `generate`
(what TRL generates with when vLLM is off), one GRPO step's time and MFU, and a two-iteration CoEvolve run, on
random-init Qwen3-architecture models in bf16. Prepared to run in under 10 minutes on one GPU with no internet.

Question: on the paper's model family at realistic sizes, how fast does our engine sample next to the plain
`generate` loop TRL falls back to without vLLM, what does one GRPO step cost and how much of the GPU does it use,
and does the whole loop run there?

Method (same process, same prompts and sampling for both engines):
- Models: Qwen3's architecture at about 0.6B and 4B parameters (Qwen3-0.6B's and Qwen3-4B's layer counts and
  widths; the vocabulary is the shipped SmolLM2 tokenizer's 49,152 tokens, since no Qwen tokenizer can be fetched),
  random weights, bf16, with Qwen3's chat template from TRL. Random weights make random replies: the figures are
  throughput and time, not success.
- Rollouts: `--tasks` BFCL-lite train tasks x K = `--group-size`, one reply of `--max-new-tokens` each (no stop
  token is likely from a random model, so every reply runs to the budget: a fixed amount of work), temperature 1.0.
  Ours: `coevolve.rollout.rollout` through `TransformersBackend` (one shared prefill per prompt). Baseline: the same
  prompts, left-padded, through `model.generate(do_sample=True)` in one batch. One warm-up call each; tokens/s.
- GRPO step: `coevolve.train` (TRL's GRPOTrainer, our rollouts) on the quickstart's prompt, `--prompts-per-step`
  tasks x K, micro-batches of one group, bf16, gradient checkpointing; the median of the timed steps after one
  warm-up. MFU = 6 x parameters x tokens in the step's sequences / (step seconds x the GPU's peak bf16 FLOP/s,
  `--peak-tflops`, H200 dense: 989).
- Loop: `coevolve train` with `configs/quickstart.yaml`'s settings on the 0.6B model, mode coevolve, 2 iterations
  of 1 step, 8 held-out tasks; its metrics lines.

Setup on the GPU machine (nothing to fetch there): `bash bench/gpu_check.sh` installs the carried wheels
(`make gpu-check-wheels` fills `.cache/gpu-check/` with TRL, datasets, dill, multiprocess, bfcl-eval, ~4 MB, and the
SmolLM2 tokenizer) into a folder on the PYTHONPATH and runs this. Output: JSON and a markdown section in `--out`
(copy the section into BENCHMARKS.md with `--benchmarks`). `--device cpu --sizes tiny` is the CPU smoke run the
test suite uses.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SIZES = {  # Qwen3-0.6B / Qwen3-4B's shapes (hidden, layers, heads, key-value heads, head dim, MLP width)
    "0.6B": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                 intermediate_size=3072),
    "4B": dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
               intermediate_size=9728),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 intermediate_size=128),
}


def qwen3_folder(size: str, tokenizer_dir: str, out: Path, dtype: str) -> tuple[str, int]:
    """A random-init Qwen3 of `size` saved with the tokenizer and Qwen3's template; (folder, parameters)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    import trl

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    config = AutoConfig.for_model("qwen3", vocab_size=len(tokenizer), max_position_embeddings=8192,
                                  tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                  **SIZES[size])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    folder = out / f"qwen3-{size}"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder), sum(p.numel() for p in model.parameters())


def rollout_rates(model_dir: str, args: argparse.Namespace) -> dict:
    """Tokens/s of our engine and of `model.generate` on the same prompts."""
    import torch

    from coevolve.envs.bfcl_lite import BFCLLiteEnv
    from coevolve.policy.backends import SamplingConfig
    from coevolve.policy.chat import ChatRenderer, build_demonstrations
    from coevolve.policy.hf_backend import TransformersBackend
    from coevolve.policy.models import load_model, load_tokenizer
    from coevolve.rollout import RolloutConfig, rollout

    env = BFCLLiteEnv("train")
    tasks = env.tasks()
    tokenizer = load_tokenizer(model_dir)
    renderer = ChatRenderer(tokenizer, "hermes", demonstrations=build_demonstrations(env, tasks[-40:], "hermes", 3))
    model, _ = load_model(model_dir, dtype=args.dtype, device=args.device)
    config = RolloutConfig(group_size=args.group_size, max_new_tokens=args.max_new_tokens, max_replies_per_turn=1,
                           max_turns=1, max_episode_tokens=args.max_new_tokens + 8,
                           sampling=SamplingConfig(temperature=1.0, seed=0))
    chosen = tasks[: args.tasks]
    backend = TransformersBackend(model, tokenizer)
    rollout(env, chosen[:2], backend, renderer, config)  # warm-up
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    sync()
    batch = rollout(env, chosen, backend, renderer, config)
    ours = batch.generated_tokens / batch.seconds

    prompts = [renderer.prompt_ids(renderer.opening_messages(env.reset(t).tools(), t.turns[0]), env.reset(t).tools())
               for t in chosen for _ in range(args.group_size)]
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)

    def generate(rows: slice):
        return model.generate(input_ids=ids[rows], attention_mask=mask[rows], do_sample=True, temperature=1.0,
                              top_k=0, max_new_tokens=args.max_new_tokens, pad_token_id=pad)

    generate(slice(0, 2))  # warm-up
    sync()
    started = time.perf_counter()
    out = generate(slice(None))
    sync()
    seconds = time.perf_counter() - started
    generated = int((out[:, width:] != pad).sum())
    return {"ours_tokens_per_s": ours, "ours_seconds": batch.seconds, "ours_tokens": batch.generated_tokens,
            "generate_tokens_per_s": generated / seconds, "generate_seconds": seconds, "generate_tokens": generated,
            "episodes": len(batch.trajectories)}


def grpo_step(model_dir: str, parameters: int, args: argparse.Namespace, out: Path) -> dict:
    """Median seconds of a GRPO step after one warm-up step, and the MFU it implies."""
    from coevolve.jsonl import read_jsonl
    from coevolve.loop import run

    steps = args.grpo_steps + 1
    directory = out / f"grpo-{Path(model_dir).name}"
    run(str(REPO / "configs" / "quickstart.yaml"), [
        f"model.name={model_dir}", f"model.device={args.device}", f"model.dtype={args.dtype}", "model.demos=3",
        "model.reply_format=hermes", "run.mode=static", f"run.max_steps={steps}", f"run.save_steps={steps + 1}",
        f"loop.steps_per_iteration={steps}", "loop.eval_limit=1", f"grpo.prompts_per_step={args.prompts_per_step}",
        f"rollout.group_size={args.group_size}", f"rollout.max_new_tokens={args.max_new_tokens}",
        f"rollout.max_episode_tokens={2 * args.max_new_tokens}", "rollout.max_replies_per_turn=2",
        f"grpo.bf16={str(args.dtype == 'bfloat16').lower()}", "grpo.gradient_checkpointing=true",
        "grpo.skip_flat_micro_batches=false"], str(directory), say=lambda text: None)
    logged = read_jsonl(directory / "steps.jsonl")
    times = [row["step_time"] for row in logged[1:] if "step_time" in row]
    tokens = [b["num_tokens"] - a["num_tokens"] for a, b in zip(logged, logged[1:])]
    seconds = statistics.median(times) if times else float("nan")
    step_tokens = statistics.median(tokens) if tokens else 0
    flops = 6 * parameters * step_tokens
    return {"step_seconds": seconds, "step_tokens": step_tokens, "parameters": parameters,
            "mfu": flops / (seconds * args.peak_tflops * 1e12) if times else None}


def loop_run(model_dir: str, args: argparse.Namespace, out: Path) -> dict:
    from coevolve.jsonl import read_jsonl
    from coevolve.loop import run

    directory = out / "loop"
    started = time.perf_counter()
    run(str(REPO / "configs" / "quickstart.yaml"), [
        f"model.name={model_dir}", f"model.device={args.device}", f"model.dtype={args.dtype}", "run.mode=coevolve",
        "run.max_steps=2", "loop.steps_per_iteration=1", "loop.eval_limit=8", "loop.eval_every=1",
        f"rollout.max_new_tokens={min(args.max_new_tokens, 64)}"], str(directory), say=lambda text: None)
    metrics = read_jsonl(directory / "metrics.jsonl")
    return {"seconds": time.perf_counter() - started, "iterations": [m["iteration"] for m in metrics],
            "phases": [m["seconds"] for m in metrics], "heldout": [m["heldout_success"] for m in metrics]}


def section(results: dict, args: argparse.Namespace) -> str:
    import torch

    device = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "CPU"
    lines = [f"## GPU check, {datetime.date.today()}: rollouts, a GRPO step and MFU, the loop, on random-init "
             "Qwen3 (`bench/gpu_check.py`)", "",
             f"Device: {device}, torch {torch.__version__}; {args.dtype}; {args.tasks} BFCL-lite tasks x "
             f"K={args.group_size}, replies of {args.max_new_tokens} tokens; peak {args.peak_tflops} TFLOP/s for MFU.",
             "", "| model | parameters | ours tokens/s | `generate` tokens/s (baseline) | ratio | GRPO step s | "
                 "tokens per step | MFU |", "|---|---|---|---|---|---|---|---|"]
    for size, row in results["sizes"].items():
        if "error" in row:
            lines.append(f"| {size} | - | failed: {row['error']} | | | | | |")
            continue
        r, g = row["rollouts"], row["grpo"]
        mfu = f"{g['mfu']:.1%}" if g.get("mfu") is not None else "-"
        lines.append(f"| Qwen3 {size} | {g['parameters'] / 1e9:.2f}B | {r['ours_tokens_per_s']:.0f} | "
                     f"{r['generate_tokens_per_s']:.0f} | {r['ours_tokens_per_s'] / r['generate_tokens_per_s']:.2f} | "
                     f"{g['step_seconds']:.2f} | {g['step_tokens']:.0f} | {mfu} |")
    loop = results.get("loop", {})
    lines += ["", f"Loop (mode coevolve, 2 iterations of 1 step, 8 held-out tasks): "
                  + (f"iterations {loop['iterations']} in {loop['seconds']:.0f} s, held-out {loop['heldout']}"
                     if "iterations" in loop else f"failed: {loop.get('error')}")]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["0.6B", "4B"], choices=sorted(SIZES))
    parser.add_argument("--tokenizer", default=str(REPO / ".cache" / "gpu-check" / "tokenizer"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--grpo-steps", type=int, default=2)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--skip-loop", action="store_true")
    parser.add_argument("--out", default=os.environ.get("OUT", "runs/gpu-check"))
    parser.add_argument("--benchmarks", default=None, help="also write the section into this BENCHMARKS.md")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    results: dict = {"sizes": {}}
    first = None
    for size in args.sizes:  # a failure of one size is reported, not hidden, and the others still run
        try:
            folder, parameters = qwen3_folder(size, args.tokenizer, scratch, args.dtype)
            first = first or folder
            results["sizes"][size] = {"rollouts": rollout_rates(folder, args),
                                      "grpo": grpo_step(folder, parameters, args, scratch)}
        except Exception as error:  # noqa: BLE001 - the report says what failed
            results["sizes"][size] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
        print(json.dumps({size: results["sizes"][size]}), flush=True)
    if not args.skip_loop and first is not None:
        try:
            results["loop"] = loop_run(first, args, scratch)
        except Exception as error:  # noqa: BLE001
            results["loop"] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
    (out / "gpu_check.json").write_text(json.dumps(results, indent=2, default=str))
    text = section(results, args)
    (out / "gpu_check.md").write_text(text + "\n")
    if args.benchmarks:
        from bench._report import write_section

        write_section(f"gpu-check-{datetime.date.today()}", text, Path(args.benchmarks))
    print(text)
    return 0 if all("error" not in row for row in results["sizes"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
