"""Feedback phase cost: signal extraction and the pool's history update for 10k, 100k and 1M rollouts.

Question: does mining the three signals (coevolve/signals.py) and updating the per-task success history in the
pool (coevolve/pool.py) stay O(n) in the number of rollouts, and does `extract_signals` — the plain definitions:
group by task, `forgetting` / `boundary` / `rare_patterns` — take under 1 s for 100,000 trajectories? (That was
the bar for dropping the C-level columnar fast path it replaced, which took a quarter to a third of the time.)

Rollouts are synthetic `Trajectory`s shaped like GRPO rollouts of a tool-use policy (`generate`): K = 8 rollouts
per task in a row, one task per 8 records; 40 tools with Zipf popularity; each task has a plan of 1-6 calls over
the 16 most popular tools that mostly follows a fixed successor table (`follow`); a rollout is the plan, cut short
(15%), or with one call replaced or inserted by a tool drawn from all 40 (`noise` each), one `Step` per call;
task skill is 0 for 40% of tasks, 1 for 20%, uniform otherwise, and each rollout succeeds with that probability
(binary score, as BFCL's); the W = 3 earlier success rates lie near the skill. With the default θ = 1% this gives
boundary as the most frequent signal, as in the paper (45.5% of signals on BFCL). The `dense` row raises the noise
and plan randomness until ~1.1 signals fire per task, a stress case for the per-event cost.

Timed, separately (median of `--repeats` passes, each in one process with the data built beforehand):
- history read: `TaskPool.histories(before=t, window=W)` for all tasks (the `history` argument of extraction);
- extraction: `extract_signals(trajectories, history, SignalConfig(), t)`: rates, the three detectors, the events;
- history write: `TaskPool.record_success_rates(t, rates)`, one transaction (WAL, synchronous=FULL).
Baseline, in the same process: a fixed pure-Python loop (1M dict stores), timed right before each pass. This VM's
speed drifts by tens of percent between runs and other processes share its 2 cores, so the section reports each
stage as a ratio to that loop (median over passes of the per-pass ratio), next to the seconds.
Usage: `python bench/signals.py [--no-write]`.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import machine_line, write_section  # noqa: E402
from coevolve.pool import TaskPool  # noqa: E402
from coevolve.records import Step, Task, ToolCall, Trajectory  # noqa: E402
from coevolve.signals import SignalConfig, extract_signals  # noqa: E402

GROUP_SIZE = 8
TOOL_COUNT, PLAN_TOOLS = 40, 16
CALM = {"follow": 0.95, "noise": 0.01}
DENSE = {"follow": 0.85, "noise": 0.065}


def generate(
    record_count: int, seed: int, follow: float, noise: float
) -> tuple[list[Task], list[Trajectory], list[float]]:
    """Tasks, their rollouts, and each task's skill (see the module docstring)."""
    rng = random.Random(seed)
    tools = [f"tool_{rank:02d}" for rank in range(TOOL_COUNT)]
    popularity = [1.0 / (rank + 1) ** 1.2 for rank in range(TOOL_COUNT)]
    successors = [(rng.randrange(PLAN_TOOLS), rng.randrange(PLAN_TOOLS)) for _ in range(PLAN_TOOLS)]
    tasks, skills, trajectories = [], [], []
    calls = {name: ToolCall(name) for name in tools}
    for task_index in range(record_count // GROUP_SIZE):
        current = rng.choices(range(PLAN_TOOLS), popularity[:PLAN_TOOLS])[0]
        plan = [current]
        for _ in range(rng.randint(1, 6) - 1):
            if rng.random() < follow:
                current = successors[current][rng.randrange(2)]
            else:
                current = rng.choices(range(PLAN_TOOLS), popularity[:PLAN_TOOLS])[0]
            plan.append(current)
        plan_names = tuple(tools[tool] for tool in plan)
        task = Task.create("bench", f"task_{task_index}", [[{"role": "user", "content": f"Task {task_index}."}]],
                           {}, [[f"{name}()" for name in plan_names]])
        draw = rng.random()
        skill = 0.0 if draw < 0.4 else 1.0 if draw < 0.6 else rng.random()
        tasks.append(task)
        skills.append(skill)
        for sample_index in range(GROUP_SIZE):
            names = plan_names
            draw = rng.random()
            if draw < 0.15 and len(names) > 1:  # cut short
                names = names[:rng.randrange(1, len(names))]
            elif draw < 0.15 + noise:  # one call replaced by any tool
                position = rng.randrange(len(names))
                names = names[:position] + (rng.choices(tools, popularity)[0],) + names[position + 1:]
            elif draw < 0.15 + 2 * noise:  # one call inserted
                position = rng.randrange(len(names) + 1)
                names = names[:position] + (rng.choices(tools, popularity)[0],) + names[position:]
            steps = tuple(Step(0, position, f"{name}()", calls[name], "ok") for position, name in enumerate(names))
            score = 1.0 if rng.random() < skill else 0.0
            trajectories.append(Trajectory(f"{task.id}:{sample_index}", task.id, 0, sample_index, steps, score))
    return tasks, trajectories, skills


def reference_loop_seconds() -> float:
    """The baseline: a fixed pure-Python workload (1M dict stores), this machine's speed at the time of the call."""
    start = time.perf_counter()
    table: dict[int, int] = {}
    for index in range(1_000_000):
        table[index & 1023] = index
    return time.perf_counter() - start


STAGES = ("read", "extract", "write")


def measure(record_count: int, repeats: int, shape: dict[str, float], directory: Path) -> dict[str, float]:
    config = SignalConfig()
    tasks, trajectories, skills = generate(record_count, seed=record_count, **shape)
    rng = random.Random(1)
    with TaskPool(directory / f"pool-{record_count}-{shape['noise']}.sqlite") as pool:
        pool.add_tasks(tasks, 0)
        for earlier in range(config.window):  # iterations 0..W-1: the history the forgetting signal reads
            pool.record_success_rates(earlier, {
                task.id: min(1.0, max(0.0, round((skill + rng.uniform(-0.4, 0.4)) * 8) / 8))
                for task, skill in zip(tasks, skills)
            })
        iteration = config.window
        seconds: dict[str, list[float]] = {stage: [] for stage in STAGES}
        ratios: dict[str, list[float]] = {stage: [] for stage in STAGES}
        for repeat in range(repeats):
            baseline = reference_loop_seconds()
            start = time.perf_counter()
            history = pool.histories(before=iteration, window=config.window)
            seconds["read"].append(time.perf_counter() - start)
            start = time.perf_counter()
            report = extract_signals(trajectories, history, config, iteration)
            seconds["extract"].append(time.perf_counter() - start)
            start = time.perf_counter()
            pool.record_success_rates(iteration + repeat, report.success_rates)  # a new iteration each pass
            seconds["write"].append(time.perf_counter() - start)
            for stage in STAGES:
                ratios[stage].append(seconds[stage][-1] / baseline)
    assert len(report.success_rates) == len(tasks) == record_count // GROUP_SIZE
    return {
        **{stage: statistics.median(seconds[stage]) for stage in STAGES},
        **{f"{stage}_ratio": statistics.median(ratios[stage]) for stage in STAGES},
        "records": record_count, "tasks": len(tasks), "passes": repeats,
        **{kind: report.count(kind) for kind in ("forgetting", "boundary", "rare")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dense-size", type=int, default=100_000, help="records of the dense-signal stress row")
    parser.add_argument("--no-dense", action="store_true", help="skip the dense-signal stress row")
    parser.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    args = parser.parse_args()

    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for size in args.sizes:
            # small sizes take milliseconds, so a moment of host noise can spoil every pass: take more of them
            repeats = args.repeats * max(1, 100_000 // size)
            rows.append(("calm", measure(size, repeats, CALM, Path(scratch))))
            print(f"{size:>9,} records done", file=sys.stderr)
        if not args.no_dense:
            rows.append(("dense", measure(args.dense_size, args.repeats, DENSE, Path(scratch))))
    load_after = os.getloadavg()

    def per_record(row: dict[str, float], key: str) -> float:
        return row[key] / row["records"] * 1e6

    lines = [
        "| signals | records | tasks | passes | forgetting / boundary / rare events | history read x baseline "
        "| extraction x baseline | history write x baseline | extraction s | extraction µs/record |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for shape, row in rows:
        lines.append(
            f"| {shape} | {row['records']:,} | {row['tasks']:,} | {row['passes']} | {row['forgetting']:,} / "
            f"{row['boundary']:,} / {row['rare']:,} | {row['read_ratio']:.2f} | {row['extract_ratio']:.2f} "
            f"| {row['write_ratio']:.2f} | {row['extract']:.3f} | {per_record(row, 'extract'):.2f} |"
        )
    calm = [row for shape, row in rows if shape == "calm"]
    smallest, largest = calm[0], calm[-1]
    flatness = (
        f"Per-record cost (ratio to the baseline), {largest['records']:,} vs {smallest['records']:,} records: "
        + ", ".join(
            f"{name} {per_record(largest, stage + '_ratio') / per_record(smallest, stage + '_ratio'):.2f}x"
            for name, stage in (("extraction", "extract"), ("history write", "write"), ("history read", "read"))
        )
        + " (1.00x = perfectly flat)."
    )
    at_100k = [row for shape, row in rows if shape == "calm" and row["records"] == 100_000]
    target = (
        f"Extraction of 100,000 trajectories: {at_100k[0]['extract']:.3f} s, {at_100k[0]['extract_ratio']:.2f}x "
        "the baseline (the bar for the plain code: under 1 s on this VM)." if at_100k else ""
    )
    markdown = "\n".join([
        "## Feedback signals and the pool's history update (`python bench/signals.py`)",
        "",
        f"Machine: {machine_line()}; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after the run. "
        "Baseline, same process: a fixed pure-Python loop (1M dict stores) timed right before each pass; the table "
        "gives each stage as a multiple of it (median over the passes of the per-pass ratio), as this VM's speed "
        f"drifts by tens of percent between runs; seconds are medians. Passes: {args.repeats}, or {args.repeats} x "
        f"100,000 / records below 100k records; K = {GROUP_SIZE}, W = 3, θ = 1%, unigrams and bigrams.",
        "`calm`: synthetic rollouts whose signal mix resembles the paper's (boundary the most frequent); `dense`: "
        "noisier rollouts, about 1.1 signals per task, a stress case for the per-event cost (generator: docstring "
        "of bench/signals.py). Extraction = `extract_signals` over `Trajectory`s (grouping, rates, the three "
        "detectors, the `SignalEvent`s); history read / write = `TaskPool.histories` / `record_success_rates` on a "
        "pool holding all the tasks.",
        "",
        *lines,
        "",
        flatness,
        *([target] if target else []),
    ])
    print(markdown)
    if not args.no_write:
        write_section("signals", markdown)


if __name__ == "__main__":
    main()
