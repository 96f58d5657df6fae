"""Multi-turn rollout throughput: our batched engine vs TRL 1.16's `environment_factory` tool loop.

Question: how many episodes/s and model-generated tokens/s does `coevolve.rollout.rollout` with
`TransformersBackend` give, compared with the generation + tool loop of TRL's own `GRPOTrainer`
(`environment_factory`), on the same model, tasks, K and limits, in one process? And how much of our engine's
gain is the shared prefill alone (`share_prefill=True` vs `False`)?

Method:
- Model: SmolLM2-135M-Instruct (the shipped model, `--model smollm2`) or a random tiny Llama (`--model tiny`,
  a smoke run). Both sides use the SmolLM2 tokenizer with TRL's bundled Qwen2.5 chat template (TRL refuses
  SmolLM2's own template; this one renders `tools` and tool messages), the same model object, fp32 on the CPU.
- Tasks: the first B BFCL-lite train tasks, K samples each, temperature 0.7, no top-p/top-k. Both prompts hold
  the same messages: our renderer's opening messages (its short system line, `--demos` (3) worked examples built
  from later train tasks with `build_demonstrations`, the user's request); TRL gets exactly these messages as the
  dataset prompt and renders its tool schemas from the environment's docstrings (copied from the BFCL docs), so
  the two prompts differ only in small schema details (token counts printed and reported).
- TRL: `GRPOTrainer(environment_factory=LiteToolEnv)`; we call `trainer._generate_and_score_completions(inputs)`
  (its env pool, `reset(**row)`, tokenization, `_generate` with the tool loop) and stop it right after
  `_generate` returns (no logprob forward, no reward, no optimizer step). `max_completion_length=M` is TRL's
  budget for the whole multi-turn completion, `max_tool_calling_iterations=R`.
- Ours: `rollout(env, tasks, TransformersBackend(model, tok, share_prefill=...), ChatRenderer(tok, "hermes",
  demonstrations), RolloutConfig(group_size=K, max_new_tokens=M, max_episode_tokens=M, max_replies_per_turn=R,
  max_turns=1))`. One small limit difference: TRL generates once more after the R-th round of tool results (R+1
  generations at most), ours closes the turn after R replies with calls (R generations at most).
- Counted: episodes (B*K on every path); model tokens = sampled tokens in the completions (ours: sum of
  `completion_mask`; TRL: sum of the `tool_mask` its `_generate` returns, which is 1 on model tokens and 0 on
  tool-result/template tokens; both include the end-of-turn token when the model emitted it); tool calls (ours:
  calls sent to the env, malformed ones included; TRL: its own `tool_call_count`, i.e. parsed calls dispatched,
  failures included); wall seconds of the whole call (env resets, prompt rendering, generation, tool calls).
- Paths of ours: the shared prefill with each episode's KV cache kept across its replies (the default), the
  shared prefill re-prefilling each reply's whole context (`keep_cache=False`), and neither.
- Roofline: `bench/roofline.py` times this machine's matrix products at the model's shapes (fp32 and bf16) and
  counts our paths' forward passes; each path's seconds are reported as a multiple of the seconds those passes
  need at that throughput. Kept caches: the most bytes held at once (`kept_bytes_peak`).
- Rounds are interleaved (`--rounds`, each round runs every path once) after one small warm-up;
  the best round of each path is reported. Figures are ratios ours/TRL; the machine is small and noisy.

Usage: `python bench/rollout.py [--model smollm2|tiny] [--tasks 4] [--group-size 4] [--max-tokens 160]
[--max-tool-rounds 3] [--demos 3] [--rounds 2] [--no-write]`; writes the `rollout` section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("COEVOLVE_CACHE", str(Path(__file__).resolve().parent.parent / ".cache"))
warnings.filterwarnings("ignore")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import machine_line, write_section  # noqa: E402

TEMPERATURE = 0.7


class _Stop(Exception):
    """Raised right after TRL's `_generate` returns, to skip scoring and the optimizer."""


