"""The AppWorld side of `coevolve.envs.appworld`: one process, one open world at a time, JSON lines on stdin/stdout.

This file runs in AppWorld's own virtualenv (`make appworld-venv`: `appworld==0.1.3.post1` pins pydantic 1, which
our stack cannot share), so it imports only the standard library and `appworld`, never `coevolve`. It is started as
`.venv-appworld/bin/python appworld_worker.py` and answers one request line with one reply line:

    request  {"op": "open", "task_id": "82e2fac_1", ...}
    reply    {"ok": true, "result": {...}}   or   {"ok": false, "kind": "missing_data" | "error", "error": "..."}

Ops: `hello`, `tasks` (ids and specs of a split), `open` (a fresh world of a task; closes the previous one),
`execute` (one code cell, AppWorld's own interface: its safety guard, its per-cell timeout), `state` (a digest of
every app's database), `completed`, `evaluate` (AppWorld's evaluator: its pass/fail tests), `close`, `quit`.

Why one world per process: AppWorld keeps process-wide state (freezegun's frozen clock set to the task's date,
database caches keyed by task id), so two open worlds of one process share a clock and, for the same task, a
database. The client (`AppWorldEnv`) gives every open episode its own worker.

Nothing AppWorld prints reaches the protocol: file descriptor 1 is pointed at stderr before AppWorld is imported,
and replies go to a private duplicate of the original stdout.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
import traceback
from typing import Any

PROTOCOL_VERSION = 1


def _clock() -> float:
    """Seconds for the replies' timings: AppWorld freezes time.time/perf_counter/monotonic (freezegun) while a world
    is open; CLOCK_MONOTONIC is not patched."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


class MissingData(Exception):
    """AppWorld's data directory (tasks, databases) is not where APPWORLD_ROOT says."""


def _data_dir() -> str:
    return os.path.join(os.environ.get("APPWORLD_ROOT", os.getcwd()), "data")


def _require_data(split: str | None = None) -> None:
    data = _data_dir()
    missing = [name for name in ("tasks", "datasets", "base_dbs") if not os.path.isdir(os.path.join(data, name))]
    if split is not None and not missing and not os.path.exists(os.path.join(data, "datasets", f"{split}.txt")):
        missing.append(f"datasets/{split}.txt")
    if missing:
        raise MissingData(f"AppWorld's data is missing under {data} (no {', '.join(missing)})")


