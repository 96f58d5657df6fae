"""Checkpoints written in the background (`run.async_save: true`) against transformers' own save, same run config.

Question: the quickstart spends 3.5-12 s an iteration writing its checkpoint while training waits, and the next
iteration's `train()` call reads it back (BENCHMARKS.md "Where a GRPO step's seconds go"). With the write moved to a
background thread from a copy in memory, overlapping the next iteration's GRPO steps, and that call resuming from the
checkpoint in flight (`coevolve/train/checkpoints.py`), how much of a run's wall time comes back, and is everything
else unchanged?

Method: `coevolve train --config configs/quickstart.yaml` (or `--config`), after setup, once with
`run.async_save=false` (the baseline) and once with `=true`, in this order and then, with `--rounds 2`, in the
reverse order, each in a fresh directory. Reported per run: wall seconds, the step clock's `save` part (with the
lever: the copy taken in the training thread; the write itself runs beside the phases after it) and `resume` part
(a `train()` call's start: reading the previous call's checkpoint back), the train phase,
held-out success before and after. Both must train the same thing: the final weights of every run are compared
tensor by tensor, and the held-out figures must match. The ratio is baseline wall / lever wall, over the mean of
the rounds. Before each run the script measures for 3 s how busy the CPUs are with it idle: figures taken while
other work held the cores are flagged.

Usage: `python bench/async_save.py [--config configs/quickstart.yaml] [--rounds 1] [--no-write]`; writes the
`async_save` section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import machine_line, write_section  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def busy_before() -> float:
    """The share of the CPUs in use during 3 s before a run, this script idle: other work on the machine (the load
    average would count the previous run's own tail)."""
    import psutil

    return psutil.cpu_percent(interval=3.0) / 100.0


def one_run(config: Path, folder: Path, lever: bool) -> dict:
    load = busy_before()
    started = time.perf_counter()
    done = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-m", "coevolve.cli", "train", "--config",
                           str(config), "--output-dir", str(folder), f"run.async_save={str(lever).lower()}"],
                          cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{folder} failed:\n{done.stderr[-3000:]}")
    lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    save = sum((line.get("train_seconds") or {}).get("save", 0.0) for line in lines)
    resume = sum((line.get("train_seconds") or {}).get("resume", 0.0) for line in lines)
    train = sum(line["seconds"].get("train", 0.0) for line in lines)
    summary = json.loads((folder / "summary.json").read_text())
    return {"lever": lever, "wall": wall, "save": save, "resume": resume, "train": train, "load_before": load,
            "heldout": (summary.get("heldout_before"), summary.get("heldout_after")), "folder": folder}


def same_weights(left: Path, right: Path) -> bool:
    import torch
    from safetensors.torch import load_file

    a, b = load_file(str(left / "final" / "model.safetensors")), load_file(str(right / "final" / "model.safetensors"))
    return a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/quickstart.yaml")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    config = (REPO / args.config).resolve()
    with tempfile.TemporaryDirectory() as scratch:
        runs = []
        for round_index in range(args.rounds):
            order = (False, True) if round_index % 2 == 0 else (True, False)
            for lever in order:
                runs.append(one_run(config, Path(scratch) / f"round{round_index}-{'on' if lever else 'off'}", lever))
        same = all(same_weights(runs[0]["folder"], other["folder"]) for other in runs[1:])
    heldout_same = len({run["heldout"] for run in runs}) == 1
    rows = ["| run | run.async_save | CPUs busy before | wall s | save part s | resume part s | train phase s | "
            "held-out before -> after |", "|---|---|---:|---:|---:|---:|---:|---|"]
    for index, run in enumerate(runs, 1):
        before, after = run["heldout"]
        rows.append(f"| {index} | {str(run['lever']).lower()} | {run['load_before']:.0%} | {run['wall']:.0f} | "
                    f"{run['save']:.1f} | {run['resume']:.1f} | {run['train']:.1f} | {before:.3f} -> {after:.3f} |")
    baseline = statistics.mean(run["wall"] for run in runs if not run["lever"])
    lever = statistics.mean(run["wall"] for run in runs if run["lever"])
    busy = [run for run in runs if run["load_before"] > 0.25]
    table = "\n".join(rows)
    verdict = (f"Baseline / lever wall seconds: **{baseline / lever:.2f}x** ({baseline:.0f} s -> {lever:.0f} s, mean of "
               f"{args.rounds} round{'s' if args.rounds > 1 else ''}). Final weights identical in every run: {same}; "
               f"held-out figures identical: {heldout_same}."
               + (f" {len(busy)} run(s) started with the CPUs over 25% busy: other work held the cores, the "
                  "figures are not clean." if busy else ""))
    print(table)
    print(verdict)
    if args.no_write:
        return
    write_section("async_save", f"""
## Checkpoints written in the background vs transformers' save (`bench/async_save.py`)

Question: how much of a run's wall time does writing checkpoints from a copy, in a background thread that overlaps
the next iteration's GRPO steps (`run.async_save: true`, `coevolve/train/checkpoints.py`), give back, with
everything else unchanged? Command:
`python bench/async_save.py --config {args.config} --rounds {args.rounds}`. Machine: {machine_line()}. One
`coevolve train` per row, after setup; `save part` and `resume part` are the step clock's (with the lever: the copy
taken in the training thread, and a resume that reads only the small files of the checkpoint in flight).

{table}

{verdict}
""")


if __name__ == "__main__":
    main()
