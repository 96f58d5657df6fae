"""The evolving task pool D_t (CoEvolve, arXiv 2604.15840, §3 "updating the data distribution"), in SQLite.

After iteration t the validated candidates join the pool, D_{t+1} = D_t ∪ {admitted}, and training samples its
next batches from D_{t+1}. This module stores every version of D_t so that any of them can be rebuilt exactly,
the provenance of every task, and the per-task success history the forgetting signal reads (signals.py).

Schema (version `SCHEMA_VERSION`, kept in `PRAGMA user_version`)
- `tasks`: one row per task ever admitted: id (= `Task.id`, a content hash), the payload (`Task.to_json()`, the
  record itself), source and provenance columns (for queries; the payload is the truth), and a dedup key.
- `iterations` + `membership(iteration, task_id)`: D_t as rows. Starting iteration t copies D_{t-1}'s rows; tasks
  added at t join D_t and every later version. Once a later iteration exists D_t is frozen: adding to it is refused.
- `history(task_id, iteration, success_rate)`: s_now of each task in each iteration it was rolled out.

Durability: WAL journal, `synchronous=FULL`, every write one `BEGIN IMMEDIATE` transaction: a process killed at
any point leaves each batch either wholly there or wholly absent (tests/test_pool.py kills a writer with SIGKILL).

Duplicates: two tasks are duplicates when they start from the same state (env, initial state, env metadata such
as BFCL's category) and their normalised query (the user text, lower-cased, whitespace collapsed) and normalised
solution (each ground-truth call parsed and written in canonical form) are equal. The second is refused,
with the id it duplicates. (The same query and solution from another initial state is another task: BFCL's
long-context entries repeat base entries' queries over a larger state.)

Sampling: a seeded draw without replacement, weighted (Efraimidis–Spirakis keys u^(1/w)), from a configurable
mix of seed and synthetic tasks, with caps per parent task and per signal for synthetic tasks (`BatchMix`).
"""

from __future__ import annotations

import json
import math
import random
import sqlite3
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import groupby, repeat
from operator import itemgetter
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

from coevolve.calls import parse_call
from coevolve.records import SIGNAL_KINDS, TASK_SOURCES, Task, ToolCall, canonical_json, content_hash

SCHEMA_VERSION = 1
POOL_FILENAME = "pool.sqlite"
_NO_LIMIT = 1 << 62  # larger than any iteration or window
RANDOM_SIGNAL = "random"
"""The signal key of a synthetic task that came from random (unsteered) exploration: its `signal` is None."""
UNEXPLORED = "unexplored"
"""Weight key of a task made for a tool no rollout had called (a rare event for an unexplored tool)."""
WEIGHT_KINDS = (*SIGNAL_KINDS, RANDOM_SIGNAL, UNEXPLORED)

_SCHEMA = """
CREATE TABLE tasks (
    seq INTEGER PRIMARY KEY,                -- admission order
    id TEXT NOT NULL UNIQUE,                -- Task.id
    name TEXT NOT NULL,
    env TEXT NOT NULL,
    payload TEXT NOT NULL,                  -- Task.to_json()
    source TEXT NOT NULL CHECK (source IN ('seed', 'synthetic')),
    parent_id TEXT,
    signal TEXT,
    episode_id TEXT,
    provenance_iteration INTEGER,
    verdict TEXT,
    added_iteration INTEGER NOT NULL,       -- first D_t that holds the task
    dedup_key TEXT NOT NULL UNIQUE
);
CREATE TABLE iterations (
    iteration INTEGER PRIMARY KEY,
    base_iteration INTEGER                  -- the D_t it was copied from (NULL for the first)
);
CREATE TABLE membership (
    iteration INTEGER NOT NULL REFERENCES iterations(iteration),
    task_id TEXT NOT NULL REFERENCES tasks(id),
    PRIMARY KEY (iteration, task_id)
) WITHOUT ROWID;
CREATE TABLE history (
    task_id TEXT NOT NULL REFERENCES tasks(id),
    iteration INTEGER NOT NULL,
    success_rate REAL NOT NULL CHECK (success_rate >= 0.0 AND success_rate <= 1.0),
    PRIMARY KEY (task_id, iteration)
) WITHOUT ROWID;
"""


class PoolError(Exception):
    """The file is not a task pool this code can read (missing, another schema version, not a pool)."""


