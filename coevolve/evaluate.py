"""Scripted evaluation: score fixed call sequences (the ground truth, or a model's logged outputs) in an env.

Two scripted policies, both free of any model or torch import so `coevolve eval` on them answers in seconds:
- `oracle`: replays each task's ground truth, turn by turn (a check of the env and scorer: must score 1.0).
- `replay:FILE`: JSON lines `{"id": NAME, "turns": [[call, ...], ...]}`, one per task, where each turn is a list of
  calls (one reply) or a list of lists of calls (several replies); a call is a Python-call string such as
  `cd(folder='x')` or a JSON object `{"name": ..., "arguments": {...}}`. A task with no line in the file scores 0;
  a line whose number of turns differs from the task's scores 0 (BFCL's `force_terminated`).
Model policies generate while they act: `evaluate_model` runs them through the rollout engine (K samples per
task; `accuracy` is then the mean success over all samples, an estimate of pass@1).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from coevolve.envs.base import ENV_FAILURE, Env
from coevolve.jsonl import jsonl_rows
from coevolve.records import Check, Score, Task

Script = list[list[list[Any]]]
"""turns -> replies -> calls."""


class ReplayError(ValueError):
    """A replay file that cannot be read; the message is one line naming the file and line."""


@dataclass(frozen=True)
class TaskResult:
    name: str
    task_id: str
    score: Score


@dataclass(frozen=True)
class EvalReport:
    env: str
    category: str
    policy: str
    results: tuple[TaskResult, ...]

    @property
    def n(self) -> int:
        return len(self.results)

    @property
    def correct(self) -> int:
        return sum(result.score.success for result in self.results)

    @property
    def accuracy(self) -> float:
        return self.correct / self.n if self.n else 0.0

    @property
    def samples(self) -> int:
        """Samples per task (K); each task's results are consecutive."""
        names = {r.name for r in self.results}
        return len(self.results) // len(names) if names else 1

    def per_task(self) -> dict[str, float | int]:
        """Task name -> 0/1 (one sample per task) or the task's success rate over its samples."""
        totals: dict[str, list[int]] = {}
        for result in self.results:
            totals.setdefault(result.name, []).append(int(result.score.success))
        return {name: (v[0] if len(v) == 1 else sum(v) / len(v)) for name, v in totals.items()}

    def to_dict(self) -> dict[str, Any]:
        return {
            "env": self.env,
            "category": self.category,
            "policy": self.policy,
            "accuracy": self.accuracy,
            "n": self.n,
            "correct": self.correct,
            "samples": self.samples,
            "per_task": self.per_task(),
            "failures": {r.name: list(r.score.reasons) for r in self.results if not r.score.success},
        }


def lost_episodes(report: EvalReport) -> list[str]:
    """One reason per episode the env lost (a failed check of kind `ENV_FAILURE`: a worker that died, a server
    that stopped answering): their 0 is not the policy's score. Model policies count theirs in the rollout
    engine (`Trajectory.failure`); scripted ones have only the score."""
    lost = []
    for result in report.results:
        reason = next((check.reason for check in result.score.checks
                       if check.kind == ENV_FAILURE and not check.passed), None)
        if reason is not None:
            lost.append(f"environment: {reason}")
    return lost


def oracle_script(task: Task) -> Script:
    return [[list(calls)] if calls else [] for calls in task.ground_truth]


def run_script(env: Env, task: Task, script: Script) -> Score:
    """Play a fixed script through a fresh episode and return the env's score."""
    if len(script) != task.num_turns:
        reason = f"the script has {len(script)} turns; the task has {task.num_turns} (force_terminated)"
        return Score(0.0, (Check(0, "force_terminated", False, reason),))
    episode = env.reset(task)
    refused: list[Check] = []
    for turn, replies in enumerate(script):
        for calls in replies:
            for step in episode.act(calls):
                if step.call is None and step.error:  # refused before it ran: say why, first
                    refused.append(Check(turn, "call", False, f"call {step.action[:80]!r} refused: {step.error}"))
            if episode.done:
                break
        episode.end_turn()
    score = episode.score()
    if not refused or score.success:
        return score
    return Score(score.value, (*refused, *score.checks))


