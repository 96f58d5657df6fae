"""Where a GRPO step's seconds go, and the wall time of the shipped CPU configs, against a baseline commit's code.

Question: of a CoEvolve run on this 2-core machine, how many seconds go to rollouts, the loss's forward and
backward, the optimizer, logging, checkpoint save and reload per iteration, and held-out evaluation? And how long
do `configs/quickstart.yaml` (16 steps) and `configs/lite-tools.yaml` (12 steps) take with this commit's code and
with `--baseline`'s (the code before this round's speed work), run one after the other in this script?

Method: one `coevolve train --config C` per config and code, after setup (venv present), float32 as shipped;
the baseline's code runs from a `git worktree` of that commit with this venv. Per part, the run's own clock
(`coevolve.train.calls.StepClock`, metrics.jsonl `train_seconds`, summed over iterations) and its phase seconds
(`seconds`: eval, signals, synthesis); `other` is the command's wall time minus all of them (imports, model and
trainer set-up, the final save and the report). The baseline has no step clock: only its wall and phase
seconds are shown. Held-out before and after are the runs' own (a speed-up that changed them would show here).

Usage: `python bench/step_time.py [--configs quickstart lite-tools] [--baseline 131126a | --no-baseline]
[--no-write]`; writes the `step_time` section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import machine_line, write_section  # noqa: E402
from bench.quickstart import REPO  # noqa: E402

PARTS = ("rollout", "loss", "optimizer", "logging", "save", "resume")


def run_config(name: str, directory: Path, source: Path) -> dict:
    import time

    from coevolve.jsonl import read_jsonl

    started = time.perf_counter()
    env = None
    if source != REPO:
        import os

        env = {**os.environ, "PYTHONPATH": str(source)}
    done = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-m", "coevolve.cli", "train", "--config",
                           str(source / "configs" / f"{name}.yaml"), "--output-dir", str(directory)],
                          cwd=source, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    metrics = read_jsonl(directory / "metrics.jsonl")
    parts = dict.fromkeys(PARTS, 0.0)
    phases: dict = {}
    for line in metrics:
        for part, seconds in (line.get("train_seconds") or {}).items():
            parts[part] = parts.get(part, 0.0) + seconds
        for phase, seconds in line["seconds"].items():
            phases[phase] = phases.get(phase, 0.0) + seconds
    steps = json.loads((directory / "summary.json").read_text())["steps"]
    evaluated = [m for m in metrics if m["heldout_success"] is not None]
    return {"config": name, "wall": wall, "parts": parts, "phases": phases, "steps": steps,
            "iterations": len(metrics) - 1, "evals": len(evaluated),
            "before": metrics[0]["heldout_success"], "after": evaluated[-1]["heldout_success"],
            "clocked": any(line.get("train_seconds") for line in metrics)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", nargs="+", default=["quickstart", "lite-tools"])
    parser.add_argument("--baseline", default="131126a")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--out", default=str(REPO / "runs" / "bench-step-time"))
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    worktree = None
    if not args.no_baseline:
        worktree = Path(tempfile.mkdtemp(prefix="baseline-")) / "code"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(worktree), args.baseline], cwd=REPO, check=True)
    results = []
    try:
        for name in args.configs:
            for label, source in [("this commit", REPO)] + ([(f"baseline {args.baseline}", worktree)] if worktree else []):
                result = {"code": label, **run_config(name, out / f"{name}-{label.split()[0]}", source)}
                results.append(result)
                print(f"{name} ({label}): {result['wall']:.0f} s, held-out {result['before']} -> {result['after']}",
                      flush=True)
    finally:
        if worktree is not None:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=REPO)

    header = ("| config | code | wall s | steps | " + " | ".join(f"{p} s" for p in PARTS)
              + " | held-out eval s | signals + synthesis s | other s | held-out before -> after |")
    table = [header, "|---|---|" + "---:|" * (len(PARTS) + 6) + "---|"]
    for r in results:
        clocked = sum(r["parts"].values())
        phases = r["phases"]
        feedback = phases.get("signals", 0.0) + phases.get("synthesis", 0.0)
        # Without a step clock (the baseline) the train phase is shown whole, in the rollout column's place.
        cells = ([f"{r['parts'][p]:.1f}" for p in PARTS] if r["clocked"]
                 else [f"train {phases.get('train', 0.0):.1f}"] + ["-"] * (len(PARTS) - 1))
        other = r["wall"] - (phases.get("train", 0.0) if not r["clocked"] else clocked) - phases.get("eval", 0.0) - feedback
        table.append(f"| {r['config']} | {r['code']} | {r['wall']:.0f} | {r['steps']} | " + " | ".join(cells)
                     + f" | {phases.get('eval', 0.0):.1f} | {feedback:.1f} | {other:.1f} | "
                     f"{r['before']:.3f} -> {r['after']:.3f} |")
    lines = []
    for r in results:
        if r["clocked"]:
            per_step = {p: r["parts"][p] / max(1, r["steps"]) for p in ("rollout", "loss", "optimizer", "logging")}
            lines.append(f"- {r['config']} ({r['code']}): per step {', '.join(f'{p} {s:.2f} s' for p, s in per_step.items())}; "
                         f"per iteration save {r['parts']['save'] / max(1, r['iterations']):.2f} s and resume "
                         f"{r['parts']['resume'] / max(1, r['iterations']):.2f} s; per held-out pass "
                         f"{r['phases'].get('eval', 0.0) / max(1, r['evals']):.1f} s.")
    for name in args.configs:
        ours = next(r for r in results if r["config"] == name and r["code"] == "this commit")
        base = next((r for r in results if r["config"] == name and r["code"] != "this commit"), None)
        if base:
            lines.append(f"- {name}: baseline / this commit wall seconds **{base['wall'] / ours['wall']:.2f}x** "
                         f"({base['wall']:.0f} s -> {ours['wall']:.0f} s).")
    body = "\n".join(table + [""] + lines)
    baseline_flag = "--no-baseline" if args.no_baseline else f"--baseline {args.baseline}"
    print(body)
    markdown = f"""## Where a GRPO step's seconds go (`bench/step_time.py`)

Question: of a run of the shipped CPU configs, what do rollouts, the loss's forward and backward, the optimizer,
logging, checkpoint save and reload, and held-out evaluation cost; and the wall time against the code of
{args.baseline} in the same run of this script?

Command: `python bench/step_time.py --configs {' '.join(args.configs)} {baseline_flag}` ({machine_line()}). One `coevolve train
--config configs/NAME.yaml` per row, after setup, float32 as shipped. Parts from the run's step clock
(`coevolve.train.calls`): `loss` = TRL's log-probability passes, advantages, the loss's forward and backward;
`resume` = the start of each iteration's `train()` call up to its first step (the checkpoint's optimizer,
scheduler and RNG read back; the weights are no longer read back when the process holds them); `other` = wall
minus everything clocked (imports, model and trainer set-up, the final save, the report).

{body}
"""
    if not args.no_write:
        write_section("step_time", markdown)


if __name__ == "__main__":
    main()