# ---------------------------------------------------------------------------------------------------------------
# Duplicates: pure functions
# ---------------------------------------------------------------------------------------------------------------


def normalise_query(text: str) -> str:
    """Lower-cased, whitespace runs collapsed to one space, ends stripped."""
    return " ".join(text.lower().split())


def normalise_call(call: str) -> str:
    """The call in canonical form: parsed by `coevolve.calls` (ast, never evaluated) and written back as JSON with
    sorted keys, so spacing, quote style and keyword order do not matter: `cd( folder = "a b" )` and
    `cd(folder='a b')` normalise alike. A call that does not parse is kept with its whitespace collapsed."""
    parsed = parse_call(call)
    if isinstance(parsed, ToolCall):
        return canonical_json({"name": parsed.name, "positional": list(parsed.positional),
                               "arguments": dict(parsed.arguments)})
    return " ".join(call.split())


def dedup_key(task: Task) -> str:
    """Hash of the starting point (env, initial state, metadata), the normalised query (user text per turn) and
    the normalised solution (ground-truth calls per turn)."""
    query = [
        [normalise_query(message.get("content", "")) for message in turn if message.get("role", "user") == "user"]
        for turn in task.turns
    ]
    solution = [[normalise_call(call) for call in turn] for turn in task.ground_truth]
    start = {"env": task.env, "initial_state": task.initial_state, "meta": task.meta}
    return content_hash({"start": start, "query": query, "solution": solution}, length=32)


# ---------------------------------------------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchMix:
    """How one iteration's training batch is drawn from D_t."""

    synthetic_fraction: float | None = None
    """Target share of synthetic tasks in a batch (0.25 -> a quarter); None draws from D_t as a whole. When one
    source runs short the other fills the batch."""
    signal_weights: Mapping[str, float] = field(default_factory=dict)
    """Weight of a synthetic task by the signal that produced it (`forgetting`, `boundary`, `rare`, or `random`
    for random exploration); absent kinds weigh 1. Seed tasks weigh 1. `unexplored` weighs a task made for a tool
    no rollout had called (`Provenance.focus_tool`) instead of its signal's weight."""
    max_per_parent: int | None = None
    """At most this many synthetic tasks of one parent task in a batch (None: no cap)."""
    max_per_signal: int | None = None
    """At most this many synthetic tasks of one signal kind in a batch (None: no cap)."""

    def __post_init__(self) -> None:
        if self.synthetic_fraction is not None and not 0.0 <= self.synthetic_fraction <= 1.0:
            raise ValueError(f"synthetic_fraction must lie in [0, 1], got {self.synthetic_fraction!r}")
        for kind, weight in self.signal_weights.items():
            if kind not in WEIGHT_KINDS:
                raise ValueError(f"unknown signal {kind!r} in signal_weights; known: {', '.join(WEIGHT_KINDS)}")
            _check_weight(weight, f"signal_weights[{kind!r}]")
        for name in ("max_per_parent", "max_per_signal"):
            cap = getattr(self, name)
            if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 0):
                raise ValueError(f"{name} must be a non-negative int or None, got {cap!r}")


@dataclass(frozen=True)
class PoolEntry:
    """A task of D_t with the first iteration whose D_t held it."""

    task: Task
    added_iteration: int


@dataclass(frozen=True)
class Refusal:
    """A task `add_tasks` did not admit: it duplicates `duplicate_of` (in the pool, or earlier in its batch)."""

    task: Task
    duplicate_of: str
    reason: str


@dataclass(frozen=True)
class AddResult:
    admitted: tuple[Task, ...]
    refused: tuple[Refusal, ...]


def _is_rate(value: object) -> bool:
    return isinstance(value, (int, float)) and 0.0 <= value <= 1.0  # NaN fails both comparisons


def _check_weight(weight: float, what: str) -> None:
    if not (isinstance(weight, (int, float)) and math.isfinite(weight) and weight >= 0):
        raise ValueError(f"{what} must be a finite non-negative number, got {weight!r}")


# ---------------------------------------------------------------------------------------------------------------
# The pool
# ---------------------------------------------------------------------------------------------------------------


