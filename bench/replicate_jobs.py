"""Two runs at a time on one thread each vs one run at a time on every core: which finishes a replication sooner?

Question: bench/replicate.py runs many small training runs (SmolLM2-135M, batches of 16 short sequences). On a
2-core machine, is it faster to run them one after another, each with torch's default threads (all cores), or two
at a time with one thread each (`--jobs 2`)? Small matrix products scale poorly over threads, so the second
should win; by how much?

Method: the same run (configs/lite-shift.yaml, mode static, seed 0, `--steps` GRPO steps, the held-out evaluation
before training off, the one after training on) three times in fresh directories: once alone with
OMP_NUM_THREADS = cores (the baseline), then twice at the same time with OMP_NUM_THREADS = 1 each. Reported: wall
seconds, and the ratio runs per hour (two at a time) / runs per hour (one at a time). Both runs of the pair and
the single run must end with the same held-out success (same seed, same config: threads change no result beyond
floating-point summation order, which is checked here rather than assumed).

Usage: `python bench/replicate_jobs.py [--steps 4] [--no-write]`; writes the `replicate_jobs` section of
BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import machine_line, write_section  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "lite-shift.yaml"


def start(folder: Path, steps: int, threads: int) -> subprocess.Popen:
    command = [str(REPO / ".venv" / "bin" / "coevolve"), "train", "--config", str(CONFIG), "--output-dir",
               str(folder), "run.mode=static", "run.seed=0", f"run.max_steps={steps}",
               f"loop.steps_per_iteration={steps}", "loop.eval_before_training=false"]
    environment = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=environment)


def finish(process: subprocess.Popen, folder: Path) -> float:
    _, errors = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"{folder} failed:\n{errors[-2000:]}")
    return json.loads((folder / "summary.json").read_text())["heldout_after"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        started = time.perf_counter()
        alone = finish(start(root / "alone", args.steps, cores), root / "alone")
        alone_seconds = time.perf_counter() - started
        started = time.perf_counter()
        pair = [start(root / f"pair{index}", args.steps, 1) for index in range(2)]
        pair_results = [finish(process, root / f"pair{index}") for index, process in enumerate(pair)]
        pair_seconds = time.perf_counter() - started
    ratio = (2 / pair_seconds) / (1 / alone_seconds)
    same = all(result == alone for result in pair_results)
    table = ("| how | runs | wall seconds | runs per hour | held-out success after |\n|---|---|---|---|---|\n"
             f"| one at a time, {cores} threads (baseline) | 1 | {alone_seconds:.0f} | {3600 / alone_seconds:.1f} | "
             f"{alone:.3f} |\n| two at a time, 1 thread each | 2 | {pair_seconds:.0f} | {7200 / pair_seconds:.1f} | "
             f"{', '.join(f'{r:.3f}' for r in pair_results)} |")
    print(table)
    print(f"ratio (two at a time / one at a time, runs per hour): {ratio:.2f}x; same results: {same}")
    if args.no_write:
        return
    write_section("replicate_jobs", f"""
## Replication runs: two at a time on one thread each vs one at a time on all cores (`bench/replicate_jobs.py`)

Question: how should bench/replicate.py use a 2-core machine: one run after another (torch on both cores) or two
at a time with one thread each (`--jobs 2`)? Command: `python bench/replicate_jobs.py --steps {args.steps}`.
Machine: {machine_line()}. The run: configs/lite-shift.yaml, mode static, seed 0, {args.steps} GRPO steps, one
held-out evaluation (142 tasks) after training.

{table}

Two at a time gives **{ratio:.2f}x** the runs per hour of one at a time; the held-out results are
{'identical' if same else 'NOT identical (thread count changed the floating-point summation order enough to change a sampled token)'}.
""")


if __name__ == "__main__":
    main()
