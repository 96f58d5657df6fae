"""What user-written envs share (env `python`, your tools; env `mcp`, an MCP server): importing the spec a user
names, reading tool docs from docstrings, loading and checking a task file, and playing a task's ground truth twice
for `coevolve env check`. Both envs import it; it imports neither, nor validation or exploration.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from pathlib import Path
from typing import Any

from coevolve.envs.base import EMPTY_RESULTS
from coevolve.jsonl import jsonl_rows
from coevolve.records import Task, task_record


class EnvDefinitionError(ValueError):
    """The class or the task file cannot make an env; the message names the method, the task and the fix."""


def import_attribute(spec: str, what: str = "ClassName") -> Any:
    """`package.module:NAME`, imported from the installed packages or else the current directory. The current
    directory goes last on `sys.path`: a `torch.py` or `json.py` lying there never replaces the real module.
    None when the module has no such name."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise EnvDefinitionError(f"{spec!r}: expected package.module:{what}")
    if not re.fullmatch(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*", module_name) or not attribute.isidentifier():
        raise EnvDefinitionError(f"{spec!r}: expected package.module:{what}, dotted names only (no paths); run "
                                 "from the folder that holds the package")
    if str(Path.cwd()) not in sys.path:
        sys.path.append(str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise EnvDefinitionError(f"{spec!r}: cannot import {module_name} ({error})") from None
    except Exception as error:  # noqa: BLE001 - the module itself raised while importing: say what, in one line
        raise EnvDefinitionError(f"{spec!r}: importing {module_name} raised {type(error).__name__}: "
                                 f"{str(error)[:200]}") from None
    return getattr(module, attribute, None)


def doc_parts(doc: str) -> tuple[str, dict[str, str]]:
    """(description, argument -> description) from a Google- or NumPy-style docstring."""
    doc = inspect.cleandoc(doc)
    paragraphs = re.split(r"\n\s*\n", doc)
    description = " ".join(paragraphs[0].split()) if paragraphs else ""
    arguments: dict[str, str] = {}
    google = re.search(r"^(?:Args|Arguments|Parameters):\s*$(.*?)(?=^\w[\w ]*:\s*$|\Z)", doc, re.M | re.S)
    numpy = re.search(r"^Parameters\s*\n-{3,}\s*\n(.*?)(?=^\w[\w ]*\n-{3,}|\Z)", doc, re.M | re.S)
    if google:
        for match in re.finditer(r"^\s+(\w+)(?:\s*\([^)]*\))?:\s*(.+?)(?=^\s+\w+(?:\s*\([^)]*\))?:|\Z)",
                                 google.group(1), re.M | re.S):
            arguments[match.group(1)] = " ".join(match.group(2).split())
    elif numpy:
        for match in re.finditer(r"^(\w+)\s*(?::[^\n]*)?\n((?:[ \t]+.+\n?)*)", numpy.group(1), re.M):
            arguments[match.group(1)] = " ".join(match.group(2).split())
    return description, arguments


def load_task_file(path: str | Path, env_name: str, no_reward: str | None, checks: bool = False) -> list[Task]:
    """The task file's tasks, each checked for shape; a bad line is refused naming path:line and the fix.
    `no_reward`: why an episode without ground truth cannot be scored (None: it can); `checks`: tasks may list
    their own probe calls (`checks`, env `mcp`), kept in `meta["checks"]`."""
    tasks, seen = [], set()
    try:
        rows = list(jsonl_rows(Path(path)))
    except OSError as error:
        raise EnvDefinitionError(f"tasks file {path}: {error.strerror or error}") from None
    except ValueError as error:
        raise EnvDefinitionError(str(error)) from None
    if not rows:
        raise EnvDefinitionError(f"tasks file {path}: no task in it (one JSON object a line)")
    first_line: dict[str, int] = {}
    for number, row in rows:
        where = f"{path}:{number}"
        if not isinstance(row, dict):
            raise EnvDefinitionError(f"{where}: expected a JSON object")
        if "env" in row and "initial_state" in row:  # a task record, as `coevolve pool --export` writes one
            task = _task_record(row, where, env_name, checks)
            if task.id in first_line:
                raise EnvDefinitionError(f"{where}: the same task as line {first_line[task.id]}; drop one")
            first_line[task.id] = number
            tasks.append(task)
            continue
        if ("query" in row) == ("turns" in row):
            raise EnvDefinitionError(f"{where}: give `query` (one message) or `turns` (a list of turns), not both/none")
        turns = [[row["query"]]] if "query" in row else row["turns"]
        if not isinstance(turns, list) or not turns or not all(
                isinstance(turn, list) and all(isinstance(text, str) for text in turn) for turn in turns):
            raise EnvDefinitionError(f"{where}: `turns` must be a list of turns, each a list of message strings")
        reset = row.get("reset") or {}
        if not isinstance(reset, dict):
            raise EnvDefinitionError(f"{where}: `reset` must be an object of keyword arguments")
        truth = row.get("ground_truth")
        if truth is None and no_reward:
            raise EnvDefinitionError(f"{where}: no `ground_truth`, and {no_reward} to score the episode: give one or "
                                     "the other")
        truth = truth if truth is not None else [[] for _ in turns]
        if not isinstance(truth, list) or len(truth) != len(turns) or not all(
                isinstance(turn, list) and all(isinstance(call, str) for call in turn) for turn in truth):
            raise EnvDefinitionError(f"{where}: `ground_truth` must be a list per turn ({len(turns)}) of call strings")
        name = str(row.get("id", f"task-{number}"))
        if name in seen:
            raise EnvDefinitionError(f"{where}: id {name!r} appears twice")
        seen.add(name)
        split = row.get("split", "train")
        if split not in ("train", "test"):
            raise EnvDefinitionError(f"{where}: split must be train or test, got {split!r}")
        meta: dict[str, Any] = {"split": split}
        if "checks" in row:
            probes = row["checks"]
            if not checks:
                raise EnvDefinitionError(f"{where}: `checks` is for env mcp (probe calls); here the state is compared "
                                         "whole: drop it")
            if not isinstance(probes, list) or not all(isinstance(call, str) for call in probes):
                raise EnvDefinitionError(f"{where}: `checks` must be a list of call strings, e.g. [\"get_balance()\"]")
            meta["checks"] = probes
        task = Task.create(env_name, name, [[{"role": "user", "content": text} for text in turn] for turn in turns],
                           reset, truth, meta)
        if task.id in first_line:  # ids are content hashes: the same turns, reset and ground truth
            raise EnvDefinitionError(f"{where}: the same task as line {first_line[task.id]}; drop one: it would "
                                     "count twice")
        first_line[task.id] = number
        tasks.append(task)
    return tasks


def _task_record(row: dict, where: str, env_name: str, checks: bool) -> Task:
    """A task record (`Task.to_dict`, what a run's pool exports) checked for this env: the same env, user turns of
    text, a ground truth of call strings, probe calls only where the env takes them."""
    try:
        task = task_record(row, env_name)
    except ValueError as error:
        raise EnvDefinitionError(f"{where}: {error}") from None
    if not task.turns or not all(isinstance(turn, (list, tuple)) and all(
            isinstance(message, dict) and message.get("role") == "user" and isinstance(message.get("content"), str)
            for message in turn) for turn in task.turns):
        raise EnvDefinitionError(f"{where}: a task record's turns must be lists of user messages")
    if len(task.ground_truth) != len(task.turns) or not all(
            isinstance(call, str) for turn in task.ground_truth for call in turn):
        raise EnvDefinitionError(f"{where}: `ground_truth` must be a list per turn ({len(task.turns)}) of call "
                                 "strings")
    if not isinstance(task.initial_state, dict):
        raise EnvDefinitionError(f"{where}: `initial_state` must be an object of keyword arguments")
    probes = task.meta.get("checks")
    if probes is not None and (not checks or not isinstance(probes, list)
                               or not all(isinstance(call, str) for call in probes)):
        raise EnvDefinitionError(f"{where}: `checks` must be a list of call strings, and only env mcp takes them")
    if task.meta.get("split", "train") not in ("train", "test"):
        raise EnvDefinitionError(f"{where}: split must be train or test, got {task.meta.get('split')!r}")
    return task


def truth_problem(env: Any, task: Task, cause_if_differs: str) -> str | None:
    """What `env check` says of a task's ground truth played twice on fresh instances (envs `python`, `mcp`):
    it cannot start, a call fails, it changes and returns nothing, the two runs differ, or it does not score 1."""
    first, second = _play_truth(env, task), _play_truth(env, task)
    if first["setup"]:  # the constructor or reset raised, hung or ended the worker; the server did not start
        return first["setup"]
    failed = [(call, error) for call, error in first["errors"] if error]
    if failed:
        return f"ground truth call {failed[0][0]!r} fails: {failed[0][1]}; fix the call or the tools"
    if any(task.ground_truth) and first["initial"] == first["state"] and all(
            result.strip() in EMPTY_RESULTS for result in first["results"]):
        return "its ground truth changes nothing and returns nothing, so nothing can be checked"
    if second["setup"] or first["state"] != second["state"] or first["results"] != second["results"]:
        return (f"two runs of its ground truth end differently ({cause_if_differs}); state must be a function of "
                "reset's arguments and the calls")
    if first["score"] < 1.0:
        return f"its own ground truth scores {first['score']}: {first['reasons'][:1]}"
    return None


def _play_truth(env: Any, task: Task) -> dict[str, Any]:
    episode = env.reset(task)
    if episode.lost:
        return {"setup": episode.lost}
    initial, errors, results = episode.state(), [], []
    for calls in task.ground_truth:
        for step in episode.act(list(calls)):
            errors.append((step.action, step.error))
            results.append(step.observation if step.error is None else "")
        episode.end_turn()
    score = episode.score()
    return {"initial": initial, "state": episode.state(), "errors": errors, "results": results,
            "score": score.value, "reasons": list(score.reasons), "setup": None}