class TaskPool:
    """D_t for every t, in one SQLite file. Use as a context manager, or call `close()`."""

    def __init__(self, path: str | Path, *, create: bool = True) -> None:
        self.path = Path(path)
        if not create and not self.path.is_file():
            raise PoolError(f"no task pool at {self.path}")
        self._db = sqlite3.connect(self.path, isolation_level=None, timeout=30.0)  # autocommit; we BEGIN ourselves
        try:
            self._db.execute("PRAGMA foreign_keys = ON")
            self._db.execute("PRAGMA synchronous = FULL")  # a returned commit survives a crash of the machine too
            self._db.execute("PRAGMA cache_size = -65536")  # 64 MiB (default 2): history of 100k+ tasks stays hot
            self._open_schema(create)
        except BaseException:
            self._db.close()
            raise

    def _open_schema(self, create: bool) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version == SCHEMA_VERSION:
            self._db.execute("PRAGMA journal_mode = WAL")  # only once we know the file is ours: it rewrites it
            return
        has_tables = self._db.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0]
        if version == 0 and not has_tables and create:
            self._db.execute("PRAGMA journal_mode = WAL")
            with self._write():
                if self._db.execute("PRAGMA user_version").fetchone()[0] == 0:  # not created meanwhile by another
                    for statement in filter(str.strip, _SCHEMA.split(";")):
                        self._db.execute(statement)
                    self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            return
        if version == 0:
            raise PoolError(f"{self.path} is not a coevolve task pool")
        raise PoolError(f"{self.path} has pool schema version {version}; this code reads version {SCHEMA_VERSION}")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> "TaskPool":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One transaction: BEGIN IMMEDIATE takes the write lock up front, so readers never see half a batch."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # --- versions of D_t ----------------------------------------------------------------------------------------

    def iterations(self) -> list[int]:
        return [row[0] for row in self._db.execute("SELECT iteration FROM iterations ORDER BY iteration")]

    def latest_iteration(self) -> int | None:
        return self._db.execute("SELECT max(iteration) FROM iterations").fetchone()[0]

    def start_iteration(self, iteration: int) -> None:
        """Open D_iteration as a copy of the latest earlier version; a no-op if it is already the latest."""
        with self._write():
            self._start(iteration)

    def _start(self, iteration: int) -> None:
        if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
            raise ValueError(f"iteration must be a non-negative int, got {iteration!r}")
        latest = self.latest_iteration()
        if latest is not None and iteration < latest:
            raise ValueError(f"D_{iteration} is frozen: iteration {latest} has started")
        if latest == iteration:
            return
        self._db.execute("INSERT INTO iterations (iteration, base_iteration) VALUES (?, ?)", (iteration, latest))
        if latest is not None:
            self._db.execute(
                "INSERT INTO membership (iteration, task_id) SELECT ?, task_id FROM membership WHERE iteration = ?",
                (iteration, latest),
            )

    def add_tasks(self, tasks: Iterable[Task], iteration: int) -> AddResult:
        """Admit tasks into D_iteration (and every later version) in one transaction; duplicates are refused."""
        tasks = list(tasks)
        for task in tasks:
            _check_task(task)
        admitted: list[Task] = []
        refused: list[Refusal] = []
        with self._write() as db:
            self._start(iteration)
            batch: dict[str, str] = {}  # dedup key -> id, within this call
            for task in tasks:
                key = dedup_key(task)
                if key in batch:
                    refused.append(Refusal(task, batch[key], f"duplicate of task {batch[key]} earlier in the same "
                                                             "batch: same normalised query and solution"))
                    continue
                row = db.execute("SELECT id, name FROM tasks WHERE dedup_key = ?", (key,)).fetchone()
                if row is not None:
                    refused.append(Refusal(task, row[0], (
                        f"duplicate of task {row[0]} ({row[1]}): same normalised query and solution")))
                    continue
                batch[key] = task.id
                self._insert(task, key, iteration)
                admitted.append(task)
        return AddResult(tuple(admitted), tuple(refused))

    def _insert(self, task: Task, key: str, iteration: int) -> None:
        p = task.provenance
        self._db.execute(
            "INSERT INTO tasks (id, name, env, payload, source, parent_id, signal, episode_id, provenance_iteration,"
            " verdict, added_iteration, dedup_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (task.id, task.name, task.env, task.to_json(), p.source, p.parent_id, p.signal, p.episode_id,
             p.iteration, p.verdict, iteration, key),
        )
        self._db.execute("INSERT INTO membership (iteration, task_id) VALUES (?, ?)", (iteration, task.id))

    # --- reading D_t --------------------------------------------------------------------------------------------

    def get(self, task_id: str) -> Task | None:
        row = self._db.execute("SELECT payload FROM tasks WHERE id = ?", (task_id,)).fetchone()
        return Task.from_json(row[0]) if row else None

    def __len__(self) -> int:
        """Tasks ever admitted (the size of the latest D_t)."""
        return self._db.execute("SELECT count(*) FROM tasks").fetchone()[0]

    def entries_at(self, iteration: int | None = None, source: str | None = None) -> list[PoolEntry]:
        """D_iteration (default: the latest) in admission order, optionally one source only."""
        iteration = self._resolve(iteration)
        if iteration is None:
            return []
        if source is not None and source not in TASK_SOURCES:
            raise ValueError(f"unknown source {source!r}; expected one of {TASK_SOURCES}")
        rows = self._db.execute(
            "SELECT t.payload, t.added_iteration FROM membership m JOIN tasks t ON t.id = m.task_id"
            " WHERE m.iteration = ? AND (? IS NULL OR t.source = ?) ORDER BY t.seq",
            (iteration, source, source),
        )
        return [PoolEntry(Task.from_json(payload), added) for payload, added in rows]

    def tasks_at(self, iteration: int | None = None, source: str | None = None) -> list[Task]:
        return [entry.task for entry in self.entries_at(iteration, source)]

    def _resolve(self, iteration: int | None) -> int | None:
        if iteration is None:
            return self.latest_iteration()
        if self._db.execute("SELECT 1 FROM iterations WHERE iteration = ?", (iteration,)).fetchone() is None:
            known = self.iterations()
            span = f"{known[0]}..{known[-1]}" if known else "none"
            raise KeyError(f"the pool has no iteration {iteration} (iterations: {span})")
        return iteration

    # --- sampling -----------------------------------------------------------------------------------------------

    def _draw_rows(self, iteration: int) -> list[Row]:
        iteration = self._resolve(iteration)
        return self._db.execute(
            "SELECT t.id, t.source, t.parent_id, t.signal, json_extract(t.payload, '$.provenance.focus_tool')"
            " FROM membership m JOIN tasks t ON t.id = m.task_id"
            " WHERE m.iteration = ? ORDER BY t.id",  # a fixed order, so the seed alone decides the draw
            (iteration,),
        ).fetchall()

    def idle_weights(self, iteration: int, config: BatchMix) -> list[str]:
        """`signal_weights` kinds with no task of D_iteration to weigh (`idle_weights`)."""
        return idle_weights(self._draw_rows(iteration), config)

    def sample(
        self,
        iteration: int,
        count: int,
        rng_seed: int,
        config: BatchMix = BatchMix(),
        weights: Mapping[str, float] | None = None,
    ) -> list[Task]:
        """Draw up to `count` distinct tasks of D_iteration; the same arguments always give the same list.

        `weights` (task id -> weight, default 1) multiply the signal weights; weight 0 never draws a task. The
        result is shorter than `count` only when D_iteration has fewer drawable tasks under the caps.
        """
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"count must be a non-negative int, got {count!r}")
        rows = self._draw_rows(iteration)
        chosen_ids = draw(rows, count, random.Random(rng_seed), config, weights or {})
        payloads = dict(self._db.execute(
            "SELECT id, payload FROM tasks WHERE id IN (SELECT value FROM json_each(?))", (json.dumps(chosen_ids),)))
        return [Task.from_json(payloads[task_id]) for task_id in chosen_ids]

    # --- success history ------------------------------------------------------------------------------------------

    def record_success_rates(self, iteration: int, rates: Mapping[str, float]) -> None:
        """Store s_now of each task for `iteration` (one transaction; rerunning an iteration overwrites it)."""
        task_ids = sorted(rates)  # in key order the B-tree is written page after page instead of at random
        values = list(map(rates.__getitem__, task_ids))
        try:  # C-level checks over all values; sum() is NaN when any value is
            valid = not values or (min(values) >= 0.0 and max(values) <= 1.0 and not math.isnan(sum(values)))
        except TypeError:
            valid = False
        if not valid:
            task_id, rate = next((k, v) for k, v in zip(task_ids, values) if not _is_rate(v))
            raise ValueError(f"success rate of {task_id} must lie in [0, 1], got {rate!r}")
        with self._write() as db:
            try:
                db.executemany(
                    "INSERT INTO history (task_id, iteration, success_rate) VALUES (?, ?, ?)"
                    " ON CONFLICT (task_id, iteration) DO UPDATE SET success_rate = excluded.success_rate",
                    zip(task_ids, repeat(iteration), map(float, values)),
                )
            except sqlite3.IntegrityError as error:
                raise KeyError(f"success rates for tasks not in the pool: {error}") from error

    def history(self, task_id: str) -> list[float]:
        """The task's success rates, oldest iteration first."""
        return [row[0] for row in self._db.execute(
            "SELECT success_rate FROM history WHERE task_id = ? ORDER BY iteration", (task_id,))]

    def histories(
        self, task_ids: Iterable[str] | None = None, *, before: int | None = None, window: int | None = None
    ) -> dict[str, list[float]]:
        """Task id -> success rates (oldest first) of iterations < `before`, the last `window` of them at most.

        What `signals.extract_signals` takes as `history` for iteration t: `histories(before=t, window=W)`. With a
        window, each task costs one index seek and W rows, however many iterations the pool has seen.
        """
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 0):
            raise ValueError(f"window must be a non-negative int or None, got {window!r}")
        if window == 0:
            return {}
        parameters = {
            "ids": None if task_ids is None else json.dumps(list(task_ids)),
            "before": _NO_LIMIT if before is None else before,
            "window": _NO_LIMIT if window is None else window,
        }
        wanted = "tasks" if task_ids is None else "(SELECT DISTINCT value AS id FROM json_each(:ids))"
        rows = self._db.execute(
            f"SELECT wanted.id, h.success_rate FROM {wanted} AS wanted JOIN history h"
            "  ON h.task_id = wanted.id AND h.iteration < :before AND h.iteration >= coalesce(("
            "     SELECT earlier.iteration FROM history earlier"  # the oldest of the task's last `window` rows
            "     WHERE earlier.task_id = wanted.id AND earlier.iteration < :before"
            "     ORDER BY earlier.iteration DESC LIMIT 1 OFFSET :window - 1), -1)"
            " ORDER BY wanted.id, h.iteration",
            parameters,
        )
        return {task_id: list(map(itemgetter(1), group)) for task_id, group in groupby(rows, itemgetter(0))}

    def tries(self, *, before: int) -> dict[str, list[tuple[int, float]]]:
        """Task id -> its (iteration, success rate) pairs of iterations < `before`, oldest first: the curriculum's
        record of each task (`coevolve.curriculum`); tasks never tried are absent."""
        rows = self._db.execute("SELECT task_id, iteration, success_rate FROM history WHERE iteration < ?"
                                " ORDER BY task_id, iteration", (before,))
        return {task_id: [(iteration, rate) for _, iteration, rate in group]
                for task_id, group in groupby(rows, itemgetter(0))}

    def admissions(self, iteration: int, source: str | None = None) -> dict[str, int]:
        """Task id -> the first iteration whose D_t held it, for every task of D_iteration (one source, or all), in
        admission order; no payload is read."""
        iteration = self._resolve(iteration)
        if source is not None and source not in TASK_SOURCES:
            raise ValueError(f"unknown source {source!r}; expected one of {TASK_SOURCES}")
        return dict(self._db.execute(
            "SELECT t.id, t.added_iteration FROM membership m JOIN tasks t ON t.id = m.task_id"
            " WHERE m.iteration = ? AND (? IS NULL OR t.source = ?) ORDER BY t.seq", (iteration, source, source)))


