"""The replication on CPU: does signal-guided co-evolution beat plain GRPO where D_0 misses part of what is asked?

Question: at equal rollout budget, is held-out success after CoEvolve higher than after GRPO on the static D_0,
and by how much (paired by seed, with a 95% interval)? Above all on the part of the held-out set that D_0 does
not cover, and does each signal (forgetting, boundary, rare) carry its weight?

Settings (each a config; held-out success is also reported on the setting's shifted part and on the rest apart):
- `shift` (configs/lite-shift.yaml): D_0 holds only one-call tasks (and so do the worked examples drawn from it);
  the 142 held-out BFCL-lite tasks mix 90 one-call and 52 two-call ones, the shifted part (`cd` into a folder,
  then act there).
- `iid`: the same config with the train split's two-call tasks kept (`env.options` without `train_max_calls`):
  D_0 and held-out drawn from one generator; parts as in `shift`.
- `tools` (configs/lite-tools.yaml): one-call tasks only; D_0 never calls `cat` or `cd` (their schemas stay in the
  prompt); the shifted part is the 44 of 130 held-out tasks that call one of them. Half of each iteration's sample
  (after the recurring tasks) comes from synthesized tasks once there are any (`loop.synthetic_fraction: 0.5`;
  static has none). Added after the first two showed that the learner never solves a two-call task: here the
  missing part is within its reach.

Arms (overrides of the setting's config): zero-shot (evaluation only: greedy, so one run stands for every
seed; it is also the "before training" figure of its setting, which the training arms therefore skip), static,
random (exploration from random tasks, as many contexts as the signals would have given), coevolve, coevolve
without each signal. Every training arm gets the same model rollouts: `run.max_steps` GRPO steps of
`grpo.prompts_per_step` tasks x K (synthesis runs the env, not the model: the offline explorer). Both configs use
`loop.recur_fraction` (a quarter of each iteration's tasks were solved recently, so forgetting has a history) and
θ `auto` (rare = fewer than 3 occurrences in the iteration), so all three signals fire by design.

Statistics: per arm, the mean over seeds of held-out success after training +- t(0.975, n-1) x sd / sqrt(n);
`delta vs static` is the mean over seeds of the paired difference (same seed, same held-out tasks) with the same
t interval over the differences. The zero-shot row's interval is Wilson's over its tasks.

Resumable and run in chunks: each run has its own directory under `--out`/SETTING; a finished run (summary.json
present) is read, not rerun; an interrupted one continues with `--resume`. Runs go in priority order (`plan`):
shift static+coevolve seed by seed, then shift random, the shift ablations, then the same for iid, so a stopped
invocation leaves the most important paired comparisons complete. `--max-minutes M` starts no run after M
minutes; `--jobs J` runs J at a time, each with cores/J torch threads. Usage:
`python bench/replicate.py [--settings shift iid] [--seeds 0 1 2 3 4] [--ablation-seeds 0 1 2] [--jobs 2]
[--max-minutes M] [--no-write]`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import machine_line, write_section  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "lite-shift.yaml"
TOOLS_CONFIG = REPO / "configs" / "lite-tools.yaml"
LEFT_OUT_TOOLS = ("cat", "cd")
"""The tools D_0 of the `tools` setting never calls (configs/lite-tools.yaml, `env.options.train_without_tools`)."""


@dataclass(frozen=True)
class Setting:
    """A config and its overrides, and how its held-out tasks split into the shifted part and the rest."""

    config: Path
    overrides: tuple[str, ...]
    parts: tuple[str, str]
    """Labels of (the rest, the shifted part)."""
    shifted: Callable[[int, Sequence[str]], bool]
    """(ground-truth calls, ground-truth tools) -> whether a task is in the shifted part."""

    def part_of(self, calls: int, tools: Sequence[str]) -> str:
        return self.parts[1] if self.shifted(calls, tools) else self.parts[0]


def _two_calls(calls: int, tools: Sequence[str]) -> bool:
    return calls >= 2


def _left_out_tool(calls: int, tools: Sequence[str]) -> bool:
    return bool(set(tools) & set(LEFT_OUT_TOOLS))


SETTINGS = {
    "shift": Setting(CONFIG, (), ("1-call", "2-call"), _two_calls),
    "iid": Setting(CONFIG, ("env.options={num_tasks: 560, two_call_share: 0.4}",), ("1-call", "2-call"), _two_calls),
    "tools": Setting(TOOLS_CONFIG, (), ("seen tools", "cat or cd"), _left_out_tool),
}
SIGNALS = ("forgetting", "boundary", "rare")
ARMS = {
    "zero-shot": ["run.mode=zero-shot"],
    "static": ["run.mode=static"],
    "synthetic": ["run.mode=synthetic"],
    "random": ["run.mode=random"],
    "coevolve": ["run.mode=coevolve"],
    "coevolve w/o forgetting": ["run.mode=coevolve", "signals.enabled=[boundary,rare]"],
    "coevolve w/o boundary": ["run.mode=coevolve", "signals.enabled=[forgetting,rare]"],
    "coevolve w/o rare": ["run.mode=coevolve", "signals.enabled=[forgetting,boundary]"],
    # A diagnosis arm, not in the default list: the offline explorer less tied to the flagged tool and two episodes
    # per context, to see whether more varied exploration yields the `cd > action` tasks the shift asks for.
    "coevolve wide": ["run.mode=coevolve", "synthesis.focus_weight=0.3", "synthesis.episodes_per_context=2"],
}
DIAGNOSIS_SETTINGS = {"coevolve wide": ("shift",)}
"""Settings a diagnosis arm runs in (it answers a question about that setting); other arms run in every setting."""
MAIN_ARMS = ("static", "coevolve", "random")
ABLATIONS = ("coevolve w/o forgetting", "coevolve w/o boundary", "coevolve w/o rare")
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def slug(arm: str) -> str:
    return arm.replace(" ", "-").replace("/", "")


@dataclass(frozen=True)
class Planned:
    """One run of the replication: a setting, an arm, a seed."""

    setting: str
    arm: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.setting}/{slug(self.arm)}-seed{self.seed}"

    def overrides(self) -> list[str]:
        extra = [] if self.arm == "zero-shot" else ["loop.eval_before_training=false"]
        return [*SETTINGS[self.setting].overrides, f"run.seed={self.seed}", *ARMS[self.arm], *extra]


def plan(settings: list[str], arms: list[str], seeds: list[int], ablation_seeds: list[int]) -> list[Planned]:
    """Every run, most important first: per setting, zero-shot; static and coevolve seed by seed (the headline
    paired comparison); random; the ablations; anything else asked for."""
    runs: list[Planned] = []
    for setting in settings:
        if "zero-shot" in arms:
            runs.append(Planned(setting, "zero-shot", seeds[0]))
        runs += [Planned(setting, arm, seed) for seed in seeds for arm in ("static", "coevolve") if arm in arms]
        runs += [Planned(setting, "random", seed) for seed in seeds if "random" in arms]
        runs += [Planned(setting, arm, seed) for seed in ablation_seeds for arm in ABLATIONS if arm in arms]
        runs += [Planned(setting, arm, seed) for seed in seeds for arm in arms
                 if arm not in (*MAIN_ARMS, *ABLATIONS, "zero-shot")
                 and setting in DIAGNOSIS_SETTINGS.get(arm, (setting,))]
    return runs


def config_differences(saved: Path, config: Path, overrides: list[str]) -> list[str]:
    """Settings in which a run folder's resolved config differs from what this invocation asks for (an edited
    config, other overrides), so that old runs are never read back as new ones."""
    from coevolve.config import load_config

    def flat(values: dict, prefix: str = "") -> dict:
        items = {}
        for key, value in values.items():
            if isinstance(value, dict) and key != "options":
                items.update(flat(value, f"{prefix}{key}."))
            else:
                items[f"{prefix}{key}"] = value
        return items

    have, want = flat(load_config(saved).to_dict()), flat(load_config(str(config), overrides).to_dict())
    return sorted(key for key in set(have) | set(want) if key != "run.output_dir" and have.get(key) != want.get(key))


def execute(run: Planned, out: Path, threads: int) -> None:
    """Train (or resume) one run in a subprocess, unless it finished; its wall seconds go to bench-seconds.txt."""
    folder = out / run.name
    config = SETTINGS[run.setting].config
    if (folder / "config.yaml").exists():
        changed = config_differences(folder / "config.yaml", config, run.overrides())
        if changed:
            raise SystemExit(f"{folder} was run with other settings ({', '.join(changed)}); delete it or pick "
                             "another --out")
    if not (folder / "summary.json").exists():
        train(run, folder, config, threads)
    # The table needs the run's logs, not its optimizer state (~0.5 GB a run; final/ keeps the trained weights).
    shutil.rmtree(folder / "checkpoints", ignore_errors=True)


def train(run: Planned, folder: Path, config: Path, threads: int) -> None:
    command = [str(REPO / ".venv" / "bin" / "coevolve"), "train", "--config", str(config), "--output-dir",
               str(folder), *run.overrides(), *(["--resume"] if folder.exists() else [])]
    environment = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=environment)
    if done.returncode != 0:
        raise SystemExit(f"{run.name} failed:\n{done.stderr[-3000:]}")
    (folder / "bench-seconds.txt").write_text(f"{time.perf_counter() - started:.1f}\n")


def result_of(run: Planned, out: Path) -> dict:
    """What a finished run says: held-out success after training (all, and on each part of its setting), signals
    fired, the synthesized tasks (and those in the shifted part), time."""
    from coevolve.jsonl import read_jsonl
    from coevolve.pool import TaskPool

    setting = SETTINGS[run.setting]
    folder = out / run.name
    metrics = read_jsonl(folder / "metrics.jsonl")
    summary = json.loads((folder / "summary.json").read_text())
    last = next(m for m in reversed(metrics) if m["heldout_success"] is not None)
    added_shifted = 0
    if (folder / "pool.sqlite").exists():
        with TaskPool(folder / "pool.sqlite") as pool:
            for task in pool.tasks_at(pool.latest_iteration() or 0, source="synthetic"):
                added_shifted += setting.shifted(len(task.truth_tools), task.truth_tools)
    rows = [row for row in read_jsonl(folder / "heldout.jsonl") if row["iteration"] == last["iteration"]] \
        if (folder / "heldout.jsonl").exists() else []
    by_part: dict[str, list[bool]] = {}
    for row in rows:
        by_part.setdefault(setting.part_of(row.get("truth_calls", 1), row.get("truth_tools", ())), []).append(
            bool(row["success"]))
    seconds_file = folder / "bench-seconds.txt"
    return {"setting": run.setting, "heldout_tasks": len(rows), "arm": run.arm, "seed": run.seed,
            "after": last["heldout_success"],
            "after_by_part": {part: sum(values) / len(values) for part, values in by_part.items()},
            "added": summary.get("tasks_added", 0), "added_shifted": added_shifted,
            "feedback_share": summary.get("feedback_share", 0.0),
            "seconds": float(seconds_file.read_text()) if seconds_file.exists() else float("nan"),
            "signals": {kind: sum(m["signals"].get(kind, 0) for m in metrics) for kind in SIGNALS},
            "signals_by_iteration": [[m["signals"].get(kind, 0) for kind in SIGNALS] for m in metrics[1:]]}


def diagnosis(runs: list[Planned], out: Path) -> str:
    """What the synthesized tasks of the coevolve runs look like next to the held-out ones: accepted tasks by tool
    sequence beside the held-out tasks with that sequence, the explored contexts by signal, how the policy did on
    each kind of task it trained on (a group with no success gives GRPO nothing to learn from), and how often a
    rollout whose first call ran cleanly went on to call again (a two-call task needs that)."""
    from collections import Counter

    from coevolve.jsonl import read_jsonl
    from coevolve.pool import TaskPool
    from coevolve.report import tool_sequence

    synthesized: Counter[str] = Counter()
    contexts: Counter[str] = Counter()
    trained: dict[str, list[float]] = {}
    heldout: Counter[str] = Counter()
    clean_first = went_on = 0
    for run in runs:
        folder = out / run.name
        if not (folder / "summary.json").exists():
            continue
        for row in read_jsonl(folder / "synthesis.jsonl"):
            if row.get("accepted"):
                synthesized[tool_sequence(row["solution"])] += 1
        for m in read_jsonl(folder / "metrics.jsonl"):
            contexts.update(m.get("synthesis", {}).get("contexts_by_signal", {}))
        if not heldout:  # the same held-out set in every run of a setting
            rows = read_jsonl(folder / "heldout.jsonl")
            last = max(row["iteration"] for row in rows)
            heldout.update(tool_sequence(row.get("truth_tools", [])) for row in rows if row["iteration"] == last)
        with TaskPool(folder / "pool.sqlite") as pool:
            tasks = {task.id: task for task in pool.tasks_at(pool.latest_iteration() or 0)}
        for row in read_jsonl(folder / "rollouts.jsonl"):
            task = tasks.get(row["task_id"])
            if task is not None:
                tools = task.truth_tools
                part = SETTINGS[run.setting].part_of(len(tools), tools)
                kind = f"{task.provenance.source}, " + (f"{len(tools)}-call" if part.endswith("-call") else part)
                trained.setdefault(kind, []).append(row["score"])
            steps = row.get("steps", [])
            if steps and not steps[0].get("error"):
                clean_first += 1
                went_on += len(steps) > 1
    if not synthesized and not trained:
        return ""
    sequences = sorted(set(synthesized) | set(heldout), key=lambda seq: (-heldout[seq], -synthesized[seq], seq))
    lines = ["| tool sequence | held-out tasks | synthesized and accepted (all coevolve runs) |", "|---|---|---|"]
    lines += [f"| `{seq}` | {heldout[seq]} | {synthesized[seq]} |" for seq in sequences[:16]]
    lines += ["", "Training rollouts of the coevolve runs by task kind: " + "; ".join(
        f"{kind}: {len(scores)} rollouts, success {sum(scores) / len(scores):.3f}"
        for kind, scores in sorted(trained.items())) + ".",
              "Contexts explored, by signal: " + ", ".join(f"{k} {v}" for k, v in sorted(contexts.items())) + ".",
              f"Training rollouts whose first call ran without an error: {clean_first}; of these, {went_on} made "
              "another call."]
    return "\n".join(lines)


def shifted_behaviour(runs: list[Planned], out: Path) -> str:
    """Per arm, on the held-out tasks of the setting's shifted part (after training, mean over seeds): the share
    answered with two or more calls, and the share whose first call is the ground truth's first tool: whether
    training moved the policy towards the shifted skill even where it did not yet solve the task."""
    from coevolve.jsonl import read_jsonl

    shares: dict[str, list[tuple[float, float]]] = {}
    for run in runs:
        path = out / run.name / "heldout.jsonl"
        if run.arm == "zero-shot" or not (out / run.name / "summary.json").exists() or not path.exists():
            continue
        rows = read_jsonl(path)
        last = max(row["iteration"] for row in rows)
        setting = SETTINGS[run.setting]
        multi = [row for row in rows if row["iteration"] == last
                 and setting.shifted(row.get("truth_calls", 1), row.get("truth_tools", ()))]
        if not multi:
            continue
        several = sum(len(row["calls"]) >= 2 for row in multi) / len(multi)
        first = sum(bool(row["calls"]) and row["calls"][0].lstrip("[").split("(", 1)[0] == row["truth_tools"][0]
                    for row in multi) / len(multi)
        shares.setdefault(run.arm, []).append((several, first))
    if not shares:
        return ""
    lines = ["| arm | seeds | answered with >= 2 calls (per seed) | first call = the truth's first tool (per seed) |",
             "|---|---|---|---|"]
    for arm, values in shares.items():
        lines.append(f"| {arm} | {len(values)} | {statistics.mean(v[0] for v in values):.2f} "
                     f"({', '.join(f'{v[0]:.2f}' for v in values)}) | {statistics.mean(v[1] for v in values):.2f} "
                     f"({', '.join(f'{v[1]:.2f}' for v in values)}) |")
    return "\n".join(lines)


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


def _value(result: dict, part: str) -> float | None:
    return result["after"] if part == "all" else result["after_by_part"].get(part)


def _interval(values: list[float]) -> str:
    if not values:
        return "-"
    mean, half = t_interval(values)
    return f"{mean:+.3f} +- {half:.3f}" if len(values) > 1 else f"{mean:+.3f} (one seed)"


def setting_table(rows: dict[str, list[dict]], heldout: int, setting: Setting) -> str:
    """One setting's table: per arm, held-out success after training overall and on each part (the rest, the
    shifted part), each with its paired delta vs static and the 95% interval of that delta."""
    parts = ["all", *setting.parts]
    static = {r["seed"]: r for r in rows.get("static", [])}
    header = ["| arm | runs | " + " | ".join(
        f"{part}: mean +- 95% CI | {part}: delta vs static (paired) +- 95% CI" for part in parts)
        + f" | tasks added ({setting.parts[1]}) | signals fired F / B / R |",
        "|---|---|" + "---|---|" * len(parts) + "---|---|"]
    lines = []
    for arm, results in rows.items():
        cells = []
        for part in parts:
            values = [v for v in (_value(r, part) for r in results) if v is not None]
            if arm == "zero-shot" and values:
                low, high = wilson(values[0] * heldout, heldout) if part == "all" else (float("nan"),) * 2
                cells.append(f"{values[0]:.3f}" + (f" [{low:.3f}, {high:.3f}]" if part == "all" else ""))
            else:
                mean, half = t_interval(values) if values else (float("nan"), float("nan"))
                cells.append(f"{mean:.3f} +- {half:.3f}" if len(values) > 1 else (f"{mean:.3f}" if values else "-"))
            paired = [_value(r, part) - _value(static[r["seed"]], part) for r in results
                      if r["seed"] in static and _value(r, part) is not None
                      and _value(static[r["seed"]], part) is not None]
            cells.append(_interval(paired) if arm not in ("static", "zero-shot") else "-")
        added = statistics.mean(r["added"] for r in results)
        added_shifted = statistics.mean(r["added_shifted"] for r in results)
        fired = " / ".join(str(sum(r["signals"][kind] for r in results)) for kind in SIGNALS)
        lines.append(f"| {arm} | {len(results)} | " + " | ".join(cells)
                     + f" | {added:.1f} ({added_shifted:.1f}) | {fired} |")
    return "\n".join(header + lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--ablation-seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=["zero-shot", *MAIN_ARMS, *ABLATIONS], choices=list(ARMS))
    parser.add_argument("--out", default=str(REPO / "runs" / "replicate"))
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (each gets cores / jobs torch threads)")
    parser.add_argument("--max-minutes", type=float, default=0,
                        help="start no new run after this many minutes (0: no limit); rerun to continue")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    runs = plan(args.settings, args.arms, args.seeds, args.ablation_seeds)
    threads = max(1, (os.cpu_count() or 1) // max(1, args.jobs))

    def attempt(run: Planned) -> dict | None:
        finished = (out / run.name / "summary.json").exists()
        if not finished and args.max_minutes and (time.perf_counter() - started) / 60 > args.max_minutes:
            return None  # left for the next invocation
        execute(run, out, threads)
        result = result_of(run, out)
        print(json.dumps(result), flush=True)
        return result

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:  # threads wait on subprocesses
        done = list(pool.map(attempt, runs))
    finished = [run for run, result in zip(runs, done) if result is not None]
    results = [result for result in done if result is not None]
    pending = len(runs) - len(finished)
    total_minutes = (time.perf_counter() - started) / 60
    sections = []
    for setting in args.settings:
        rows: dict[str, list[dict]] = {}
        for result in results:
            if result["setting"] == setting:
                rows.setdefault(result["arm"], []).append(result)
        if not rows:
            continue
        heldout = max(r["heldout_tasks"] for rs in rows.values() for r in rs)
        seconds = [r["seconds"] for arm, rs in rows.items() if arm != "zero-shot" for r in rs]
        sections.append(f"### Setting `{setting}`\n\n" + setting_table(rows, heldout, SETTINGS[setting]) + (
            f"\n\n{len(seconds)} training runs, {statistics.mean(seconds):.0f} s each on average." if seconds else ""))
        found = diagnosis([run for run in finished if run.setting == setting and run.arm == "coevolve"], out)
        if found:
            sections.append(f"What coevolve synthesized in setting `{setting}`, beside the held-out tasks:\n\n{found}")
        behaviour = shifted_behaviour([run for run in finished if run.setting == setting], out)
        if behaviour:
            sections.append(f"The held-out tasks of setting `{setting}`'s shifted part ({SETTINGS[setting].parts[1]}), "
                            f"how the trained policies answered them:\n\n{behaviour}")
    text = "\n\n".join(sections)
    run_minutes = sum(r["seconds"] for r in results if r["seconds"] == r["seconds"]) / 60  # NaN: no timing file
    default_arms = ["zero-shot", *MAIN_ARMS, *ABLATIONS]
    arms_flag = "" if args.arms == default_arms else " --arms " + " ".join(
        f'"{arm}"' if " " in arm else arm for arm in args.arms)
    print(text)
    if args.no_write:
        return
    write_section("replicate-shift", f"""
