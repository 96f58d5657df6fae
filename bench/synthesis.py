"""Synthesis cost: seconds per signal event per stage (explore, abstract, validate), against the rollouts of the
same iterations, measured in the same process.

Question: what does CoEvolve's synthesis cost next to the training it steers (the paper: about 10% of
training time), with the offline default (offline explorer + template abstractor) and with an LLM in the loop
(the policy as explorer; an LLM abstractor behind the OpenAI-compatible server)?

Setup: the shipped SmolLM2-135M-Instruct plays two iterations of real rollouts on BFCL-lite train tasks (the
prompt of configs/lite-static.yaml: Python-call format, 3 worked examples; K samples per task); the signals of
iteration 2 (forgetting needs iteration 1's success rates) are explored, abstracted and validated. The LLM
variants run on the first `--llm-events` events only: SmolLM2 as explorer through the rollout engine, and SmolLM2
as abstractor served by `coevolve.policy.serve.ChatServer` to `OpenAIBackend` over loopback HTTP.
Usage: `python bench/synthesis.py [--tasks 8] [--samples 4] [--llm-events 4]`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench._report import machine_line, write_section  # noqa: E402


def per_event(result, events: int) -> dict:
    return {stage: result.seconds.get(stage, 0.0) / max(1, events) for stage in ("explore", "abstract", "validate")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--llm-events", type=int, default=4)
    parser.add_argument("--step-budget", type=int, default=6)
    args = parser.parse_args()

    import torch

    from coevolve.abstract import LLMAbstractor, TemplateAbstractor
    from coevolve.envs import make_env
    from coevolve.explore import ExploreConfig, LLMExplorer, OfflineExplorer
    from coevolve.synthesis import signal_contexts, synthesis_phase
    from coevolve.policy.backends import SamplingConfig
    from coevolve.policy.chat import ChatRenderer, build_demonstrations
    from coevolve.policy.hf_backend import TransformersBackend
    from coevolve.policy.models import load_model
    from coevolve.policy.openai_backend import OpenAIBackend
    from coevolve.policy.serve import ChatServer
    from coevolve.rollout import RolloutConfig, rollout
    from coevolve.signals import SignalConfig, extract_signals
    from coevolve.validate import Validator

    torch.manual_seed(0)
    model, tokenizer = load_model("smollm2", device="cpu")
    env = make_env("bfcl-lite", split="train")
    all_tasks = env.tasks()
    demos = build_demonstrations(env, all_tasks, "python", 3)
    shown = {messages[0]["content"] for messages in demos}
    tasks = [t for t in all_tasks if t.turns[0][0]["content"] not in shown][: args.tasks]
    renderer = ChatRenderer(tokenizer, "python", demonstrations=demos)
    backend = TransformersBackend(model, tokenizer)
    history: dict[str, list[float]] = {}
    rollout_seconds = []
    report = None
    for iteration in (1, 2):
        config = RolloutConfig(group_size=args.samples, max_new_tokens=48, max_replies_per_turn=2,
                               max_episode_tokens=192, sampling=SamplingConfig(temperature=0.7, seed=iteration))
        started = time.perf_counter()
        batch = rollout(env, tasks, backend, renderer, config, iteration=iteration)
        rollout_seconds.append(time.perf_counter() - started)
        report = extract_signals(batch.trajectories, history, SignalConfig(), iteration)
        for task_id, rate in report.success_rates.items():
            history.setdefault(task_id, []).append(rate)
        print(f"iteration {iteration}: rollouts {rollout_seconds[-1]:.1f} s, events "
              f"{ {k: report.count(k) for k in ('forgetting', 'boundary', 'rare')} }", flush=True)
    by_id = {t.id: t for t in tasks}
    trajectories = {t.id: t for t in batch.trajectories}
    contexts = signal_contexts(report.events, by_id, trajectories, max_contexts=64)
    events = len(contexts)
    explore_config = ExploreConfig(step_budget=args.step_budget)
    rows = []

    def measure(label, explorer, abstractor, chosen):
        result = synthesis_phase(env, chosen, by_id, explorer, abstractor, Validator(env, known=all_tasks),
                                iteration=2, seed=0)
        summary = result.summary()
        total = sum(result.seconds.values())
        row = {"label": label, "events": len(chosen), **per_event(result, len(chosen)), "total": total,
               "per_event": total / max(1, len(chosen)), "candidates": summary["candidates"],
               "accepted": summary["accepted"], "skipped": summary["skipped"], "rejected": summary["rejected_by_code"]}
        rows.append(row)
        print(row, flush=True)
        return result

    measure("offline explorer + template abstractor", OfflineExplorer(explore_config), TemplateAbstractor(), contexts)
    llm_contexts = contexts[: args.llm_events]
    policy_explorer = LLMExplorer(backend, renderer, explore_config, SamplingConfig(temperature=0.7),
                                  max_new_tokens=48, max_episode_tokens=512)
    measure("SmolLM2 explorer (the policy) + template abstractor", policy_explorer, TemplateAbstractor(),
            llm_contexts)
    with ChatServer(TransformersBackend(model, tokenizer), model_name="smollm2") as server:
        client = OpenAIBackend("smollm2", base_url=server.base_url, timeout=600)
        abstractor = LLMAbstractor(client, max_format_retries=1,
                                   sampling=SamplingConfig(temperature=0.2, max_new_tokens=256))
        measure("offline explorer + SmolLM2 abstractor (HTTP)", OfflineExplorer(explore_config), abstractor,
                llm_contexts)

    iteration_rollout = rollout_seconds[-1]
    offline = rows[0]
    lines = [
        "## Synthesis: seconds per signal event per stage (`bench/synthesis.py`)",
        "",
        "Question: what does synthesis (explore -> abstract -> validate) cost per signal event, next to "
        "the rollouts of the same iteration (the paper: feedback is about 10% of training time)?",
        "",
        f"Command: `python bench/synthesis.py --tasks {args.tasks} --samples {args.samples} --llm-events "
        f"{args.llm_events} --step-budget {args.step_budget}`. Machine: {machine_line()}. Baseline, same process: "
        f"iteration 2's rollouts of the shipped SmolLM2 on {len(tasks)} BFCL-lite train tasks x K={args.samples} "
        f"(3 worked examples, T=0.7, replies <= 48 tokens): {iteration_rollout:.1f} s "
        f"(iteration 1: {rollout_seconds[0]:.1f} s). Iteration 2 raised {events} events "
        f"({ {k: report.count(k) for k in ('forgetting', 'boundary', 'rare')} }); step budget {args.step_budget} "
        "calls per exploration episode.",
        "",
        "| variant | events | explore s/event | abstract s/event | validate s/event | total s/event | phase / "
        "iteration's rollouts | candidates | accepted | skipped |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ratio = row["total"] / iteration_rollout
        lines.append(f"| {row['label']} | {row['events']} | {row['explore']:.4f} | {row['abstract']:.4f} | "
                     f"{row['validate']:.4f} | {row['per_event']:.4f} | {ratio:.2%} | {row['candidates']} | "
                     f"{row['accepted']} | {row['skipped'] or '-'} |")
    lines += [
        "",
        f"Offline default: {offline['per_event'] * 1000:.1f} ms per event, "
        f"{offline['total'] / iteration_rollout:.2%} of the iteration's rollout time (a GRPO step on this model "
        "also spends ~90 s scoring and back-propagating, see the GRPO step section, so the share of training time "
        "is smaller still). Rejections of the offline run by code: "
        f"{offline['rejected'] or '-'}. The LLM rows use the 135M policy as explorer/abstractor only to measure "
        "the cost of an LLM in the loop on this machine; the candidates it writes are not the point.",
    ]
    write_section("synthesis", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