def _docstring(doc: dict) -> str:
    """A Google-style docstring (TRL builds tool schemas from it) carrying the BFCL description and parameters."""
    lines = [doc.get("description", doc["name"]).strip(), ""]
    properties = doc.get("parameters", {}).get("properties", {})
    if properties:
        lines.append("Args:")
        for name, spec in properties.items():
            lines.append(f"    {name}: {spec.get('description', name).strip() or name}")
    return "\n".join(lines).rstrip()


class LiteToolEnv:
    """One BFCL-lite episode for TRL's `environment_factory`; its tool methods are added by `install_tools`.

    `ENV`/`TASKS` are set by the benchmark before the trainer is built; `reset` opens the task named by the
    dataset row's `task_index`."""

    ENV = None
    TASKS: list = []

    def __init__(self):
        self.episode = None

    def reset(self, **row):
        self.episode = LiteToolEnv.ENV.reset(LiteToolEnv.TASKS[int(row["task_index"])])
        return None

    def _act(self, name: str, arguments: dict) -> str:
        return self.episode.act([{"name": name, "arguments": arguments}])[0].observation

    def get_reward(self) -> float:
        return 0.0


_PYTHON_TYPES = {"string": str, "boolean": bool, "integer": int, "number": float, "float": float}


def install_tools(docs: list[dict]) -> None:
    """One `LiteToolEnv` method per BFCL doc, with the signature, type hints and docstring TRL builds its tool
    schema from, so TRL's schemas say what ours say; each forwards to the episode."""
    for doc in docs:
        name = doc["name"]
        parameters = doc.get("parameters", {})
        required = set(parameters.get("required", []))
        signature = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        annotations: dict = {"return": str}
        for parameter, spec in parameters.get("properties", {}).items():
            annotations[parameter] = _PYTHON_TYPES[spec.get("type", "string")]
            default = inspect.Parameter.empty if parameter in required else spec.get("default")
            signature.append(inspect.Parameter(parameter, inspect.Parameter.KEYWORD_ONLY, default=default,
                                               annotation=annotations[parameter]))

        def method(self, _name=name, **arguments) -> str:
            return self._act(_name, arguments)

        method.__name__ = method.__qualname__ = name
        method.__signature__ = inspect.Signature(signature, return_annotation=str)
        method.__annotations__ = annotations
        method.__doc__ = _docstring(doc)
        setattr(LiteToolEnv, name, method)


def load(model_name: str):
    import trl
    from coevolve.policy.models import build_tiny_model, load_model, load_tokenizer

    if model_name == "tiny":
        tokenizer = load_tokenizer("smollm2")
        model = build_tiny_model(tokenizer, hidden_size=64, num_layers=2)
    else:
        model, tokenizer = load_model("smollm2", device="cpu")
    tokenizer.chat_template = trl.chat_template_utils.qwen2_5_chat_template
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def build_trainer(model, tokenizer, prompts, group_size, max_tokens, max_rounds):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    tokenizer.padding_side = "left"
    dataset = Dataset.from_dict({"prompt": prompts, "task_index": list(range(len(prompts)))})
    config = GRPOConfig(
        output_dir="/tmp/coevolve_bench_rollout_trl", report_to="none", use_cpu=True, bf16=False,
        per_device_train_batch_size=len(prompts) * group_size, num_generations=group_size,
        max_completion_length=max_tokens, max_tool_calling_iterations=max_rounds, temperature=TEMPERATURE,
        top_p=1.0, top_k=0, gradient_checkpointing=False, logging_steps=1, save_strategy="no",
    )
    trainer = GRPOTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                          environment_factory=LiteToolEnv)
    inputs = [dict(dataset[i]) for i in range(len(dataset)) for _ in range(group_size)]
    captured: dict = {}
    original = trainer._generate

    def generate_then_stop(prompts):
        captured["out"] = original(prompts)
        raise _Stop

    trainer._generate = generate_then_stop
    return trainer, inputs, captured


