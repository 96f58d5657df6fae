"""The replication on CPU: does signal-guided co-evolution beat plain GRPO where D_0 misses part of what is asked?

Question: at equal rollout budget, is held-out success after CoEvolve higher than after GRPO on the static D_0,
and by how much (paired by seed, with a 95% interval)? Above all on the part of the held-out set that D_0 does
not cover; how much of the oracle arm's gain does it reach; what do guidance and the unexplored rare carry?

Settings (each a config; held-out success is also reported on the setting's shifted part and on the rest apart):
- `shift` (configs/lite-shift.yaml): D_0 holds only one-call tasks (and so do the worked examples drawn from it);
  the 142 held-out BFCL-lite tasks mix 90 one-call and 52 two-call ones, the shifted part (`cd` into a folder,
  then act there).
- `iid`: the same config with the train split's two-call tasks kept (`env.options` without `train_max_calls`):
  D_0 and held-out drawn from one generator; parts as in `shift`.
- `tools` (configs/lite-tools.yaml, run first): one-call tasks only; D_0 never calls `cat` or `cd` (their schemas
  stay in the prompt); the shifted part is the 44 of 130 held-out tasks that call one of them. Half of each
  iteration's sample (after the recurring tasks) comes from synthesized tasks once there are any
  (`loop.synthetic_fraction: 0.5`; static has none). Here the missing part is within the learner's reach.
- `tools-rm` (configs/lite-tools-rm.yaml, defined and committed before any of its runs): the same with `touch` and
  `rm` held back instead.

Arms (overrides of the setting's config, `ARMS`): zero-shot (evaluation only: greedy, so one run stands for every
seed; it is also the "before training" figure of its setting, which the training arms therefore skip); static;
static + guidance (`grpo.guidance: solution`: an all-failure group learns from the task's solution); oracle data
(static on a D_0 that holds the shifted part in its natural share, the prompt's worked examples unchanged: the
bound any data mechanism can reach at this budget), with and without guidance; random (exploration from random
tasks, as many contexts as the signals would have given, guidance on); coevolve (guidance and the unexplored rare
on), the same with `loop.signal_weights: {unexplored: 10}` (a task made for a tool no rollout had called weighs
10 in the draw of D_t), without the unexplored rare, without guidance; the steering arms: `coevolve steered`
(the history curriculum over D_t and the rare over the action states D_t lacks), without either, `random +
curriculum` (the same draw, random contexts), `steered + random rest` (the state contexts, then random tasks where
the signal events would be). On request (`--arms`), in `shift` only:
`coevolve + unexplored orders` (coevolve plus `signals.unexplored_orders`: rare on the ordered tool pairs no
rollout made, `synthesis.focus_retries: 8`, and `loop.signal_weights: {unexplored: 30}`). Every training arm gets
the same model rollouts: `run.max_steps` GRPO steps of `grpo.prompts_per_step` tasks x K (synthesis runs the env,
not the model: the offline explorer).

Statistics: per arm, the mean over seeds of held-out success after training +- t(0.975, n-1) x sd / sqrt(n);
`delta vs static` is the mean over seeds of the paired difference (same seed, same held-out tasks) with the same
t interval over the differences. The zero-shot row's interval is Wilson's over its tasks.

Resumable and run in chunks, across machines: each run has its own directory under `--out`/SETTING; once it has
finished, its record (bench/replicate_records.py: every figure below, the resolved config, the commit) is kept
under `--results` (bench/results/replicate, committed), and a run with a record is read back from it, never
rerun, on any clone. A run folder without a record is recorded when it is found finished (summary.json); an
interrupted one continues with `--resume`. Runs go in priority order (`plan`):
per setting, seed by seed, the main arms (static and coevolve first) and then, on the ablation seeds, the
ablations, so a stopped invocation leaves whole seeds of every arm. `--max-minutes M` starts no run after M minutes;
`--jobs J` runs J at a time, each with cores/J torch threads. Usage: `python bench/replicate.py [--settings tools
shift iid] [--seeds 0 1 2 3 4] [--ablation-seeds 0 1 2] [--jobs 2] [--max-minutes M] [--results DIR] [--no-write]`.
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
from bench.replicate_records import (SIGNALS, code_commit, config_differences, load_record,  # noqa: E402
                                     record_of, save_record)
from coevolve.config import paper_overrides  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "lite-shift.yaml"
TOOLS_CONFIG = REPO / "configs" / "lite-tools.yaml"
TOOLS_RM_CONFIG = REPO / "configs" / "lite-tools-rm.yaml"
RECORDS = REPO / "bench" / "results" / "replicate"
"""One JSON record per finished run (bench/replicate_records.py), committed: the figures outlive the run folders."""
LEFT_OUT_TOOLS = ("cat", "cd")
"""The tools D_0 of the `tools` setting never calls (configs/lite-tools.yaml, `env.options.train_without_tools`)."""
LEFT_OUT_RM = ("touch", "rm")
"""The tools D_0 of the `tools-rm` setting never calls (configs/lite-tools-rm.yaml): the shift added after the
`cat`/`cd` ones, defined and committed before any of its runs, so that no mechanism is fitted to one pair."""


@dataclass(frozen=True)
class Setting:
    """A config and its overrides, and how its held-out tasks split into the shifted part and the rest."""

    config: Path
    overrides: tuple[str, ...]
    parts: tuple[str, str]
    """Labels of (the rest, the shifted part)."""
    shifted: Callable[[int, Sequence[str]], bool]
    """(ground-truth calls, ground-truth tools) -> whether a task is in the shifted part."""
    oracle: tuple[str, ...] | None = None
    """The `oracle data` arm's overrides: D_0 holds the shifted part in its natural share, the worked examples stay
    those of the other arms. None: the setting has no oracle arm."""

    def part_of(self, calls: int, tools: Sequence[str]) -> str:
        return self.parts[1] if self.shifted(calls, tools) else self.parts[0]


def _two_calls(calls: int, tools: Sequence[str]) -> bool:
    return calls >= 2


def _left_out_tool(calls: int, tools: Sequence[str]) -> bool:
    return bool(set(tools) & set(LEFT_OUT_TOOLS))


def _left_out_rm(calls: int, tools: Sequence[str]) -> bool:
    return bool(set(tools) & set(LEFT_OUT_RM))


def _tools_oracle(tools: Sequence[str]) -> tuple[str, ...]:
    return "env.options.train_without_tools=[]", f"model.demo_without_tools=[{','.join(tools)}]"


TOOLS_ORACLE = _tools_oracle(LEFT_OUT_TOOLS)
SETTINGS = {
    "tools": Setting(TOOLS_CONFIG, (), ("seen tools", "cat or cd"), _left_out_tool, TOOLS_ORACLE),
    "tools-rm": Setting(TOOLS_RM_CONFIG, (), ("seen tools", "touch or rm"), _left_out_rm, _tools_oracle(LEFT_OUT_RM)),
    "shift": Setting(CONFIG, (), ("1-call", "2-call"), _two_calls,
                     ("env.options.train_max_calls=2", "model.demo_max_calls=1")),
    "iid": Setting(CONFIG, ("env.options={num_tasks: 560, two_call_share: 0.4}",), ("1-call", "2-call"), _two_calls),
}
GUIDED, UNEXPLORED = "grpo.guidance=solution", "signals.unexplored=true"
CURRICULUM = ("loop.sampler=history", "loop.recur_fraction=0")  # the history sampler retests solved tasks itself
STATES = "signals.unexplored_states=true"
ARMS = {
    "zero-shot": ["run.mode=zero-shot"],
    "static": ["run.mode=static"],
    "static + guidance": ["run.mode=static", GUIDED],
    "oracle data": ["run.mode=static"],  # + the setting's `oracle` overrides
    "oracle data + guidance": ["run.mode=static", GUIDED],
    "random": ["run.mode=random", GUIDED],  # the same learner as coevolve: only the steering differs
    "coevolve": ["run.mode=coevolve", GUIDED, UNEXPLORED],
    "coevolve w/o unexplored": ["run.mode=coevolve", GUIDED],
    "coevolve w/o guidance": ["run.mode=coevolve", UNEXPLORED],
    # Exposure: a task made for a tool no rollout had called weighs 10 in the draw instead of 1. In the coevolve runs
    # above such tasks were about a tenth of the synthesized ones and got ~2 of a run's 48 groups; at 10 they fill
    # about half the synthetic slots, near the oracle arm's share of the shifted part (a third of all slots).
    # Chosen from those training-side counts, before this arm's held-out figures existed.
    "coevolve + unexplored weight": ["run.mode=coevolve", GUIDED, UNEXPLORED, "loop.signal_weights={unexplored: 10}"],
    # Orders (the two-call shift's gap is `cd`, then an action; no tool-level signal names it): rare events on the
    # ordered tool pairs no rollout made, a refused forced call drawn again up to 8 times (a random `cd` names a
    # folder that is there about one time in five), and the weighted draw. BENCHMARKS.md "explore-yield": an order's
    # context yields about a quarter of a task (validation refuses the orders whose last call needs no order), so a
    # run admits ~4-5 of them beside ~150 others; weight 30 lets them fill about half the synthetic slots, the rule
    # the weight 10 above was set by. Set from those training-side counts, before any held-out figure of the arm.
    "coevolve + unexplored orders": ["run.mode=coevolve", GUIDED, UNEXPLORED, "signals.unexplored_orders=true",
                                     "synthesis.focus_retries=8", "loop.signal_weights={unexplored: 30}"],
    # Steering (this round): the curriculum over D_t from each task's own tries (`coevolve.curriculum`) and the rare
    # over the action states D_t lacks (`coevolve.states`), on top of coevolve; their weights are the module
    # defaults, set from the draw's arithmetic (a task admitted last iteration weighs 8, ~40 of a pool's mastered
    # tasks 0.2 each), before any run of these arms. Each switch has its ablation.
    "coevolve steered": ["run.mode=coevolve", GUIDED, UNEXPLORED, *CURRICULUM, STATES],
    "steered w/o curriculum": ["run.mode=coevolve", GUIDED, UNEXPLORED, STATES],
    "steered w/o states": ["run.mode=coevolve", GUIDED, UNEXPLORED, *CURRICULUM],
    "random + curriculum": ["run.mode=random", GUIDED, *CURRICULUM],  # random's learner, with the same draw
    # Steered, with random tasks where the signal events explored after the state contexts
    # (`synthesis.rest_contexts: random`). Set from counts made without the held-out set: bench/state_yield.py (no
    # training) found a random context yielding 1.3x (shift), 4.5x (tools) and 3.5x (tools-rm) the shifted-shape
    # tasks of a signal one, and the steered runs spent about a third of their contexts on boundary events
    # (13-18 of 48) while admitting ~105 tasks a run against random's ~180. Defined before any run of the arm.
    "steered + random rest": ["run.mode=coevolve", GUIDED, UNEXPLORED, *CURRICULUM, STATES,
                              "synthesis.rest_contexts=random"],
    # The paper's signal ablations and the first round's arms (guidance and the unexplored rare off), on request.
    "paper coevolve": ["run.mode=coevolve", *paper_overrides()],  # coevolve.config.STEERING at the paper's values
    "synthetic": ["run.mode=synthetic"],
    "coevolve w/o forgetting": ["run.mode=coevolve", GUIDED, UNEXPLORED, "signals.enabled=[boundary,rare]"],
    "coevolve w/o boundary": ["run.mode=coevolve", GUIDED, UNEXPLORED, "signals.enabled=[forgetting,rare]"],
    "coevolve w/o rare": ["run.mode=coevolve", GUIDED, "signals.enabled=[forgetting,boundary]"],
    # A diagnosis arm, not in the default list: the offline explorer less tied to the flagged tool and two episodes
    # per context, to see whether more varied exploration yields the `cd > action` tasks the shift asks for.
    "coevolve wide": ["run.mode=coevolve", "synthesis.focus_weight=0.3", "synthesis.episodes_per_context=2"],
}
DIAGNOSIS_SETTINGS = {"coevolve wide": ("shift",), "coevolve + unexplored orders": ("shift",)}
"""Settings a diagnosis arm runs in (it answers a question about that setting); other arms run in every setting."""
MAIN_ARMS = ("static", "coevolve", "static + guidance", "oracle data", "random",
             "coevolve + unexplored weight", "coevolve steered", "random + curriculum", "steered + random rest")
COEVOLVE_ARMS = ("coevolve", "coevolve + unexplored weight", "coevolve + unexplored orders", "coevolve steered",
                 "steered + random rest")
"""The arms the goal lines compare with static, random and the oracle bound."""
ABLATIONS = ("oracle data + guidance", "coevolve w/o unexplored", "coevolve w/o guidance", "steered w/o curriculum",
             "steered w/o states")
ABLATION_OF = {"coevolve w/o unexplored": "coevolve", "coevolve w/o guidance": "coevolve",
               "steered w/o curriculum": "coevolve steered", "steered w/o states": "coevolve steered",
               "random + curriculum": "coevolve steered", "steered + random rest": "coevolve steered"}
"""The arm each ablation turns one switch off in: the goal lines say what the switch adds, arm - ablation.
`random + curriculum` is `coevolve steered` with random contexts instead of signal and state ones (the same draw):
what steering exploration adds over chance, the method's claim itself; `steered + random rest` keeps the state
contexts and replaces only the signal ones (its line reads what the signal contexts add over random ones)."""
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def runs_in(arm: str, setting: str) -> bool:
    """Whether `arm` has a run in `setting` (an oracle arm needs the setting's oracle overrides)."""
    if arm.startswith("oracle data"):
        return SETTINGS[setting].oracle is not None
    return setting in DIAGNOSIS_SETTINGS.get(arm, (setting,))


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
        setting = SETTINGS[self.setting]
        extra = [] if self.arm == "zero-shot" else ["loop.eval_before_training=false"]
        oracle = list(setting.oracle or ()) if self.arm.startswith("oracle data") else []
        return [*setting.overrides, f"run.seed={self.seed}", *ARMS[self.arm], *oracle, *extra]

    def config(self) -> dict:
        """The resolved config this run trains with (what a record or a folder is checked against)."""
        from coevolve.config import load_config

        return load_config(str(SETTINGS[self.setting].config), self.overrides()).to_dict()


def plan(settings: list[str], arms: list[str], seeds: list[int], ablation_seeds: list[int]) -> list[Planned]:
    """Every run, most important first: per setting, zero-shot; then seed by seed the main arms (static and coevolve
    first: the headline paired comparison) and, for the ablation seeds, the ablations, so a stopped invocation
    leaves whole seeds of every arm; anything else asked for."""
    runs: list[Planned] = []
    for setting in settings:
        if "zero-shot" in arms:
            runs.append(Planned(setting, "zero-shot", seeds[0]))
        for seed in dict.fromkeys([*seeds, *ablation_seeds]):
            runs += [Planned(setting, arm, seed) for arm in MAIN_ARMS
                     if seed in seeds and arm in arms and runs_in(arm, setting)]
            runs += [Planned(setting, arm, seed) for arm in ABLATIONS
                     if seed in ablation_seeds and arm in arms and runs_in(arm, setting)]
        runs += [Planned(setting, arm, seed) for seed in seeds for arm in arms
                 if arm not in (*MAIN_ARMS, *ABLATIONS, "zero-shot") and runs_in(arm, setting)]
    return runs


def execute(run: Planned, out: Path, threads: int) -> None:
    """Train (or resume) one run in a subprocess, unless it finished; its wall seconds go to bench-seconds.txt."""
    folder = out / run.name
    config = SETTINGS[run.setting].config
    if (folder / "config.yaml").exists():
        from coevolve.config import load_config

        changed = config_differences(load_config(folder / "config.yaml").to_dict(), run.config())
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
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "bench-commit.txt").write_text(f"{code_commit(REPO) or 'unknown'}\n")
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=environment)
    if done.returncode != 0:
        raise SystemExit(f"{run.name} failed:\n{done.stderr[-3000:]}")
    (folder / "bench-seconds.txt").write_text(f"{time.perf_counter() - started:.1f}\n")