## Replication: coevolve vs plain GRPO on a coverage shift (`bench/replicate.py`)

Question: at equal rollout budget, does CoEvolve beat GRPO on the static D_0, above all on held-out tasks D_0
does not cover (setting `shift`: D_0 one-call only, held-out 2-call part; setting `tools`: D_0 never calls `cat`
or `cd`, held-out tasks calling them), and does each signal matter?

Command: `python bench/replicate.py --settings {' '.join(args.settings)} --seeds {' '.join(map(str, args.seeds))}
--ablation-seeds {' '.join(map(str, args.ablation_seeds))} --jobs {args.jobs}{arms_flag}`. Machine: {machine_line()}.
Configs: `configs/lite-shift.yaml` (settings `shift`, `iid`: 142 held-out tasks, 90 one-call, 52 two-call) and
`configs/lite-tools.yaml` (setting `tools`: 130 one-call held-out tasks, 44 calling `cat` or `cd`), both 12 GRPO
steps of 4 tasks x K=4 in 3 iterations with SmolLM2-135M, with each arm's overrides (`ARMS`, `SETTINGS`). The
{len(results)} finished runs took {run_minutes:.0f} minutes of run time ({args.jobs} at a time); this invocation
{total_minutes:.0f} minutes (finished runs are read back, not rerun).{f' Runs not yet done: {pending} (stopped by --max-minutes; rerun the command to continue).' if pending else ''}

{text}
""")


if __name__ == "__main__":
    main()