def recently_solved(histories: Mapping[str, Sequence[float]], threshold: float, count: int,
                    rng: random.Random) -> list[str]:
    """Up to `count` ids of tasks whose history holds a success rate >= `threshold`, drawn without replacement by
    `rng` from the sorted ids (so the seed alone decides): the recurring part of an iteration's sample
    (`loop.recur_fraction`), which gives the forgetting signal a history to compare with."""
    solved = sorted(task_id for task_id, rates in histories.items() if any(rate >= threshold for rate in rates))
    return rng.sample(solved, min(max(count, 0), len(solved)))


def _check_task(task: Task) -> None:
    p = task.provenance
    if p.source not in TASK_SOURCES:
        raise ValueError(f"task {task.id}: unknown source {p.source!r}; expected one of {TASK_SOURCES}")
    if p.signal is not None and p.signal not in SIGNAL_KINDS:
        raise ValueError(f"task {task.id}: unknown signal {p.signal!r}; expected one of {SIGNAL_KINDS} or None")
    expected = Task.create(task.env, task.name, task.turns, task.initial_state, task.ground_truth, task.meta).id
    if task.id != expected:  # the id is a content hash: a mismatch means the record was edited or forged
        raise ValueError(f"task id {task.id} does not match its content (expected {expected})")


# ---------------------------------------------------------------------------------------------------------------
# The draw: a pure function of the candidate rows and the RNG
# ---------------------------------------------------------------------------------------------------------------


