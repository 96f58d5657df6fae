"""bfloat16 vs float32 on the CPU: greedy held-out eval, sampled rollouts and a GRPO-like forward+backward.

Question: on this CPU, does running the shipped SmolLM2-135M-Instruct in bfloat16 instead of float32 speed up
(a) the greedy held-out evaluation, (b) the sampled rollouts of a GRPO step and (c) the training forward+backward
of a step, and do the results agree (held-out successes, per-token logprobs)? Secondary: how much of rollout time
is the re-prefill of each episode's whole context at its second and later replies (the backend keeps no KV cache
between `generate` calls)?

Method (the settings of configs/quickstart.yaml):
- Model: `load_model("smollm2", dtype=D, device="cpu")` for D in float32, bfloat16; torch's default threads.
- Prompt: `build_demonstrations(train_env, train_env.tasks(), "python", 4, "coverage")` and
  `ChatRenderer(tokenizer, "python", demonstrations=demos, tool_style="signatures")`, as `build_renderer` does.
- Engine: `TransformersBackend(model, tokenizer)` (shared prefill), `RolloutConfig(max_new_tokens=32,
  max_replies_per_turn=2, max_episode_tokens=128)`.
- (a) `evaluate_model` on the first `--eval-tasks` (40) BFCL-lite test tasks, group size 1, temperature 0, seed 0
  (what `evaluate_heldout` runs): wall seconds, accuracy, and the tasks whose success (or call list) differs
  between the dtypes.
- (b) `evaluate_model` on the first `--train-tasks` (4) training tasks (those left after the worked examples),
  group size `--group-size` (4), temperature 1.0, seed 0: wall seconds.
- (c) the token ids of the fp32 (b) trajectories (prompt + completion, right-padded; 16 sequences of ~550-630
  tokens) run through a fresh train-mode copy of each dtype's model: `model(ids).logits -> float -> log_softmax
  -> gather`, the sum over the model's completion tokens, `backward()`, in micro-batches of `--micro-batch` (4, a
  GRPO group, the quickstart's micro batch); wall seconds for the batch. Logprob agreement: the per-token
  logprobs of the same batch (no grad, eval mode) under both dtypes; max and mean |bf16 - fp32| over all real
  tokens and over the model's completion tokens.
- Timing: one small warm-up per dtype and section, then `--rounds` (2) rounds alternating the dtypes; the best
  round of each is reported, and the ratio fp32 seconds / bf16 seconds (> 1: bf16 is faster).
- Re-prefill: `backend.generate` and `backend._prefill` are wrapped (in this script only) to time each generation
  call's prefill and count the tokens it ran; calls after the first of a rollout re-prefill every context from
  scratch. The tokens a kept cache would still have to run are the tool-result/template tokens between replies
  plus the previous reply's last token. A synthetic check times, at batch 16, a prefill of ~550-token contexts
  (unshared and shared-prefix) against 32 decode steps.

Usage: `python bench/precision.py [--eval-tasks 40] [--train-tasks 4] [--group-size 4] [--rounds 2] [--no-write]
[--micro-batch 4] [--out /tmp/precision.md]`; prints a markdown table and writes it to `--out` and to the `precision` section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench._report import machine_line, write_section  # noqa: E402

DTYPES = ("float32", "bfloat16")


class Foreign:
    """CPU seconds used by other processes during a timed section (/proc/stat busy time minus this process's
    own), the contention check: with torch on both cores, a busy neighbour slows every OpenMP region."""

    def __init__(self) -> None:
        self.busy, self.own = self._busy(), self._own()

    @staticmethod
    def _busy() -> float:
        try:
            fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        except OSError:
            return 0.0
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own() -> float:
        t = os.times()
        return t.user + t.system

    def seconds(self) -> float:
        return max(0.0, (self._busy() - self.busy) - (self._own() - self.own))


FOREIGN: list[float] = []
"""Other processes' CPU seconds per wall second, one entry per timed round."""


def note_foreign(foreign: Foreign, seconds: float) -> str:
    share = foreign.seconds() / max(seconds, 1e-9)
    FOREIGN.append(share)
    return f" [other processes: {share:.2f} cores]"


