"""One finished replication run as a record: what its table rows, goal lines and diagnosis need, in one small JSON
file kept in the repository (`bench/results/replicate/SETTING/ARM-seedK.json`).

Why: a run folder is ~0.5 GB and lives on the machine that trained it; a replication takes many hours, more than
one session's machine keeps. The third round lost 25 finished runs of the two-call shift with a machine: only
their aggregates in BENCHMARKS.md were left, which cannot be paired by seed again. A record is written atomically
as soon as its run has finished and is read back instead of the folder, so what a run measured outlives the
folder and the machine, and `bench/replicate.py` resumes from the records on any clone.

A record carries the run's resolved config, so that a record made with other settings is never read back as one
made with these (`config_differences`), and the commit of the code that trained it.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from coevolve.jsonl import atomic_write_text, read_jsonl
from coevolve.records import call_name

SIGNALS = ("forgetting", "boundary", "rare")


def flat(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A resolved config as dotted keys (`env.options` stays one value: its keys are the env's, not the config's)."""
    items: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict) and key != "options":
            items.update(flat(value, f"{prefix}{key}."))
        else:
            items[f"{prefix}{key}"] = value
    return items


def config_differences(have: Mapping[str, Any], want: Mapping[str, Any]) -> list[str]:
    """Settings in which a run's resolved config (`have`) differs from the one asked for (`want`), output folder
    aside. A key only one side has is a switch added (or removed) since the run: new switches default to the old
    behaviour, so it is not a difference; a value two configs both hold and disagree on is."""
    have, want = flat(have), flat(want)
    return sorted(key for key in set(have) & set(want) if key not in UNRELATED and have[key] != want[key])


UNRELATED = ("run.output_dir", "run.report_to")
"""Settings that change where a run writes, never what it trains: a record made with other values still counts."""


def code_commit(repo: Path) -> str | None:
    """The commit checked out in `repo` (None outside a git checkout): the code a run was trained with."""
    try:
        done = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def save_record(path: Path, record: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(record, indent=1, sort_keys=True) + "\n")