Row = tuple[str, str, str | None, str | None, str | None]
"""A draw candidate: (id, source, parent_id, signal, focus_tool)."""


def weight_kind(row: Row, config: BatchMix) -> str:
    """Which of `signal_weights`' kinds weighs a synthetic row: `unexplored` for a task made for a tool D_0 never
    calls (when that kind is weighed), else the signal of the context it came from (`random` for none)."""
    _, _, _, signal, focus_tool = row
    return UNEXPLORED if focus_tool and UNEXPLORED in config.signal_weights else signal or RANDOM_SIGNAL


def idle_weights(rows: Sequence[Row], config: BatchMix) -> list[str]:
    """The kinds `config.signal_weights` weighs (a weight other than 1) that no synthetic row carries: weights with
    nothing to act on in this draw."""
    present = {weight_kind(row, config) for row in rows if row[1] == "synthetic"}
    return sorted(kind for kind, weight in config.signal_weights.items() if weight != 1.0 and kind not in present)


def draw(
    rows: Sequence[Row],
    count: int,
    rng: random.Random,
    config: BatchMix,
    weights: Mapping[str, float],
) -> list[str]:
    """Pick up to `count` ids from (id, source, parent_id, signal, focus_tool) rows: weighted, without replacement,
    capped.

    Every row gets the key u^(1/w), u ~ U[0, 1) (Efraimidis & Spirakis 2006: taking keys in decreasing order is
    weighted sampling without replacement); rows are then taken in key order, skipping any that would break a cap.
    """
    keyed: dict[str, list[tuple[float, Row]]] = {"seed": [], "synthetic": []}
    for row in rows:
        task_id, source, _, signal, focus_tool = row
        weight = weights.get(task_id, 1.0)
        _check_weight(weight, f"weight of task {task_id}")
        if source == "synthetic":
            weight *= config.signal_weights.get(weight_kind(row, config), 1.0)
        u = rng.random()  # drawn for every row, weight 0 or not, so one task's weight never shifts another's key
        if weight > 0:
            # log(u^(1/w)) = log(u)/w: same order as u^(1/w), without underflow to 0 for small weights
            keyed[source].append((math.log(u) / weight if u > 0 else -math.inf, row))
    for candidates in keyed.values():
        candidates.sort(key=lambda item: item[0], reverse=True)

    if config.synthetic_fraction is None:
        queues = [sorted(keyed["seed"] + keyed["synthetic"], key=lambda item: item[0], reverse=True)]
        targets = [count]
    else:
        synthetic_target = round(count * config.synthetic_fraction)
        queues = [keyed["synthetic"], keyed["seed"]]
        targets = [synthetic_target, count - synthetic_target]

    chosen: list[str] = []
    taken: set[str] = set()
    per_parent: dict[str, int] = {}
    per_signal: dict[str, int] = {}

    def take(queue: list, limit: int) -> None:
        for _, (task_id, source, parent_id, signal, _focus) in queue:
            if limit <= 0:
                return
            if task_id in taken:
                continue
            if source == "synthetic":
                signal_key = signal or RANDOM_SIGNAL
                if parent_id is not None and config.max_per_parent is not None \
                        and per_parent.get(parent_id, 0) >= config.max_per_parent:
                    continue
                if config.max_per_signal is not None and per_signal.get(signal_key, 0) >= config.max_per_signal:
                    continue
                if parent_id is not None:
                    per_parent[parent_id] = per_parent.get(parent_id, 0) + 1
                per_signal[signal_key] = per_signal.get(signal_key, 0) + 1
            taken.add(task_id)
            chosen.append(task_id)
            limit -= 1

    for queue, target in zip(queues, targets):
        take(queue, target)
    for queue in queues:  # one source ran short: the other fills the batch, caps still holding
        take(queue, count - len(chosen))
    return chosen


def pool_path(directory: str | Path) -> Path:
    """Where a run directory keeps its pool."""
    return Path(directory) / POOL_FILENAME