def run_trl(trainer, inputs, captured, seed: int) -> dict:
    import torch

    torch.manual_seed(seed)
    started = time.perf_counter()
    try:
        trainer._generate_and_score_completions(inputs)
    except _Stop:
        pass
    seconds = time.perf_counter() - started
    prompt_ids, completion_ids, tool_mask, *_ = captured.pop("out")
    model_tokens = sum(sum(m) for m in tool_mask) if tool_mask is not None else sum(len(c) for c in completion_ids)
    mode = "train" if trainer.model.training else "eval"
    frequency = trainer._metrics[mode].get("tools/call_frequency") or [0.0]
    calls = round(frequency[-1] * len(inputs))
    return {"episodes": len(completion_ids), "model_tokens": model_tokens, "calls": calls, "seconds": seconds,
            "prompt_tokens": sum(len(p) for p in prompt_ids) / len(prompt_ids), "prefill": None}


def run_ours(env, tasks, backend, renderer, config, seed: int, counter=None) -> dict:
    import torch

    from coevolve.rollout import rollout

    torch.manual_seed(seed)
    backend.prefill_tokens = backend.kept_bytes_peak = 0
    if counter is not None:
        counter.take()
    batch = rollout(env, tasks, backend, renderer, config)
    trajectories = batch.trajectories
    return {"episodes": len(trajectories), "model_tokens": sum(sum(t.completion_mask) for t in trajectories),
            "calls": sum(len(t.steps) for t in trajectories), "seconds": batch.seconds,
            "prompt_tokens": sum(len(t.prompt_ids) for t in trajectories) / len(trajectories),
            "prefill": backend.prefill_tokens, "forwards": counter.take() if counter is not None else [],
            "kept_bytes": backend.kept_bytes_peak, "generate_calls": batch.generation_calls}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    parser.add_argument("--tasks", type=int, default=4, help="B: BFCL-lite train tasks")
    parser.add_argument("--group-size", type=int, default=4, help="K: episodes per task")
    parser.add_argument("--max-tokens", type=int, default=160, help="M: completion budget per episode (and reply)")
    parser.add_argument("--max-tool-rounds", type=int, default=3, help="R: tool-calling rounds per episode")
    parser.add_argument("--demos", type=int, default=3, help="worked examples in both prompts (so the model calls tools)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    args = parser.parse_args()
    B, K, M, R = args.tasks, args.group_size, args.max_tokens, args.max_tool_rounds

    import torch
    import trl

    from coevolve.envs import make_env
    from coevolve.policy.backends import SamplingConfig
    from coevolve.policy.chat import ChatRenderer, build_demonstrations
    from coevolve.policy.hf_backend import TransformersBackend
    from coevolve.rollout import RolloutConfig

    torch.manual_seed(0)
    model, tokenizer = load(args.model)
    env = make_env("bfcl-lite", split="train")
    all_tasks = env.tasks()
    tasks = all_tasks[:B]
    demos = build_demonstrations(env, all_tasks[B:], "hermes", args.demos)
    renderer = ChatRenderer(tokenizer, "hermes", demonstrations=demos)
    assert renderer.tools_in_template, "the Qwen2.5 template should render the tools"

    prompts = []
    for task in tasks:
        episode = env.reset(task)
        prompts.append(renderer.opening_messages(episode.tools(), episode.user_messages()))
    LiteToolEnv.ENV, LiteToolEnv.TASKS = env, tasks
    install_tools(env.reset(tasks[0]).tools())

    trainer, inputs, captured = build_trainer(model, tokenizer, prompts, K, M, R)
    model.eval()
    config = RolloutConfig(group_size=K, max_new_tokens=M, max_episode_tokens=M, max_replies_per_turn=R,
                           max_turns=1, sampling=SamplingConfig(temperature=TEMPERATURE))
    from bench.roofline import Counter, measure

    kept = TransformersBackend(model, tokenizer, share_prefill=True, keep_cache=True)
    shared = TransformersBackend(model, tokenizer, share_prefill=True, keep_cache=False)
    unshared = TransformersBackend(model, tokenizer, share_prefill=False, keep_cache=False)
    counters = {id(backend): Counter(backend) for backend in (kept, shared, unshared)}
    rooflines = [measure(model, torch.float32), measure(model, torch.bfloat16)]

    # Warm-up: one small call per path (first-call allocations, lazy imports, template compilation).
    warm = RolloutConfig(group_size=2, max_new_tokens=8, max_episode_tokens=8, max_replies_per_turn=1, max_turns=1,
                         sampling=SamplingConfig(temperature=TEMPERATURE))
    for backend in (kept, shared, unshared):
        run_ours(env, tasks[:1], backend, renderer, warm, 0)
    saved_length, saved_budget = trainer.max_completion_length, trainer.generation_config.max_new_tokens
    trainer.max_completion_length = trainer.generation_config.max_new_tokens = 8
    run_trl(trainer, inputs[:K], captured, 0)
    trainer.max_completion_length, trainer.generation_config.max_new_tokens = saved_length, saved_budget

    paths = {"TRL GRPOTrainer tool loop": lambda seed: run_trl(trainer, inputs, captured, seed),
             "ours (shared prefill, kept cache)": lambda seed: run_ours(env, tasks, kept, renderer, config, seed,
                                                                        counters[id(kept)]),
             "ours (shared prefill, each reply re-prefilled)": lambda seed: run_ours(
                 env, tasks, shared, renderer, config, seed, counters[id(shared)]),
             "ours (no prefill sharing, re-prefilled)": lambda seed: run_ours(env, tasks, unshared, renderer, config,
                                                                               seed, counters[id(unshared)])}
    best: dict[str, dict] = {}
    for round_index in range(args.rounds):
        for name, run in paths.items():
            result = run(1000 + round_index)
            print(f"round {round_index} {name}: {result['episodes']} episodes, {result['model_tokens']} model tokens, "
                  f"{result['calls']} tool calls, {result['seconds']:.1f} s"
                  + (f", prefill {result['prefill']} tokens" if result["prefill"] is not None else ""), flush=True)
            if name not in best or result["seconds"] < best[name]["seconds"]:
                best[name] = result

    trl_key, ours_key, reprefill_key, unshared_key = list(paths)
    prompt_trl, prompt_ours = best[trl_key]["prompt_tokens"], best[ours_key]["prompt_tokens"]
    gap = abs(prompt_trl - prompt_ours) / prompt_ours
    print(f"mean prompt tokens: ours {prompt_ours:.0f}, TRL {prompt_trl:.0f} ({gap:.1%} apart"
          + (", MORE THAN 10%: prompts are not comparable)" if gap > 0.10 else ")"))

    def per_second(result, key):
        return result[key] / result["seconds"]

    fp32 = rooflines[0]
    rows = ["| path | episodes/s | model tokens/s | model tokens | tool calls | prefilled tokens | seconds (best round) "
            "| roofline s (its shapes) | x roofline | roofline s (large M) | x large-M roofline |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, result in best.items():
        if result.get("forwards"):
            shaped, flat = fp32.seconds(result["forwards"]), fp32.seconds(result["forwards"], best_only=True)
            prefilled = str(result["prefill"])
        else:  # TRL: its forward calls are not counted; its tokens through the model, every product at the best M
            ran = round(result["prompt_tokens"] * result["episodes"]) + result["model_tokens"]
            shaped, flat, prefilled = None, fp32.flat_seconds(ran), f"~{ran} (prompt + completion, once each)"
        rows.append(f"| {name} | {per_second(result, 'episodes'):.3f} | {per_second(result, 'model_tokens'):.1f} | "
                    f"{result['model_tokens']} | {result['calls']} | {prefilled} | {result['seconds']:.1f} | "
                    + (f"{shaped:.1f} | {result['seconds'] / shaped:.2f} | " if shaped else "- | - | ")
                    + f"{flat:.1f} | {result['seconds'] / flat:.2f} |")
    throughput = ["| dtype | " + " | ".join(f"M={m}" for m in fp32.throughput) + " |",
                  "|---|" + "---:|" * len(fp32.throughput)]
    for roofline in rooflines:
        throughput.append(f"| {roofline.dtype} | " + " | ".join(f"{v / 1e9:.1f}" for v in roofline.throughput.values())
                          + " |")
    ours, theirs, plain, reprefill = best[ours_key], best[trl_key], best[unshared_key], best[reprefill_key]
    episode_ratio = per_second(ours, "episodes") / per_second(theirs, "episodes")
    token_ratio = per_second(ours, "model_tokens") / max(per_second(theirs, "model_tokens"), 1e-9)
    share_ratio = per_second(ours, "episodes") / per_second(plain, "episodes")
    ratios = [
        f"- ours (kept cache) / TRL: **{episode_ratio:.2f}x** episodes/s, **{token_ratio:.2f}x** model tokens/s.",
        f"- shared prefill + kept cache / neither (ours): **{share_ratio:.2f}x** episodes/s; prefill tokens run "
        f"{ours['prefill']} vs {plain['prefill']} ({plain['prefill'] / max(ours['prefill'], 1):.1f}x fewer).",
        f"- kept cache / re-prefilled (ours, both sharing the prefix): "
        f"**{per_second(ours, 'episodes') / per_second(reprefill, 'episodes'):.2f}x** episodes/s; prefill tokens "
        f"{ours['prefill']} vs {reprefill['prefill']} over {ours['generate_calls']} generate calls; the kept caches "
        f"held at most {ours['kept_bytes'] / 2**20:.0f} MiB at once (freed when the rollout ends).",
        f"- ours (kept cache) against the roofline at the shapes it ran: **{ours['seconds'] / fp32.seconds(ours['forwards']):.2f}x** "
        f"(goal <= 2x); against every product at the best M: {ours['seconds'] / fp32.seconds(ours['forwards'], True):.2f}x.",
    ]
    table = "\n".join(rows + [""] + ratios + ["", "This machine's matrix throughput, GFLOP/s, the model's linear "
                                                   "shapes at M rows (`bench/roofline.py`):", ""] + throughput)
    print(table)

    command = "python bench/rollout.py" + "".join(
        f" {flag} {value}" for flag, value, default in (
            ("--model", args.model, "smollm2"), ("--tasks", B, 4), ("--group-size", K, 4), ("--max-tokens", M, 160),
            ("--max-tool-rounds", R, 3), ("--rounds", args.rounds, 2)) if value != default)
    markdown = f"""## Multi-turn rollout: our engine vs TRL's `environment_factory` tool loop

Question: episodes/s and model-generated tokens/s of `coevolve.rollout.rollout` + `TransformersBackend` against
TRL {trl.__version__}'s `GRPOTrainer` generation + tool loop (no scoring, no optimizer step), same model, tasks, K
and limits, in one process; and the gain of the shared prefill alone.

Command: `{command}` ({machine_line()}; torch {torch.__version__}, {torch.get_num_threads()} threads).

Settings: model {"SmolLM2-135M-Instruct" if args.model == "smollm2" else "random tiny Llama (64 wide, 2 layers)"}
(fp32, CPU) with TRL's Qwen2.5 chat template; B={B} BFCL-lite train tasks, K={K}, M={M} completion tokens per
episode, R={R} tool rounds, temperature {TEMPERATURE}, {args.demos} worked examples; mean prompt tokens ours
{prompt_ours:.0f}, TRL {prompt_trl:.0f}. Best of {args.rounds} interleaved round(s) after a small warm-up.

{table}

What differs between the loops: TRL re-prefills every still-calling episode's whole conversation (prompt and
completion so far) at each tool round, runs the K copies of a prompt as separate rows, and lets every generation
call sample up to M new tokens before cutting the episode to its M-token budget; ours prefills the prefix common
to all prompts once and each distinct prompt once for its K samples, keeps each episode's KV cache from one reply
to the next (the reply after a tool result prefills only the result and the template around it; the
"re-prefilled" rows rebuild it at every call, as this engine did before), and gives each reply only what is left
of its episode's budget. TRL also generates once more after the R-th tool round. The roofline columns
(`bench/roofline.py`): the seconds the path's forward passes need at this machine's measured matrix throughput
for the shapes they ran (decoding runs products of a few rows, where this CPU is slow), and with every product at
the best throughput measured; TRL's forward calls are not counted, so its figure is its tokens (each prompt and
completion once, the least it could run) at the best throughput.
The tool-call columns count calls per path: the 135M model calls tools in few episodes, so these figures are
mostly its first replies. Long multi-turn episodes, where both loops re-prefill each step, are not measured here.
"""
    if not args.no_write:
        write_section("rollout", markdown)


if __name__ == "__main__":
    main()