def load_record(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def record_of(folder: Path, setting_name: str, arm: str, seed: int,
              part_of: Callable[[int, Sequence[str]], str], shifted_part: str, config: Mapping[str, Any],
              overrides: Sequence[str]) -> dict[str, Any]:
    """What a finished run folder says, as a record: held-out success after training (all, and on each part of its
    setting), signals fired, the synthesized tasks (and those in the shifted part), guided rollouts, time; for the
    diagnosis, the accepted tasks by tool sequence, contexts by signal, own training rollouts by kind of task and,
    on tasks of two or more calls, by tool sequence (rollouts, solved), how often a clean first call went on; and
    how the trained policy answered the shifted part."""
    from coevolve.pool import TaskPool
    from coevolve.report import tool_sequence

    def shifted(calls: int, tools: Sequence[str]) -> bool:
        return part_of(calls, tools) == shifted_part

    metrics = read_jsonl(folder / "metrics.jsonl")
    summary = json.loads((folder / "summary.json").read_text())
    last = next(m for m in reversed(metrics) if m["heldout_success"] is not None)
    tasks = {}
    if (folder / "pool.sqlite").exists():
        with TaskPool(folder / "pool.sqlite") as pool:
            tasks = {task.id: task for task in pool.tasks_at(pool.latest_iteration() or 0)}
    shifted_ids = {task_id for task_id, task in tasks.items() if shifted(len(task.truth_tools), task.truth_tools)}
    added_shifted = [task for task_id, task in tasks.items()
                     if task_id in shifted_ids and task.provenance.source == "synthetic"]

    # The policy's own training rollouts (guided ones are the solutions it was shown), by kind of task.
    trained_shifted, guided_shifted, clean_first, went_on = [0, 0], 0, 0, 0
    trained_by_kind: dict[str, list[float]] = {}
    trained_by_sequence: dict[str, list[int]] = {}
    rollouts = read_jsonl(folder / "rollouts.jsonl") if (folder / "rollouts.jsonl").exists() else []
    for row in rollouts:
        if row["task_id"] in shifted_ids:
            guided_shifted += bool(row.get("guided"))
            if not row.get("guided"):
                trained_shifted = [trained_shifted[0] + (row["score"] >= 1.0), trained_shifted[1] + 1]
        if row.get("guided"):
            continue
        task = tasks.get(row["task_id"])
        if task is not None:
            tools = task.truth_tools
            part = part_of(len(tools), tools)
            kind = f"{task.provenance.source}, " + (f"{len(tools)}-call" if part.endswith("-call") else part)
            count, total = trained_by_kind.get(kind, [0, 0.0])
            trained_by_kind[kind] = [count + 1, total + row["score"]]
            if len(tools) >= 2:  # which orders of calls the policy practised, and solved, itself
                count, solved = trained_by_sequence.get(tool_sequence(tools), [0, 0])
                trained_by_sequence[tool_sequence(tools)] = [count + 1, solved + (row["score"] >= 1.0)]
        steps = row.get("steps", [])
        if steps and not steps[0].get("error"):
            clean_first += 1
            went_on += len(steps) > 1

    heldout = [row for row in read_jsonl(folder / "heldout.jsonl") if row["iteration"] == last["iteration"]] \
        if (folder / "heldout.jsonl").exists() else []
    by_part: dict[str, list[bool]] = {}
    for row in heldout:
        by_part.setdefault(part_of(row.get("truth_calls", 1), row.get("truth_tools", ())), []).append(
            bool(row["success"]))
    # How the trained policy answered the shifted part: with two or more calls; first call = the truth's first tool.
    on_shifted = [row for row in heldout if shifted(row.get("truth_calls", 1), row.get("truth_tools", ()))]
    shifted_answers = None
    if on_shifted and arm != "zero-shot":
        shifted_answers = [
            sum(len(row["calls"]) >= 2 for row in on_shifted) / len(on_shifted),
            sum(bool(row["calls"]) and call_name(row["calls"][0].lstrip("[")) == row["truth_tools"][0]
                for row in on_shifted) / len(on_shifted)]
    synthesized: Counter[str] = Counter(
        tool_sequence(row["solution"]) for row in read_jsonl(folder / "synthesis.jsonl") if row.get("accepted")) \
        if (folder / "synthesis.jsonl").exists() else Counter()
    contexts: Counter[str] = Counter()
    for m in metrics:
        contexts.update(m.get("synthesis", {}).get("contexts_by_signal", {}))
    seconds_file, commit_file = folder / "bench-seconds.txt", folder / "bench-commit.txt"
    return {
        "setting": setting_name, "arm": arm, "seed": seed, "heldout_tasks": len(heldout),
        "after": last["heldout_success"],
        "after_by_part": {part: sum(values) / len(values) for part, values in by_part.items()},
        "added": summary.get("tasks_added", 0), "added_shifted": len(added_shifted),
        "added_shifted_one_call": sum(len(task.truth_tools) == 1 for task in added_shifted),
        "trained_shifted": trained_shifted,
        "guided": sum(m.get("guided", 0) for m in metrics), "guided_shifted": guided_shifted,
        "feedback_share": summary.get("feedback_share", 0.0),
        # The driver's wall seconds; a run trained outside it has the trainer's own (a few seconds fewer).
        "seconds": float(seconds_file.read_text()) if seconds_file.exists() else summary.get("seconds"),
        "signals": {kind: sum(m["signals"].get(kind, 0) for m in metrics) for kind in SIGNALS},
        "signals_by_iteration": [[m["signals"].get(kind, 0) for kind in SIGNALS] for m in metrics[1:]],
        "synthesized": dict(synthesized), "contexts_by_signal": dict(contexts),
        "trained_by_kind": trained_by_kind, "trained_by_sequence": trained_by_sequence,
        "first_call_clean": [clean_first, went_on],
        "heldout_sequences": dict(Counter(tool_sequence(row.get("truth_tools", [])) for row in heldout)),
        "shifted_answers": shifted_answers,
        "overrides": list(overrides), "config": dict(config),
        "commit": commit_file.read_text().strip() if commit_file.exists() else None,
    }
