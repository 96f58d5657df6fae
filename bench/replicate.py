"""A small-scale replication of the paper's ablation table on CPU: every mode, several seeds, held-out success with
95% confidence intervals, next to the paper's figures.

Question: does the paper's ordering (zero-shot < GRPO on static data < + synthetic data < + random exploration <
+ feedback signals, with forgetting the most valuable signal and the feedback phase ~10% of training time) hold
for SmolLM2-135M on BFCL-lite, at equal rollout budget?

Arms (each a `coevolve train` run of `configs/quickstart.yaml` with overrides): zero-shot (evaluation only; greedy,
so one run stands for every seed), static, synthetic, random, coevolve, and coevolve without each signal. Every
training arm gets the same model rollouts: `--steps` GRPO steps of the config's tasks x K (the feedback phase's
exploration runs the env, not the model, with the offline explorer). Held-out: the first `--heldout` BFCL-lite
test tasks, greedy, before training (iteration 0) and after the last iteration.

Confidence intervals: per arm, the mean over seeds of held-out success after training, +- t(0.975, n-1) x sd /
sqrt(n) (seed-to-seed spread; with 3 seeds t = 4.30, so the interval is wide, honestly); the zero-shot row's
interval is Wilson's over its tasks. `delta vs static` is the mean over seeds of the paired difference (same seed,
same held-out tasks).

Resumable: each run has its own directory under `--out`; a finished run (summary.json present) is read, not rerun;
an interrupted one is continued with `--resume`. Usage:
`python bench/replicate.py [--seeds 0 1 2] [--steps 6] [--steps-per-iteration 3] [--heldout 40] [--arms ...]
[--max-minutes M] [--no-write]`.

Budget (measured on 2 cores): a run costs ~110 s (start-up, two held-out passes of 40 tasks) + ~33 s per GRPO step
of 4 tasks x K=4. 21 training runs (7 arms x 3 seeds) + one zero-shot evaluation: ~110 minutes at 6 steps (two
iterations of 3, so the tasks the feedback phase adds after the first are trained on in the second), ~130 at 8.
Hence 6 steps: the 2-hour limit with a margin.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import machine_line, write_section  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "quickstart.yaml"

ARMS = {
    "zero-shot": ["run.mode=zero-shot"],
    "static": ["run.mode=static"],
    "synthetic": ["run.mode=synthetic"],
    "random": ["run.mode=random"],
    "coevolve": ["run.mode=coevolve"],
    "coevolve w/o forgetting": ["run.mode=coevolve", "signals.enabled=[boundary,rare]"],
    "coevolve w/o boundary": ["run.mode=coevolve", "signals.enabled=[forgetting,rare]"],
    "coevolve w/o rare": ["run.mode=coevolve", "signals.enabled=[forgetting,boundary]"],
}
PAPER_BFCL = {"zero-shot": "26.50", "synthetic": "58.00", "random": "60.50", "coevolve": "63.00"}
"""Qwen3-4B on BFCL-V3 multi-turn, the paper's ablation table (its rows are cumulative: + synthetic data,
+ random exploration, + feedback). Its signal ablation is reported on the AppWorld/BFCL average only
(49.36 -> 45.18 without forgetting, 47.17 without boundary, 47.21 without rare)."""

T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def slug(arm: str) -> str:
    return arm.replace(" ", "-").replace("/", "")


def config_differences(saved: Path, overrides: list[str]) -> list[str]:
    """Settings in which a run folder's resolved config differs from what this invocation asks for (a changed
    configs/quickstart.yaml, or other --steps), so that old runs are never read back as new ones."""
    from coevolve.config import load_config

    def flat(config: dict, prefix: str = "") -> dict:
        items = {}
        for key, value in config.items():
            if isinstance(value, dict):
                items.update(flat(value, f"{prefix}{key}."))
            else:
                items[f"{prefix}{key}"] = value
        return items

    have, want = flat(load_config(saved).to_dict()), flat(load_config(str(CONFIG), overrides).to_dict())
    return sorted(key for key in set(have) | set(want) if key != "run.output_dir" and have.get(key) != want.get(key))


def run_arm(arm: str, seed: int, steps: int, heldout: int, out: Path, steps_per_iteration: int = 3) -> dict:
    """One run (resumed if it was interrupted, read back if it finished)."""
    folder = out / f"{slug(arm)}-seed{seed}"
    overrides = [f"run.seed={seed}", f"run.max_steps={steps}", f"loop.eval_limit={heldout}",
                 f"loop.steps_per_iteration={steps_per_iteration}", *ARMS[arm]]
    if (folder / "config.yaml").exists():
        changed = config_differences(folder / "config.yaml", overrides)
        if changed:
            raise SystemExit(f"{folder} was run with other settings ({', '.join(changed)}); delete it or pick "
                             "another --out")
    if not (folder / "summary.json").exists():
        command = [str(REPO / ".venv" / "bin" / "coevolve"), "train", "--config", str(CONFIG), "--output-dir",
                   str(folder), *overrides]
        if folder.exists():
            command.append("--resume")
        started = time.perf_counter()
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{arm} seed {seed} failed:\n{done.stderr[-3000:]}")
        (folder / "bench-seconds.txt").write_text(f"{time.perf_counter() - started:.1f}\n")
    # The table needs the run's logs, not its optimizer state: ~1.6 GB of checkpoints per run would fill a disk
    # over 22 runs (final/ keeps the trained weights).
    shutil.rmtree(folder / "checkpoints", ignore_errors=True)
    from coevolve.jsonl import read_jsonl

    metrics = read_jsonl(folder / "metrics.jsonl")
    summary = json.loads((folder / "summary.json").read_text())
    after = next(m["heldout_success"] for m in reversed(metrics) if m["heldout_success"] is not None)
    seconds_file = folder / "bench-seconds.txt"
    return {"arm": arm, "seed": seed, "before": metrics[0]["heldout_success"], "after": after,
            "added": summary.get("tasks_added", 0), "feedback_share": summary.get("feedback_share", 0.0),
            "seconds": float(seconds_file.read_text()) if seconds_file.exists() else float("nan"),
            "signals": {kind: sum(m["signals"].get(kind, 0) for m in metrics) for kind in
                        ("forgetting", "boundary", "rare")}}


def t_interval(values: list[float]) -> tuple[float, float]:
    mean = statistics.mean(values)
    if len(values) < 2:
        return mean, float("nan")
    return mean, T_975.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))


def wilson(successes: float, total: int) -> tuple[float, float]:
    if total == 0:
        return 0.0, 0.0
    z, p = 1.96, successes / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return centre - half, centre + half


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--steps-per-iteration", type=int, default=3)
    parser.add_argument("--heldout", type=int, default=40)
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--out", default=str(REPO / "runs" / "replicate"))
    parser.add_argument("--max-minutes", type=float, default=0,
                        help="start no new run after this many minutes (0: no limit); rerun to continue")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--section", default="replicate",
                        help="BENCHMARKS.md section to write (another name keeps an earlier table, e.g. other --steps)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    rows: dict[str, list[dict]] = {arm: [] for arm in args.arms}
    skipped = 0
    # Seed by seed, every arm of a seed before the next seed: an invocation stopped by --max-minutes (or killed)
    # leaves complete paired comparisons behind, and the next invocation continues where it stopped.
    for seed in args.seeds:
        for arm in args.arms:
            if arm == "zero-shot" and seed != args.seeds[0]:
                continue  # greedy evaluation of the untrained model: one run stands for every seed
            folder = out / f"{slug(arm)}-seed{seed}"
            over_budget = args.max_minutes and (time.perf_counter() - started) / 60 > args.max_minutes
            if over_budget and not (folder / "summary.json").exists():
                skipped += 1
                continue
            result = run_arm(arm, seed, args.steps, args.heldout, out, args.steps_per_iteration)
            rows[arm].append(result)
            print(json.dumps(result), flush=True)
    rows = {arm: results for arm, results in rows.items() if results}
    total_minutes = (time.perf_counter() - started) / 60
    static_after = {r["seed"]: r["after"] for r in rows.get("static", [])}
    table = ["| arm | runs | held-out success after (mean +- 95% CI) | per seed | delta vs static (paired mean) | "
             "tasks added (mean) | feedback share | signals fired (forgetting / boundary / rare, total) | "
             "paper, BFCL (Qwen3-4B) |", "|---|---|---|---|---|---|---|---|---|"]
    for arm, results in rows.items():
        afters = [r["after"] for r in results]
        if arm == "zero-shot":
            low, high = wilson(afters[0] * args.heldout, args.heldout)
            interval = f"{afters[0]:.3f} [{low:.3f}, {high:.3f}] (Wilson, tasks)"
        else:
            mean, half = t_interval(afters)
            interval = f"{mean:.3f} +- {half:.3f}" if len(afters) > 1 else f"{mean:.3f} (one seed: no interval)"
        paired = [r["after"] - static_after[r["seed"]] for r in results if r["seed"] in static_after]
        delta = f"{statistics.mean(paired):+.3f}" if paired and arm not in ("static", "zero-shot") else "-"
        signals = {kind: sum(r["signals"][kind] for r in results) for kind in ("forgetting", "boundary", "rare")}
        table.append(
            f"| {arm} | {len(results)} | {interval} | {', '.join(f'{a:.3f}' for a in afters)} | {delta} | "
            f"{statistics.mean(r['added'] for r in results):.1f} | "
            f"{statistics.mean(r['feedback_share'] for r in results):.2%} | "
            f"{signals['forgetting']} / {signals['boundary']} / {signals['rare']} | {PAPER_BFCL.get(arm, '-')} |")
    before = rows[next(iter(rows))][0]["before"]
    training = [r["seconds"] for arm, results in rows.items() if arm != "zero-shot" for r in results]
    zero_seconds = sum(r["seconds"] for r in rows.get("zero-shot", []))
    run_minutes = (sum(training) + zero_seconds) / 60
    per_run = statistics.mean(training) if training else float("nan")
    fired = {kind: sum(r["signals"][kind] for r in rows.get("coevolve", [])) for kind in ("forgetting", "boundary",
                                                                                          "rare")}
    silent = [kind for kind, count in fired.items() if f"coevolve w/o {kind}" in rows and count == 0]
    if silent and "coevolve" in rows:
        # Same seed, same settings, and the dropped signal never fired: the ablation cannot differ from coevolve.
        table += ["", f"The coevolve runs never raised {' or '.join(silent)} signals, so coevolve without "
                  f"{'/'.join(silent)} ran the same loop (same seeds: same results); these rows test nothing at "
                  "this budget."]
    text = "\n".join(table)
    print(text)
    if args.no_write:
        return
    import yaml

    quickstart = yaml.safe_load(CONFIG.read_text())
    prompt = (f"{quickstart['model']['demos']} worked examples ({quickstart['model'].get('demo_choice', 'first-tool')}), "
              f"reward {quickstart['grpo'].get('reward', 'env')}")
    extra = (f" --arms {' '.join(repr(arm) if ' ' in arm else arm for arm in args.arms)}"
             if args.arms != list(ARMS) else "") + (f" --section {args.section}" if args.section != "replicate" else "")
    write_section(args.section, f"""