class Worker:
    def __init__(self) -> None:
        self.world: Any = None
        self.experiment = f"coevolve-{os.getpid()}"

    # -- ops ------------------------------------------------------------------------------------------------
    def hello(self) -> dict:
        import appworld

        data = _data_dir()
        return {"protocol": PROTOCOL_VERSION, "appworld": getattr(appworld, "__version__", "?"), "data": data,
                "has_data": os.path.isdir(os.path.join(data, "tasks")), "pid": os.getpid()}

    def tasks(self, split: str, limit: int | None = None) -> list[dict]:
        _require_data(split)
        from appworld.task import load_task_ids

        task_ids = load_task_ids(split)
        if limit is not None:
            task_ids = task_ids[:limit]
        return [self._specs(task_id) for task_id in task_ids]

    def _specs(self, task_id: str) -> dict:
        directory = os.path.join(_data_dir(), "tasks", task_id)
        with open(os.path.join(directory, "specs.json")) as file:
            specs = json.load(file)
        solution_path = os.path.join(directory, "ground_truth", "compiled_solution.py")
        solution = None
        if os.path.exists(solution_path):  # train/dev ship their solutions; the test splits do not
            with open(solution_path) as file:
                solution = file.read()
        supervisor = specs.get("supervisor") or specs.get("main_user") or {}
        return {"task_id": task_id, "instruction": specs["instruction"], "datetime": specs.get("datetime"),
                "supervisor": {key: supervisor.get(key) for key in ("first_name", "last_name", "email",
                                                                       "phone_number")},
                "solution": solution}

    def open(self, task_id: str, timeout_seconds: int = 30, random_seed: int = 100,
             max_interactions: int = 1000) -> dict:
        _require_data()
        self.close()
        from appworld import AppWorld

        self.world = AppWorld(task_id=task_id, experiment_name=self.experiment, timeout_seconds=timeout_seconds,
                              random_seed=random_seed, max_interactions=max_interactions)
        return {"task_id": task_id, "instruction": self.world.task.instruction}

    def execute(self, code: str) -> dict:
        world = self._open_world()
        output = world.execute(code)
        return {"output": output, "failed": output.startswith("Execution failed")}

    def state(self) -> dict:
        """A content digest of every app's live database: every table (full-text indexes left out, they follow the
        tables), rows in rowid order. AppWorld's clock is frozen to the task's date, so the same actions give the
        same rows, timestamps included. (`models.model_hashes()` would not do: those are change counters.)"""
        from appworld.common.utils import import_models_module

        world = self._open_world()
        digest = {}
        for app in [*world.task.allowed_apps, "admin"]:
            connection = import_models_module(app).SQLModel.db.connection  # the app's current (live) database
            hashed = hashlib.sha256()
            tables = [row[0] for row in connection.execute(
                "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' "
                "AND name NOT LIKE '%_fts%' ORDER BY name")]
            for table in tables:
                hashed.update(table.encode())
                for row in connection.execute(f'SELECT * FROM "{table}" ORDER BY rowid'):
                    hashed.update(repr(row).encode())
            digest[app] = hashed.hexdigest()[:16]
        return {"digest": digest}

    def completed(self) -> bool:
        return bool(self._open_world().task_completed())

    def evaluate(self) -> dict:
        tracker = self._open_world().evaluate(suppress_errors=True)
        result = tracker.to_dict(stats_only=False)
        return {"success": bool(result["success"]), "num_tests": result["num_tests"],
                "passes": [_test(entry) for entry in result["passes"]],
                "failures": [_test(entry) for entry in result["failures"]]}

    def close(self) -> dict:
        world, self.world = self.world, None
        if world is not None:
            output_directory = world.output_directory
            try:
                world.close()
            except (IndexError, AttributeError):  # freezegun's freezer stopped twice (after evaluate): harmless
                pass
            shutil.rmtree(output_directory, ignore_errors=True)  # the episode's logs and databases: not kept
        return {}

    def _open_world(self) -> Any:
        if self.world is None:
            raise RuntimeError("no world is open: send `open` first")
        return self.world


def _test(entry: dict) -> dict:
    return {"requirement": str(entry.get("requirement", "")), "label": entry.get("label"),
            "trace": str(entry.get("trace", ""))[:2000]}


def serve(read: Any, write: Any) -> None:
    worker = Worker()
    ops = {"hello": worker.hello, "tasks": worker.tasks, "open": worker.open, "execute": worker.execute,
           "state": worker.state, "completed": worker.completed, "evaluate": worker.evaluate, "close": worker.close}
    for line in read:
        if not line.strip():
            continue
        started = _clock()
        try:
            request = json.loads(line)
            op = request.pop("op")
            if op == "quit":
                worker.close()
                reply: dict = {"ok": True, "result": None}
                write.write(json.dumps(reply) + "\n")
                write.flush()
                return
            if op not in ops:
                raise ValueError(f"unknown op {op!r}")
            reply = {"ok": True, "result": ops[op](**request)}
        except MissingData as error:
            reply = {"ok": False, "kind": "missing_data", "error": str(error)}
        except Exception as error:  # noqa: BLE001 - every failure goes back to the client as data
            detail = "".join(traceback.format_exception_only(type(error), error)).strip()
            reply = {"ok": False, "kind": "error", "error": detail[:4000]}
        reply["seconds"] = round(_clock() - started, 4)
        write.write(json.dumps(reply, default=str) + "\n")
        write.flush()


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))  # holds coevolve's appworld.py: it must not shadow the package
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    protocol_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever AppWorld or IPython prints goes to stderr, never into a reply
    sys.stdout = sys.stderr
    serve(sys.stdin, protocol_out)


if __name__ == "__main__":
    main()