def evaluate(env: Env, tasks: Sequence[Task], script_for: Callable[[Task], Script | None], policy: str,
             category: str = "") -> EvalReport:
    results = []
    for task in tasks:
        script = script_for(task)
        if script is None:
            score = Score(0.0, (Check(0, "missing", False, f"no replay entry for task {task.name!r}"),))
        else:
            score = run_script(env, task, script)
        results.append(TaskResult(task.name, task.id, score))
    return EvalReport(env.name, category, policy, tuple(results))


# --------------------------------------------------------------------------------------------------------------
# Replay files
# --------------------------------------------------------------------------------------------------------------


def _normalise_turn(turn: Any, where: str) -> list[list[Any]]:
    if not isinstance(turn, list):
        raise ReplayError(f"{where}: each turn must be a list of calls, got {type(turn).__name__}")
    if not turn:
        return []
    if all(isinstance(item, list) for item in turn):
        for reply in turn:
            for call in reply:
                _check_call_shape(call, where)
        return [list(reply) for reply in turn if reply]
    if any(isinstance(item, list) for item in turn):
        raise ReplayError(f"{where}: a turn mixes calls and lists of calls")
    for call in turn:
        _check_call_shape(call, where)
    return [list(turn)]


def _check_call_shape(call: Any, where: str) -> None:
    if not isinstance(call, (str, dict)):
        raise ReplayError(f"{where}: a call must be a string or an object, got {type(call).__name__}")


def load_replay(path: str | Path, known_names: set[str] | None = None) -> dict[str, Script]:
    """Read a replay file into name -> script. Raises ReplayError with a one-line message on any defect."""
    if not str(path).strip():
        raise ReplayError("replay: needs a file, e.g. --policy replay:outputs.jsonl")
    path = Path(path)
    if path.is_dir():
        raise ReplayError(f"replay file {str(path)!r} is a folder; name the JSON-lines file of outputs in it")
    if not path.is_file():
        raise ReplayError(f"replay file {str(path)!r} does not exist")
    scripts: dict[str, Script] = {}
    try:
        rows = list(jsonl_rows(path))
    except ValueError as error:
        raise ReplayError(str(error)) from None
    for line_number, row in rows:
        where = f"{path}:{line_number}"
        if not isinstance(row, Mapping) or "id" not in row or "turns" not in row:
            raise ReplayError(f"{where}: expected an object with 'id' and 'turns'")
        name, turns = row["id"], row["turns"]
        if not isinstance(name, str):
            raise ReplayError(f"{where}: 'id' must be a string")
        if not isinstance(turns, list):
            raise ReplayError(f"{where}: 'turns' must be a list of turns")
        if name in scripts:
            raise ReplayError(f"{where}: task {name!r} appears twice")
        if known_names is not None and name not in known_names:
            raise ReplayError(f"{where}: unknown task id {name!r} for this env/category")
        scripts[name] = [_normalise_turn(turn, where) for turn in turns]
    return scripts


def evaluate_model(env: Env, tasks: Sequence[Task], backend: Any, renderer: Any, config: Any, policy: str,
                   category: str = "", progress: Callable[[int, int], None] | None = None) -> tuple[EvalReport, Any]:
    """Score a model policy: one rollout batch of `config.group_size` samples per task. Returns the report and
    the `RolloutBatch` (trajectories with their steps, for logging)."""
    from coevolve.rollout import rollout

    batch = rollout(env, tasks, backend, renderer, config, progress=progress)
    names = {task.id: task.name for task in tasks}
    results = []
    for trajectory in batch.trajectories:
        # The trajectory keeps the reasons of its failed checks (and truncation notes) as text.
        failed = () if trajectory.score >= 1.0 else tuple(Check(0, "episode", False, r) for r in trajectory.reasons)
        results.append(TaskResult(names[trajectory.task_id], trajectory.task_id, Score(trajectory.score, failed)))
    return EvalReport(env.name, category, policy, tuple(results)), batch