## Replication of the paper's ablation at small scale, {args.steps} GRPO steps (`bench/replicate.py`)

Question: does the paper's ordering (zero-shot < static GRPO < + synthetic < + random exploration < + feedback,
forgetting the most valuable signal) hold for SmolLM2-135M on BFCL-lite at equal rollout budget? Baseline:
the static arm, same seed (paired).

Command: `python bench/replicate.py --seeds {' '.join(map(str, args.seeds))} --steps {args.steps}
--steps-per-iteration {args.steps_per_iteration} --heldout {args.heldout}{extra}`. Machine: {machine_line()}. Config:
`configs/quickstart.yaml` ({prompt}) with `run.max_steps={args.steps}`, `loop.steps_per_iteration={args.steps_per_iteration}`,
`loop.eval_limit={args.heldout}` and the arm's overrides (bench/replicate.py `ARMS`). Held-out success before
training: {before:.3f} (greedy, the same in every run). Wall time of this invocation: {total_minutes:.0f} minutes
(finished runs are read back, not rerun). The runs in the table took {run_minutes:.0f} minutes in all ({per_run:.0f} s per
training run on average; the zero-shot evaluation {zero_seconds:.0f} s).{f' Runs not yet done: {skipped} (stopped by --max-minutes; rerun the command to continue).' if skipped else ''}

{text}

The paper's rows are cumulative (+ synthetic data, + random exploration, + feedback) on Qwen3-4B after full
training; its signal ablation is on the AppWorld/BFCL average (49.36 -> 45.18 w/o forgetting, 47.17 w/o
boundary, 47.21 w/o rare). Intervals over 3 seeds use t = 4.30: an ordering is only shown where intervals
separate.
""")


if __name__ == "__main__":
    main()
