"""The quickstart in float32 and in bfloat16 (with fp32 master weights), seed by seed, against the code of a
baseline commit.

Question: does running configs/quickstart.yaml with the model in bfloat16 (`model.dtype=bfloat16
grpo.master_weights=true`: sampling, the loss and the reference model all compute in bf16; the optimizer updates
fp32 copies, `coevolve.master_weights`) keep its held-out results within the spread of the seeds, and how much
faster is it? And how fast is today's code against the code of `--baseline` (the commit before this round's
speed work), on the same machine, in the same run of this script?

Method: for each seed, `coevolve train --config configs/quickstart.yaml run.seed=S` once per dtype, the dtypes
alternating so that a drift of the machine's speed hits both; then (unless `--no-baseline`) seed 0 in float32
with the baseline commit's code (a `git worktree` of it, run with this venv). Each run's figures come from its
own metrics.jsonl and summary.json: held-out success before and after (40 BFCL-lite test tasks, greedy), train
success per iteration, wall seconds of the whole command, and seconds per phase.
"Within the spread" is read as: bf16's mean held-out after lies within [min, max] of fp32's seeds (3 seeds are
too few for an interval), and its before-training figure (the untrained model) is compared task count by task
count.

Usage: `python bench/quickstart_precision.py [--seeds 0 1 2] [--baseline 131126a | --no-baseline] [--no-write]`;
writes the `quickstart_precision` section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import machine_line, write_section  # noqa: E402
from bench.quickstart import REPO, run_seed  # noqa: E402

PRECISIONS = {"bfloat16": ("model.dtype=bfloat16", "grpo.master_weights=true"),
              "float32": ("model.dtype=float32", "grpo.master_weights=false")}


def phase_seconds(directory: Path) -> dict:
    from coevolve.jsonl import read_jsonl

    totals: dict = {}
    for line in read_jsonl(directory / "metrics.jsonl"):
        for phase, seconds in line["seconds"].items():
            totals[phase] = totals.get(phase, 0.0) + seconds
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--baseline", default="131126a", help="commit whose code is timed on seed 0 in float32")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--out", default=str(REPO / "runs" / "bench-quickstart-precision"))
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    rows = []
    for seed in args.seeds:
        for name, extra in PRECISIONS.items():
            directory = out / f"{name}-seed-{seed}"
            row = {"precision": name, "code": "this commit", **run_seed(seed, directory, extra),
                   "phases": phase_seconds(directory)}
            rows.append(row)
            print(f"{name} seed {seed}: {row['seconds']:.0f} s, held-out {row['before']:.3f} -> {row['after']:.3f}",
                  flush=True)
    if not args.no_baseline:
        worktree = Path(tempfile.mkdtemp(prefix="baseline-")) / "code"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(worktree), args.baseline], cwd=REPO, check=True)
        try:
            directory = out / "baseline-float32-seed-0"
            # The baseline's config as it was (float32; its configs know no master_weights key).
            row = {"precision": "float32", "code": f"baseline {args.baseline}",
                   **run_seed(args.seeds[0], directory, (), source=worktree), "phases": phase_seconds(directory)}
            rows.append(row)
            print(f"baseline seed {args.seeds[0]}: {row['seconds']:.0f} s, held-out {row['before']:.3f} -> "
                  f"{row['after']:.3f}", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=REPO)

    table = ["| code | precision | seed | wall s | train s | eval s | held-out before | held-out after | "
             "train success per iteration |", "|---|---|---|---:|---:|---:|---:|---:|---|"]
    for row in rows:
        phases = row["phases"]
        table.append(f"| {row['code']} | {row['precision']} | {row['seed']} | {row['seconds']:.0f} | "
                     f"{phases.get('train', 0):.0f} | {phases.get('eval', 0):.0f} | {row['before']:.3f} | "
                     f"{row['after']:.3f} | {', '.join(f'{s:.2f}' for s in row['train_success'])} |")
    ours = {name: [r for r in rows if r["precision"] == name and r["code"] == "this commit"] for name in PRECISIONS}
    mean = {name: {key: sum(r[key] for r in found) / len(found) for key in ("seconds", "before", "after")}
            for name, found in ours.items()}
    fp32_after = [r["after"] for r in ours["float32"]]
    holds = min(fp32_after) <= mean["bfloat16"]["after"] <= max(fp32_after)
    lines = [
        f"- Mean over seeds {args.seeds}: float32 {mean['float32']['seconds']:.0f} s, held-out "
        f"{mean['float32']['before']:.3f} -> {mean['float32']['after']:.3f}; bfloat16 "
        f"{mean['bfloat16']['seconds']:.0f} s, held-out {mean['bfloat16']['before']:.3f} -> "
        f"{mean['bfloat16']['after']:.3f}.",
        f"- float32 / bfloat16 wall seconds: **{mean['float32']['seconds'] / mean['bfloat16']['seconds']:.2f}x**.",
        f"- bfloat16's mean held-out after training is **{'within' if holds else 'outside'}** float32's seeds' range "
        f"[{min(fp32_after):.3f}, {max(fp32_after):.3f}].",
    ]
    baseline = [r for r in rows if r["code"] != "this commit"]
    if baseline:
        base = baseline[0]
        same_seed = {r["precision"]: r for r in rows if r["code"] == "this commit" and r["seed"] == base["seed"]}
        lines.append(f"- Seed {base['seed']}, baseline code ({args.baseline}, float32) {base['seconds']:.0f} s, "
                     f"held-out {base['before']:.3f} -> {base['after']:.3f}; this commit: float32 "
                     f"{same_seed['float32']['seconds']:.0f} s (**{base['seconds'] / same_seed['float32']['seconds']:.2f}x**"
                     f"), bfloat16 {same_seed['bfloat16']['seconds']:.0f} s "
                     f"(**{base['seconds'] / same_seed['bfloat16']['seconds']:.2f}x**).")
    body = "\n".join(table + [""] + lines)
    print(body)
    markdown = f"""## Quickstart in float32 and bfloat16 (`bench/quickstart_precision.py`)

Question: does the quickstart keep its held-out results with the model in bfloat16 (fp32 master weights in the
optimizer), and how much faster is it, here and against the code of {args.baseline}?

Command: `python bench/quickstart_precision.py --seeds {' '.join(map(str, args.seeds))}` ({machine_line()}).
Each row is one `coevolve train --config configs/quickstart.yaml` run after setup (venv present); wall seconds of
the whole command (model load, both held-out evaluations, 16 GRPO steps, synthesis, the report); `train s` and
`eval s` are the runs' own phase seconds (metrics.jsonl). Held-out: 40 BFCL-lite test tasks, greedy; one task
is 0.025.

{body}
"""
    if not args.no_write:
        write_section("quickstart_precision", markdown)


if __name__ == "__main__":
    main()