class PrefillProbe:
    """Wraps one backend's `generate` and `_prefill` to record, per generation call, the prefill seconds, the
    prompt tokens run and the call's total seconds (instance attributes only; the class is untouched)."""

    def __init__(self, backend) -> None:
        self.backend, self.calls = backend, []
        prefill, generate = backend._prefill, backend.generate

        def timed_prefill(prompts):
            started = time.perf_counter()
            out = prefill(prompts)
            self.calls[-1]["prefill_s"] += time.perf_counter() - started
            return out

        def timed_generate(prompts, sampling, stop_token_ids, budgets=None):
            record = {"rows": len(prompts), "prefill_s": 0.0, "start_tokens": backend.prefill_tokens}
            self.calls.append(record)
            started = time.perf_counter()
            out = generate(prompts, sampling, stop_token_ids, budgets)
            record["total_s"] = time.perf_counter() - started
            record["prefill_tokens"] = backend.prefill_tokens - record.pop("start_tokens")
            return out

        backend._prefill, backend.generate = timed_prefill, timed_generate

    def reset(self) -> None:
        self.calls = []


def kept_cache_tokens(trajectories) -> int:
    """Tokens a KV cache kept across an episode's replies would still run at the second and later replies: the
    between-reply tokens (mask 0) before each later reply, plus the previous reply's last sampled token (the
    backend never feeds it)."""
    total = 0
    for t in trajectories:
        mask = list(t.completion_mask)
        i = 0
        while i < len(mask):
            if mask[i] == 0:
                j = i
                while j < len(mask) and mask[j] == 0:
                    j += 1
                if j < len(mask):  # a reply follows this gap
                    total += (j - i) + 1
                i = j
            else:
                i += 1
    return total


def rollout_stats(probe: PrefillProbe, seconds: float, trajectories) -> dict:
    calls = probe.calls
    later = calls[1:]
    return {"seconds": seconds, "calls": len(calls),
            "first_prefill_s": calls[0]["prefill_s"] if calls else 0.0,
            "later_prefill_s": sum(c["prefill_s"] for c in later),
            "later_prefill_tokens": sum(c["prefill_tokens"] for c in later),
            "later_rows": sum(c["rows"] for c in later),
            "kept_cache_tokens": kept_cache_tokens(trajectories),
            "generate_s": sum(c["total_s"] for c in calls)}


def run_eval(env, tasks, backend, probe, renderer, config):
    from coevolve.evaluate import evaluate_model

    probe.reset()
    foreign = Foreign()
    started = time.perf_counter()
    report, batch = evaluate_model(env, tasks, backend, renderer, config, "model")
    seconds = time.perf_counter() - started
    stats = rollout_stats(probe, seconds, batch.trajectories)
    stats["foreign"] = note_foreign(foreign, seconds)
    return report, batch, stats


def build_batch(trajectories, pad_id):
    """(input_ids, attention_mask, completion_mask over target positions), right-padded."""
    import torch

    rows = [list(t.prompt_ids) + list(t.completion_ids) for t in trajectories]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    model_tokens = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, (row, t) in enumerate(zip(rows, trajectories)):
        ids[i, :len(row)] = torch.tensor(row)
        attention[i, :len(row)] = 1
        start = len(t.prompt_ids)
        model_tokens[i, start:len(row)] = torch.tensor(t.completion_mask, dtype=torch.bool)
    return ids, attention, model_tokens


def token_logprobs(model, ids, attention):
    """Per-token logprobs of ids[:, 1:] (float32), the GRPO-style recomputation."""
    import torch

    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1, :]
    logps = torch.log_softmax(logits.float(), dim=-1)
    return logps.gather(-1, ids[:, 1:, None]).squeeze(-1)


def train_pass(model, batch, micro_batch: int) -> float:
    ids, attention, model_tokens = batch
    model.zero_grad(set_to_none=True)
    started = time.perf_counter()
    for s in range(0, ids.shape[0], micro_batch):
        sl = slice(s, s + micro_batch)
        logps = token_logprobs(model, ids[sl], attention[sl])
        loss = -(logps * model_tokens[sl, 1:].to(logps.dtype)).sum()
        loss.backward()
    seconds = time.perf_counter() - started
    model.zero_grad(set_to_none=True)
    return seconds