def result_of(run: Planned, out: Path, path: Path) -> dict:
    """A finished run folder's record (bench/replicate_records.py), kept at `path` at once: from then on the figures
    of the run no longer need its folder."""
    setting = SETTINGS[run.setting]
    record = record_of(out / run.name, run.setting, run.arm, run.seed, setting.part_of, setting.parts[1],
                       run.config(), run.overrides())
    save_record(path, record)
    return record


def diagnosis(results: list[dict]) -> str:
    """What the synthesized tasks of the coevolve runs look like next to the held-out ones: accepted tasks by tool
    sequence beside the held-out tasks with that sequence, the explored contexts by signal, how the policy did on
    each kind of task it trained on (a group with no success gives GRPO nothing to learn from), and how often a
    rollout whose first call ran cleanly went on to call again (a two-call task needs that); per run, the orders of
    two or more calls the policy practised (own rollouts solved / all)."""
    from collections import Counter

    synthesized: Counter[str] = Counter()
    contexts: Counter[str] = Counter()
    trained: dict[str, list[float]] = {}
    heldout: Counter[str] = Counter()
    clean_first = went_on = 0
    for result in results:
        synthesized.update(result["synthesized"])
        contexts.update(result["contexts_by_signal"])
        heldout = heldout or Counter(result["heldout_sequences"])  # the same held-out set in every run of a setting
        for kind, (count, total) in result["trained_by_kind"].items():
            have = trained.setdefault(kind, [0, 0.0])
            have[0], have[1] = have[0] + count, have[1] + total
        clean_first += result["first_call_clean"][0]
        went_on += result["first_call_clean"][1]
    if not synthesized and not trained:
        return ""
    sequences = sorted(set(synthesized) | set(heldout), key=lambda seq: (-heldout[seq], -synthesized[seq], seq))
    lines = ["| tool sequence | held-out tasks | synthesized and accepted (all coevolve runs) |", "|---|---|---|"]
    lines += [f"| `{seq}` | {heldout[seq]} | {synthesized[seq]} |" for seq in sequences[:16]]
    lines += ["", "Training rollouts of the coevolve runs by task kind: " + "; ".join(
        f"{kind}: {count} rollouts, success {total / count:.3f}"
        for kind, (count, total) in sorted(trained.items())) + ".",
              "Contexts explored, by signal: " + ", ".join(f"{k} {v}" for k, v in sorted(contexts.items())) + ".",
              f"Training rollouts whose first call ran without an error: {clean_first}; of these, {went_on} made "
              "another call.", "", "Own training rollouts on tasks of two or more calls, per run (solved / all), "
              "beside the run's held-out success on the shifted part:", ""]
    shifted = SETTINGS[results[0]["setting"]].parts[1]
    lines += [f"- seed {r['seed']} ({shifted}: {r['after_by_part'].get(shifted, 0.0):.3f}): " + (", ".join(
        f"`{seq}` {solved} / {count}" for seq, (count, solved) in sorted(
            r["trained_by_sequence"].items(), key=lambda item: -item[1][0])) or "none")
        for r in sorted(results, key=lambda r: r["seed"]) if "trained_by_sequence" in r]
    return "\n".join(lines)


