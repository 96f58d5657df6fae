"""`coevolve pool DIR [--json] [--iteration T] [--source seed|synthetic]`: print D_t with its provenance.

DIR is a run directory holding `pool.sqlite` (see pool.py). Without `--json` a table (rich) lists id, name, source,
signal, parent, iteration and verdict of every task of D_T; with `--json` one JSON object
`{"iteration": T, "tasks": [...]}` goes to stdout. T defaults to the latest iteration. Errors (no such
directory, no pool, an unknown iteration, an unreadable file) are one line on stderr and exit status 2.
Task fields are data, never markup: names and verdicts are printed as plain text.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

from coevolve.pool import POOL_FILENAME, PoolEntry, PoolError, TaskPool, pool_path
from coevolve.records import TASK_SOURCES

EXIT_USAGE = 2


def add_pool_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "pool",
        help="list the task pool D_t of a run with provenance",
        description=f"List D_t (the training task pool) stored in DIR/{POOL_FILENAME}, with each task's provenance.",
    )
    parser.add_argument("directory", metavar="DIR", help=f"run directory that holds {POOL_FILENAME}")
    parser.add_argument("--json", action="store_true", help='print one JSON object {"iteration": T, "tasks": [...]}')
    parser.add_argument("--iteration", type=int, metavar="T", default=None, help="which D_t (default: the latest)")
    parser.add_argument("--source", choices=TASK_SOURCES, default=None, help="only seed or only synthetic tasks")
    parser.add_argument("--export", metavar="FILE", default=None,
                        help="write the tasks as JSON lines (what `coevolve eval --tasks FILE` and env.tasks_file read)")
    return parser


def run_pool(args: argparse.Namespace) -> int:
    path = pool_path(args.directory)
    if not path.parent.is_dir():
        return _fail(f"no such directory: {args.directory}")
    if not path.is_file():
        return _fail(f"no {POOL_FILENAME} in {args.directory}")
    refused = export_refusal(args.export, path) if args.export else None
    if refused:
        return _fail(refused)
    try:
        with TaskPool(path, create=False) as pool:
            iteration = args.iteration if args.iteration is not None else pool.latest_iteration()
            entries = pool.entries_at(iteration, args.source) if iteration is not None else []
    except KeyError as error:  # an iteration the pool does not have
        return _fail(str(error.args[0]))
    except (PoolError, sqlite3.Error, ValueError) as error:
        return _fail(f"cannot read {path}: {error}")
    rows = [entry_row(entry) for entry in entries]
    if args.export:
        from coevolve.jsonl import atomic_write_text, jsonl_text

        try:
            atomic_write_text(Path(args.export), jsonl_text(entry.task.to_dict() for entry in entries))
        except OSError as error:
            return _fail(f"cannot write {args.export}: {error.strerror or error}")
        print(f"{len(entries)} tasks of D_{iteration} written to {args.export}", file=sys.stderr)
    if args.json:
        print(json.dumps({"iteration": iteration, "tasks": rows}, ensure_ascii=False))
    else:
        _print_table(iteration, rows)
    return 0


def export_refusal(export: str, pool_file: Path) -> str | None:
    """Why `--export FILE` must not be written, or None. An export never writes inside a run directory, neither
    the one it reads nor any other (a folder holding a pool, at any depth above the file): a run directory's
    files, its checkpoints' and its final model's are what `eval`, `--resume` and `report` read, and an export
    over `final/config.json` or a checkpoint's config broke them."""
    target = Path(export).resolve()
    if target.is_dir():
        return f"--export {export} is a directory; name a file"
    run_dir = pool_file.parent.resolve()
    for folder in target.parents:
        if folder == run_dir or (folder / POOL_FILENAME).exists():
            return (f"--export {export} is inside the run directory {folder}: an export never writes where a run "
                    "keeps its record, checkpoints and model; name a file outside it")
    return None


def entry_row(entry: PoolEntry) -> dict[str, Any]:
    """One task of D_t as a flat JSON-ready dict."""
    task, provenance = entry.task, entry.task.provenance
    return {
        "id": task.id,
        "name": task.name,
        "env": task.env,
        "source": provenance.source,
        "signal": provenance.signal,
        "parent": provenance.parent_id,
        "episode": provenance.episode_id,
        "iteration": provenance.iteration,
        "verdict": provenance.verdict,
        "added_iteration": entry.added_iteration,
    }


def _print_table(iteration: int | None, rows: list[dict[str, Any]]) -> None:
    from rich.console import Console  # imported here: only the table needs it
    from rich.table import Table
    from rich.text import Text

    synthetic = sum(1 for row in rows if row["source"] == "synthetic")
    title = "the pool has no iteration yet" if iteration is None else (
        f"D_{iteration}: {len(rows)} tasks ({len(rows) - synthetic} seed, {synthetic} synthetic)")
    table = Table(title=title, title_justify="left")
    for column in ("id", "name", "source", "signal", "parent", "iteration", "verdict"):
        table.add_column(column, no_wrap=column in ("id", "parent"), overflow="fold")
    for row in rows:
        # Text(...) rather than str: a task name like "[bold]x" is data, not rich markup.
        table.add_row(*(Text("-" if row[key] is None else str(row[key])) for key in (
            "id", "name", "source", "signal", "parent", "iteration", "verdict")))
    # Piped output gets wide rows instead of rich's 80-column default, so ids are never cut.
    console = Console(width=None if sys.stdout.isatty() else 200)
    console.print(table)


def _fail(message: str) -> int:
    print(f"coevolve pool: {message}", file=sys.stderr)
    return EXIT_USAGE