def logprob_difference(models, batch, micro_batch: int) -> dict:
    import torch

    ids, attention, model_tokens = batch
    out = {}
    with torch.no_grad():
        per = {name: torch.cat([token_logprobs(m, ids[s:s + micro_batch], attention[s:s + micro_batch])
                                for s in range(0, ids.shape[0], micro_batch)]) for name, m in models.items()}
    diff = (per["bfloat16"] - per["float32"]).abs()
    real = attention[:, 1:].bool()
    completion = model_tokens[:, 1:]
    for name, where in (("all", real), ("completion", completion)):
        values = diff[where]
        out[name] = {"max": values.max().item(), "mean": values.mean().item(), "n": int(where.sum())}
    return out


def synthetic_prefill(backend, contexts, decode_tokens: int) -> dict:
    """At batch len(contexts): prefill seconds unshared and shared, and the seconds of `decode_tokens` steps."""
    import torch

    from coevolve.policy.backends import SamplingConfig

    results = {}
    with torch.inference_mode():
        for share in (False, True):
            backend.share_prefill = share
            backend._prefill(contexts[:2])  # warm
            best = float("inf")
            for _ in range(2):
                started = time.perf_counter()
                backend._prefill(contexts)
                best = min(best, time.perf_counter() - started)
            results["prefill_shared" if share else "prefill_unshared"] = best
    backend.share_prefill = True
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=decode_tokens, seed=0)
    best = float("inf")
    for _ in range(2):
        started = time.perf_counter()
        backend._generate(contexts, sampling, [], [decode_tokens] * len(contexts))  # no stop tokens: all steps
        best = min(best, time.perf_counter() - started)
    results["generate_shared"] = best
    results["decode"] = best - results["prefill_shared"]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--eval-tasks", type=int, default=40)
    parser.add_argument("--train-tasks", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--context", type=int, default=550, help="context length of the synthetic prefill check")
    parser.add_argument("--out", default="/tmp/precision.md")
    parser.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    args = parser.parse_args()

    import torch

    from coevolve.envs.bfcl_lite import BFCLLiteEnv
    from coevolve.policy.backends import SamplingConfig
    from coevolve.policy.chat import ChatRenderer, build_demonstrations
    from coevolve.policy.hf_backend import TransformersBackend
    from coevolve.policy.models import load_model
    from coevolve.rollout import RolloutConfig

    torch.manual_seed(0)
    models, backends, probes = {}, {}, {}
    tokenizer = None
    for dtype in DTYPES:
        model, tok = load_model("smollm2", dtype=dtype, device="cpu")
        tokenizer = tokenizer or tok
        models[dtype] = model
        backends[dtype] = TransformersBackend(model, tokenizer)
        probes[dtype] = PrefillProbe(backends[dtype])
    train_env, test_env = BFCLLiteEnv(split="train"), BFCLLiteEnv(split="test")
    demos = build_demonstrations(train_env, train_env.tasks(), "python", 4, "coverage")
    renderer = ChatRenderer(tokenizer, "python", demonstrations=demos, tool_style="signatures")
    shown = {messages[0]["content"] for messages in demos}
    train_tasks = [t for t in train_env.tasks() if t.turns[0][0]["content"] not in shown][: args.train_tasks]
    eval_tasks = test_env.tasks()[: args.eval_tasks]
    engine = RolloutConfig(group_size=args.group_size, max_new_tokens=32, max_replies_per_turn=2,
                           max_episode_tokens=128)
    greedy = replace(engine, group_size=1, sampling=SamplingConfig(temperature=0.0, seed=0))
    sampled = replace(engine, sampling=SamplingConfig(temperature=1.0, seed=0))
    print(f"threads {torch.get_num_threads()}; {len(eval_tasks)} eval tasks, {len(train_tasks)} train tasks",
          flush=True)

    # (a) greedy held-out eval
    for dtype in DTYPES:
        run_eval(test_env, eval_tasks[:2], backends[dtype], probes[dtype], renderer, greedy)
    FOREIGN.clear()  # the warm-ups are not timed rounds
    eval_best: dict[str, dict] = {}
    eval_outcomes: dict[str, list] = {d: [] for d in DTYPES}
    for r in range(args.rounds):
        for dtype in DTYPES:
            report, batch, stats = run_eval(test_env, eval_tasks, backends[dtype], probes[dtype], renderer, greedy)
            outcome = {t.task_id: (t.score >= 1.0, tuple(s.action for s in t.steps)) for t in batch.trajectories}
            eval_outcomes[dtype].append(outcome)
            stats["accuracy"] = report.accuracy
            stats["correct"] = report.correct
            print(f"(a) round {r} {dtype}: {stats['seconds']:.1f} s, accuracy {report.accuracy:.3f}, "
                  f"{stats['calls']} generate calls, prefill first {stats['first_prefill_s']:.1f} s, "
                  f"later {stats['later_prefill_s']:.1f} s{stats['foreign']}", flush=True)
            if dtype not in eval_best or stats["seconds"] < eval_best[dtype]["seconds"]:
                eval_best[dtype] = stats
    fp, bf = eval_outcomes["float32"][0], eval_outcomes["bfloat16"][0]
    success_differs = sum(fp[k][0] != bf[k][0] for k in fp)
    calls_differ = sum(fp[k][1] != bf[k][1] for k in fp)
    stable = {d: all(o == eval_outcomes[d][0] for o in eval_outcomes[d]) for d in DTYPES}
    print(f"(a) success differs on {success_differs}/{len(fp)} tasks, calls differ on {calls_differ}; "
          f"rounds identical: {stable}", flush=True)

    # (b) sampled rollouts
    for dtype in DTYPES:
        warm = replace(sampled, group_size=2, max_new_tokens=8)
        run_eval(train_env, train_tasks[:1], backends[dtype], probes[dtype], renderer, warm)
    del FOREIGN[len(FOREIGN) - len(DTYPES):]
    roll_best: dict[str, dict] = {}
    train_trajectories = None
    for r in range(args.rounds):
        for dtype in DTYPES:
            report, batch, stats = run_eval(train_env, train_tasks, backends[dtype], probes[dtype], renderer, sampled)
            stats["model_tokens"] = sum(sum(t.completion_mask) for t in batch.trajectories)
            stats["accuracy"] = report.accuracy
            if dtype == "float32" and train_trajectories is None:
                train_trajectories = batch.trajectories
                for t in batch.trajectories[:: args.group_size]:
                    print(f"    {t.task_id}: prompt {len(t.prompt_ids)}, completion {len(t.completion_ids)} "
                          f"({sum(t.completion_mask)} model), notes {t.reasons[-2:]}", flush=True)
            print(f"(b) round {r} {dtype}: {stats['seconds']:.1f} s, {stats['model_tokens']} model tokens, "
                  f"success {report.accuracy:.3f}, {stats['calls']} generate calls, prefill first "
                  f"{stats['first_prefill_s']:.1f} s, later {stats['later_prefill_s']:.1f} s{stats['foreign']}",
                  flush=True)
            if dtype not in roll_best or stats["seconds"] < roll_best[dtype]["seconds"]:
                roll_best[dtype] = stats

    # (c) training forward + backward on the fp32 (b) trajectories
    pad = tokenizer.pad_token_id or 0
    batch = build_batch(train_trajectories, pad)
    lengths = batch[1].sum(dim=1)
    print(f"(c) batch {tuple(batch[0].shape)}, lengths {int(lengths.min())}-{int(lengths.max())}, "
          f"{int(batch[2].sum())} model tokens", flush=True)
    diff = logprob_difference(models, batch, args.micro_batch)
    print(f"(c) |bf16 - fp32| logprobs: {diff}", flush=True)
    trainees = {}
    for dtype in DTYPES:
        trainees[dtype] = copy.deepcopy(models[dtype]).train()
        warm = tuple(x[: args.micro_batch] for x in batch)
        train_pass(trainees[dtype], warm, args.micro_batch)
    train_best: dict[str, float] = {}
    for r in range(args.rounds):
        for dtype in DTYPES:
            foreign = Foreign()
            seconds = train_pass(trainees[dtype], batch, args.micro_batch)
            print(f"(c) round {r} {dtype}: {seconds:.1f} s{note_foreign(foreign, seconds)}", flush=True)
            train_best[dtype] = min(train_best.get(dtype, float("inf")), seconds)
    del trainees

    # Synthetic re-prefill check (fp32): 16 distinct contexts of ~--context tokens at batch 16.
    contexts = [list(t.prompt_ids) + list(t.completion_ids) for t in train_trajectories]
    contexts = [c[: args.context] for c in contexts]
    synth = synthetic_prefill(backends["float32"], contexts, 32)
    print(f"synthetic (fp32, batch {len(contexts)}, ~{args.context} tokens): {synth}", flush=True)

    # Report
    def ratio(a, b):
        return a / b if b else float("nan")

    ef, eb = eval_best["float32"], eval_best["bfloat16"]
    rf, rb = roll_best["float32"], roll_best["bfloat16"]
    tf, tb = train_best["float32"], train_best["bfloat16"]
    lines = [
        "## Precision: bfloat16 vs float32 on the CPU (SmolLM2-135M, quickstart settings)",
        "",
        f"Command: `python bench/precision.py --eval-tasks {args.eval_tasks} --train-tasks {args.train_tasks} "
        f"--group-size {args.group_size} --rounds {args.rounds} --micro-batch {args.micro_batch} --out {args.out}`. "
        f"Machine: {machine_line()}, torch {torch.__version__}, {torch.get_num_threads()} threads. "
        f"Best of {args.rounds} alternating rounds after a warm-up.",
        "",
        "| measurement | float32 s | bfloat16 s | fp32/bf16 | notes |",
        "|---|---:|---:|---:|---|",
        f"| (a) greedy held-out eval, {len(eval_tasks)} test tasks x 1 | {ef['seconds']:.1f} | {eb['seconds']:.1f} | "
        f"{ratio(ef['seconds'], eb['seconds']):.2f} | accuracy fp32 {ef['accuracy']:.3f} ({ef['correct']}), "
        f"bf16 {eb['accuracy']:.3f} ({eb['correct']}); success differs on {success_differs}/{len(fp)} tasks, "
        f"call lists differ on {calls_differ}/{len(fp)} |",
        f"| (b) sampled rollouts, {len(train_tasks)} train tasks x {args.group_size}, T=1.0 | {rf['seconds']:.1f} | "
        f"{rb['seconds']:.1f} | {ratio(rf['seconds'], rb['seconds']):.2f} | model tokens fp32 "
        f"{rf['model_tokens']}, bf16 {rb['model_tokens']} (same sampler seed) |",
        f"| (c) forward+backward, {batch[0].shape[0]} seqs x {int(lengths.min())}-{int(lengths.max())} tokens, "
        f"micro-batch {args.micro_batch} | {tf:.1f} | {tb:.1f} | {ratio(tf, tb):.2f} | train mode, fresh copy "
        "per dtype; log_softmax on float logits |",
        "",
        f"Per-token logprobs, same batch, |bf16 - fp32|: all {diff['all']['n']} tokens max "
        f"{diff['all']['max']:.3f}, mean {diff['all']['mean']:.4f}; the {diff['completion']['n']} model tokens max "
        f"{diff['completion']['max']:.3f}, mean {diff['completion']['mean']:.4f}.",
        "",
        "Re-prefill (the backend builds a fresh KV cache in every `generate` call; the rollout engine calls it once "
        "per reply with each episode's whole context):",
        "",
        "| rollout | dtype | seconds | generate calls | prefill s, 1st call | prefill s, later calls (share) | "
        "tokens prefilled in later calls | tokens a kept cache would run |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, best in (("(a) greedy eval", eval_best), ("(b) sampled", roll_best)):
        for dtype in DTYPES:
            s = best[dtype]
            lines.append(f"| {label} | {dtype} | {s['seconds']:.1f} | {s['calls']} | {s['first_prefill_s']:.1f} | "
                         f"{s['later_prefill_s']:.1f} ({s['later_prefill_s'] / s['seconds']:.0%}) | "
                         f"{s['later_prefill_tokens']} | {s['kept_cache_tokens']} |")
    lines += [
        "",
        f"Synthetic (fp32, batch {len(contexts)}, contexts of {args.context} tokens): prefill unshared "
        f"{synth['prefill_unshared']:.2f} s, with the shared prefix {synth['prefill_shared']:.2f} s; 32 decode "
        f"steps {synth['decode']:.2f} s.",
    ]
    lines += ["", f"Contention check: other processes used at most {max(FOREIGN):.2f} cores (mean "
              f"{sum(FOREIGN) / len(FOREIGN):.2f}) during the timed rounds."]
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)
    if not args.no_write:
        write_section("precision", text)


if __name__ == "__main__":
    main()