def shifted_behaviour(results: list[dict]) -> str:
    """Per arm, on the held-out tasks of the setting's shifted part (after training, mean over seeds): the share
    answered with two or more calls, and the share whose first call is the ground truth's first tool: whether
    training moved the policy towards the shifted skill even where it did not yet solve the task."""
    shares: dict[str, list[list[float]]] = {}
    for result in results:
        if result.get("shifted_answers"):
            shares.setdefault(result["arm"], []).append(result["shifted_answers"])
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
        + f" | tasks added ({setting.parts[1]}; of those one call) | own training rollouts on {setting.parts[1]} "
        f"tasks: solved / all | guided rollouts (on {setting.parts[1]} tasks) | signals fired F / B / R |",
        "|---|---|" + "---|---|" * len(parts) + "---|---|---|---|"]
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
        one_call = statistics.mean(r.get("added_shifted_one_call", 0) for r in results)
        solved = sum(r.get("trained_shifted", [0, 0])[0] for r in results)
        tried = sum(r.get("trained_shifted", [0, 0])[1] for r in results)
        guided = statistics.mean(r.get("guided", 0) for r in results)
        guided_shifted = statistics.mean(r.get("guided_shifted", 0) for r in results)
        fired = " / ".join(str(sum(r["signals"][kind] for r in results)) for kind in SIGNALS)
        lines.append(f"| {arm} | {len(results)} | " + " | ".join(cells)
                     + f" | {added:.1f} ({added_shifted:.1f}; {one_call:.1f}) | {solved} / {tried} | {guided:.1f} "
                     f"({guided_shifted:.1f}) | {fired} |")
    return "\n".join(header + lines)


