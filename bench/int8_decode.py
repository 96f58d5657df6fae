"""What int8 weights would buy a rollout's decode on this CPU, and what mismatch the trainer would have to correct.

Question (issue "a run that costs half", item 2: int8 weights for generation, FlashRL-style, with the trainer's
importance-sampling correction for the mismatch): before building that lever, at the decode shapes of the shipped
CPU configs, (a) how much faster is one decode step's forward with the linear layers in dynamic int8
(`torch.ao.quantization.quantize_dynamic`, per-row int8 weights, activations quantized per call) than in float32;
(b) what does quantizing the policy cost, since a rollout model made from the trained weights must be redone after
every optimizer step; (c) how far do the int8 model's log-probabilities of tokens the float32 policy sampled fall
from the policy's own: the ratio an importance-sampling correction multiplies each token's loss by, and the share
of tokens a truncation at [0.5, 2] would clip.

Method: the shipped SmolLM2-135M-Instruct in float32 and its dynamic-int8 copy (the decoder's `nn.Linear` layers, and
those and the LM head; per-row weight scales), `torch.set_num_threads(--threads)`. (a) per rows in `--rows`: a prompt of `--past` tokens prefilled once
into each model's KV cache, then one new token per row through each, best of `--repeats` interleaved.
(b) `quantize_dynamic` over a fresh copy of the float32 model, best of 3. (c) `--rows` x `--tokens` tokens sampled
from the float32 model at temperature 1 after a shared prompt, then both models' log-probabilities of those very
tokens in one teacher-forced pass each.

Usage: `python bench/int8_decode.py [--rows 4 16 64] [--past 256] [--tokens 32] [--repeats 10] [--threads 2]
[--no-write]`; writes the `int8_decode` section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import machine_line, write_section  # noqa: E402

PROMPT = ("You can call these tools: ls(), cd(folder), mkdir(name), touch(name), cat(name), rm(name). "
          "Reply with one call. ")


def quantized(model, head: bool):
    """A dynamic-int8 copy: per-output-row weight scales (per-tensor ones lose the tied LM head's outlier rows);
    `head`: the LM head too, or the decoder's linear layers only."""
    import torch
    from torch.ao.quantization import per_channel_dynamic_qconfig

    copied = copy.deepcopy(model)
    names = {name for name, module in copied.named_modules() if isinstance(module, torch.nn.Linear)
             and (head or module is not copied.get_output_embeddings())}
    return torch.ao.quantization.quantize_dynamic(copied, {name: per_channel_dynamic_qconfig for name in names},
                                                  dtype=torch.qint8)


def weights_rounded(model):
    """A float32 copy whose decoder linear weights went through int8 and back (per-row scales): the mismatch of
    weight-only int8, with activations left in float32, to tell the weights' share of the gap from the activations'."""
    import torch

    copied = copy.deepcopy(model)
    with torch.no_grad():
        for module in copied.modules():
            if isinstance(module, torch.nn.Linear) and module is not copied.get_output_embeddings():
                scales = module.weight.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127
                module.weight.copy_(torch.round(module.weight / scales).clamp(-127, 127) * scales)
    return copied


def weight_only_kernel(model, rows: int, repeats: int) -> tuple[float, float] | None:
    """Best seconds of torch's weight-only int8 matrix kernel (`_weight_int8pack_mm`) against float32's linear over
    the decoder's linear shapes at `rows` rows; None where this build has no such kernel."""
    import torch

    shapes = {tuple(m.weight.shape) for m in model.modules()
              if isinstance(m, torch.nn.Linear) and m is not model.get_output_embeddings()}
    total = {"float32": 0.0, "int8": 0.0}
    for out_features, in_features in shapes:
        weight, x = torch.randn(out_features, in_features), torch.randn(rows, in_features)
        scales = weight.abs().amax(dim=1) / 127
        packed = torch.round(weight / scales[:, None]).to(torch.int8)
        runs = {"float32": lambda: torch.nn.functional.linear(x, weight),
                "int8": lambda: torch._weight_int8pack_mm(x, packed, scales)}
        for name, run in runs.items():
            try:
                run()
            except (RuntimeError, AttributeError):
                return None
            best = float("inf")
            for _ in range(repeats):
                started = time.perf_counter()
                run()
                best = min(best, time.perf_counter() - started)
            total[name] += best
    return total["float32"], total["int8"]


def prompt_ids(tokenizer, rows: int, length: int):
    import torch

    ids = tokenizer(PROMPT * (1 + length // 8), return_tensors="pt").input_ids[:, :length]
    return ids.repeat(rows, 1)


def decode_seconds(models: dict, tokenizer, rows: int, past: int, repeats: int) -> dict[str, float]:
    """Best seconds of one decode step (one new token per row after a `past`-token cache), per model."""
    import torch
    from transformers import DynamicCache

    ids = prompt_ids(tokenizer, rows, past)
    caches = {}
    with torch.no_grad():
        for name, model in models.items():
            cache = DynamicCache()
            model(input_ids=ids, past_key_values=cache, use_cache=True)
            caches[name] = cache
        new = ids[:, -1:]
        best = {name: float("inf") for name in models}
        for _ in range(repeats):
            for name, model in models.items():
                started = time.perf_counter()
                model(input_ids=new, past_key_values=caches[name], use_cache=True)
                best[name] = min(best[name], time.perf_counter() - started)
                caches[name].crop(-1)  # drop the new token: the same cache length every repeat
    return best


def mismatch(reference, rollout_model, tokenizer, rows: int, tokens: int, seed: int = 0) -> dict[str, float]:
    """Sample from `reference`; score the same tokens under both; the per-token importance ratios."""
    import torch

    torch.manual_seed(seed)
    ids = prompt_ids(tokenizer, rows, 64)
    with torch.no_grad():
        sampled = reference.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                                     top_k=0, top_p=1.0, max_new_tokens=tokens, min_new_tokens=tokens,
                                     pad_token_id=tokenizer.eos_token_id)

        def logps(model):
            logits = model(input_ids=sampled).logits[:, ids.shape[1] - 1:-1].float()
            return torch.log_softmax(logits, -1).gather(-1, sampled[:, ids.shape[1]:, None]).squeeze(-1)

        policy, rollout = logps(reference), logps(rollout_model)
    ratio = torch.exp(policy - rollout)  # pi_theta / pi_rollout: what a truncated IS correction multiplies by
    return {"tokens": int(ratio.numel()), "mean_abs_logp": float((policy - rollout).abs().mean()),
            "max_abs_logp": float((policy - rollout).abs().max()), "ratio_mean": float(ratio.mean()),
            "clipped": float(((ratio < 0.5) | (ratio > 2.0)).float().mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", nargs="+", type=int, default=[4, 16, 64])
    parser.add_argument("--past", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    import torch

    from coevolve.policy.models import load_model

    torch.set_num_threads(args.threads)
    model, tokenizer = load_model("smollm2", dtype="float32", device="cpu")
    model.eval()
    quantize_seconds = {}
    models = {"float32": model}
    for label, head in (("int8 decoder", False), ("int8 decoder + head", True)):
        quantize_seconds[label] = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            models[label] = quantized(model, head).eval()
            quantize_seconds[label] = min(quantize_seconds[label], time.perf_counter() - started)
    labels = list(models)[1:]
    rows_table = ["| rows | past tokens | float32 ms per decode step | " + " | ".join(
        f"{label} ms | float32 / {label}" for label in labels) + " |", "|---:|---:|---:|" + "---:|---:|" * len(labels)]
    for rows in args.rows:
        best = decode_seconds(models, tokenizer, rows, args.past, args.repeats)
        rows_table.append(f"| {rows} | {args.past} | {best['float32'] * 1e3:.1f} | " + " | ".join(
            f"{best[label] * 1e3:.1f} | {best['float32'] / best[label]:.2f}x" for label in labels) + " |")
        print(rows_table[-1], flush=True)
    scored = {**{label: models[label] for label in labels}, "weight-only int8 (float32 activations)":
              weights_rounded(model)}
    gaps = {label: mismatch(model, other, tokenizer, rows=min(args.rows[-1], 16), tokens=args.tokens)
            for label, other in scored.items()}
    gap_lines = "\n".join(
        f"- {label}: " + (f"quantizing the float32 model (a fresh copy, what each optimizer step would redo) "
                          f"**{quantize_seconds[label]:.2f} s**; " if label in quantize_seconds else "") +
        f"of {gap['tokens']} tokens sampled from the float32 model at temperature "
        f"1, mean |log p_float32 - log p_int8| {gap['mean_abs_logp']:.3f} (max {gap['max_abs_logp']:.2f}), mean "
        f"ratio p_float32 / p_int8 {gap['ratio_mean']:.3f}, **{gap['clipped']:.1%}** outside [0.5, 2]."
        for label, gap in gaps.items())
    kernel = weight_only_kernel(model, 16, args.repeats)
    kernel_line = ("- torch's weight-only int8 kernel (`_weight_int8pack_mm`, what would keep activations in float32) "
                   "is not in this build." if kernel is None else
                   f"- torch's weight-only int8 kernel (`_weight_int8pack_mm`, what would keep activations in "
                   f"float32) over the decoder's linear shapes at 16 rows: {kernel[1] * 1e3:.2f} ms against "
                   f"float32's {kernel[0] * 1e3:.2f} ms (**{kernel[0] / kernel[1]:.2f}x**).")
    text = f"""## int8 weights for decoding, before building the lever (`bench/int8_decode.py`)

Question: how much faster is a decode step with dynamic-int8 linear layers than in float32, what does quantizing the
policy after each optimizer step cost, and how far apart are the two models' log-probabilities of the policy's own
samples (what an importance-sampling correction would multiply each token by)?

Command: `python bench/int8_decode.py --rows {' '.join(map(str, args.rows))} --past {args.past} --tokens {args.tokens} --repeats {args.repeats} --threads {args.threads}` ({machine_line()}; torch {torch.__version__}, {args.threads} threads). The shipped SmolLM2-135M-Instruct;
`torch.ao.quantization.quantize_dynamic` with per-row weight scales over the decoder's `nn.Linear` layers, and
over those and the LM head; best of {args.repeats}
interleaved decode steps per model after a {args.past}-token prefill (module docstring).

{chr(10).join(rows_table)}

{gap_lines}
{kernel_line}
"""
    print(text)
    if not args.no_write:
        write_section("int8_decode", text)


if __name__ == "__main__":
    main()