def paired(rows: dict[str, list[dict]], arm: str, baseline: str, part: str) -> list[float]:
    """Per seed both arms ran: arm - baseline on `part` (same seed, same held-out tasks)."""
    base = {r["seed"]: _value(r, part) for r in rows.get(baseline, [])}
    return [_value(r, part) - base[r["seed"]] for r in rows.get(arm, [])
            if base.get(r["seed"]) is not None and _value(r, part) is not None]


def goal_lines(rows: dict[str, list[dict]], setting: Setting) -> str:
    """The issue's goal in numbers, on the shifted part: coevolve - static and coevolve - random (paired, 95%
    interval), then for each oracle arm that ran (the bound without guidance, and with it: the same learner as
    coevolve) its gain over static and the share of that gain each coevolve arm reaches (ratio of the means over
    the seeds the three arms all ran; arms compared over the same seeds share one gain); last, what each switch an
    ablation turns off adds: coevolve - the ablation, paired, on the shifted part and on the rest."""
    rest, shifted, lines = setting.parts[0], setting.parts[1], []
    arms = [arm for arm in COEVOLVE_ARMS if rows.get(arm)]
    for arm in arms:
        lines += [f"- {arm} - {baseline} on {shifted}: {_interval(paired(rows, arm, baseline, shifted))} "
                  f"({len(paired(rows, arm, baseline, shifted))} seeds)" for baseline in ("static", "random")
                  if rows.get(baseline)]
    for bound in ("oracle data", "oracle data + guidance"):
        reached: dict[str, list[str]] = {}  # the bound's gain over the seeds compared -> what each arm reaches
        for arm in arms:
            seeds = ({r["seed"] for r in rows[arm]} & {r["seed"] for r in rows.get("static", [])}
                     & {r["seed"] for r in rows.get(bound, [])})
            if not seeds:
                continue

            def mean_of(name: str) -> float:
                return statistics.mean(_value(r, shifted) or 0.0 for r in rows[name] if r["seed"] in seeds)

            gain = mean_of(bound) - mean_of("static")
            arms_reaching = reached.setdefault(f"{gain:+.3f} ({len(seeds)} seeds)", [])
            if gain > 0:
                arms_reaching.append(f"{arm} reaches {(mean_of(arm) - mean_of('static')) / gain:.0%} of it")
        if reached:
            lines.append(f"- {bound} - static on {shifted}: " + "; ".join(
                gain + (", " + ", ".join(arms_reaching) if arms_reaching else ": the bound itself shows no gain")
                for gain, arms_reaching in reached.items()))
    for ablation, base in ABLATION_OF.items():  # an arm minus one switch
        if rows.get(base) and rows.get(ablation):  # the sign reads "what the switch adds"
            adds = [paired(rows, base, ablation, part) for part in (shifted, rest)]
            lines.append(f"- {base} - {ablation} on {shifted}: {_interval(adds[0])} ({len(adds[0])} seeds); "
                         f"on {rest}: {_interval(adds[1])}")
    return "\n".join(lines)


def setting_line(setting: Setting) -> str:
    """What one setting's training runs are, read from its config."""
    from coevolve.config import load_config

    config = load_config(str(setting.config), list(setting.overrides))
    return (f"`{setting.config.relative_to(REPO)}`{' with ' + ', '.join(setting.overrides) if setting.overrides else ''}: "
            f"{config.run.max_steps} GRPO steps of {config.grpo.prompts_per_step} tasks x K={config.rollout.group_size} "
            f"in iterations of {config.loop.steps_per_iteration}, SmolLM2-135M")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--settings", nargs="+", default=["tools", "shift"], choices=list(SETTINGS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--ablation-seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=["zero-shot", *MAIN_ARMS, *ABLATIONS], choices=list(ARMS))
    parser.add_argument("--out", default=str(REPO / "runs" / "replicate"))
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (each gets cores / jobs torch threads)")
    parser.add_argument("--max-minutes", type=float, default=0,
                        help="start no new run after this many minutes (0: no limit); rerun to continue")
    parser.add_argument("--results", default=str(RECORDS),
                        help="where each finished run's record is kept (commit it: it outlives the run folder)")
    parser.add_argument("--no-write", action="store_true", help="print the tables, leave BENCHMARKS.md as it is")
    args = parser.parse_args()
    out, records = Path(args.out), Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    runs = plan(args.settings, args.arms, args.seeds, args.ablation_seeds)
    threads = max(1, (os.cpu_count() or 1) // max(1, args.jobs))

    def attempt(run: Planned) -> dict | None:
        path = records / f"{run.name}.json"
        record = load_record(path)
        if record is not None:  # finished, on this machine or another: read back, never rerun
            changed = config_differences(record["config"], run.config())
            if changed:
                raise SystemExit(f"{path} was run with other settings ({', '.join(changed)}); delete it or pick "
                                 "another --results")
            return record
        finished = (out / run.name / "summary.json").exists()
        if not finished and args.max_minutes and (time.perf_counter() - started) / 60 > args.max_minutes:
            return None  # left for the next invocation
        execute(run, out, threads)
        record = result_of(run, out, path)
        print(json.dumps({key: value for key, value in record.items() if key != "config"}), flush=True)
        return record

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:  # threads wait on subprocesses
        done = list(pool.map(attempt, runs))
    results = [result for result in done if result is not None]
    default_arms = ["zero-shot", *MAIN_ARMS, *ABLATIONS]
    arms_flag = "" if args.arms == default_arms else " --arms " + " ".join(
        f'"{arm}"' if " " in arm else arm for arm in args.arms)
    for setting in args.settings:
        planned = [run for run in runs if run.setting == setting]
        mine = [result for result in results if result["setting"] == setting]
        if not mine:
            continue
        command = (f"python bench/replicate.py --settings {setting} --seeds {' '.join(map(str, args.seeds))} "
                   f"--ablation-seeds {' '.join(map(str, args.ablation_seeds))} --jobs {args.jobs}{arms_flag}")
        text = setting_section(setting, mine, command, len(planned) - len(mine))
        print(text)
        if not args.no_write:  # one block per setting: a run of one setting leaves the other's figures as they are
            write_section("replicate-teach", HEADER)
            write_section(f"replicate-teach-{setting}", text)


HEADER = """
## Replication with guidance, the unexplored rare and an oracle-data bound (`bench/replicate.py`)

Question: at equal rollout budget, does CoEvolve beat GRPO on the static D_0, above all on held-out tasks D_0
does not cover (setting `tools`: D_0 never calls `cat` or `cd`, held-out tasks calling them; setting `shift`: D_0
one-call only, held-out 2-call part), how much of what perfect data gives (`oracle data`) does it reach, and what
do guidance (`grpo.guidance: solution`) and the unexplored rare (`signals.unexplored`) each carry?

Arms: the overrides in `ARMS` (`coevolve` = guidance + the unexplored rare; `coevolve + unexplored weight` = the
same with `loop.signal_weights: {unexplored: 10}`, tasks made for a tool no rollout had called drawn 10x as often;
`random` has guidance too, so that coevolve - random measures the steering alone; `oracle data` = static on a D_0
holding the shifted part, with the same worked examples). Each setting's block below is written by its own
command; its figures come from the runs' records (`bench/results/replicate`), one per finished run.
"""


def setting_section(setting: str, results: list[dict], command: str, pending: int) -> str:
    """One setting's block of BENCHMARKS.md: the command and what ran, the table, the goal lines, the diagnosis of
    what coevolve synthesized, how the trained policies answered the shifted part."""
    rows: dict[str, list[dict]] = {}
    for result in results:
        rows.setdefault(result["arm"], []).append(result)
    heldout = max(r["heldout_tasks"] for r in results)
    seconds = [r["seconds"] for r in results if r["arm"] != "zero-shot" and r["seconds"]]
    commits = sorted({(r.get("commit") or "unknown")[:7] for r in results})
    goal = goal_lines(rows, SETTINGS[setting])
    parts = [f"### Setting `{setting}`\n\nCommand: `{command}`. Machine: {machine_line()}. "
             f"{setting_line(SETTINGS[setting])}. {len(results)} finished runs (code at {', '.join(commits)})"
             + (f"; {pending} not yet done (rerun the command to continue)" if pending else "") + ".\n\n"
             + setting_table(rows, heldout, SETTINGS[setting]) + (f"\n\n{goal}" if goal else "")
             + (f"\n\n{len(seconds)} training runs, {statistics.mean(seconds):.0f} s each on average, "
                f"{sum(seconds) / 60:.0f} minutes of run time." if seconds else "")]
    found = diagnosis([r for r in results if r["arm"] == "coevolve"])
    if found:
        parts.append(f"What coevolve synthesized in setting `{setting}`, beside the held-out tasks:\n\n{found}")
    behaviour = shifted_behaviour(results)
    if behaviour:
        parts.append(f"The held-out tasks of setting `{setting}`'s shifted part ({SETTINGS[setting].parts[1]}), "
                     f"how the trained policies answered them:\n\n{behaviour}")
    return "\n\n".join(parts)


if __name__ == "__main__":
    main()
