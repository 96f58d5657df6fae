"""JSON-lines files and atomic writes: one reader, one append-only writer, one atomic write for the whole package.

    log = JsonLines(run_dir / "steps.jsonl")
    log.extend(records)                          # one write and one fsync for a batch of lines
    records = log.read()                         # a torn last line (a killed write) is left out
    atomic_write_text(run_dir / "summary.json", text)   # the old file or the new one, never half of one

A crash loses nothing that was written: appends are flushed and fsynced; rewrites (`JsonLines.rewrite`,
`atomic_write_text`) go to a temporary file in the same folder and replace the old one with `os.replace`.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` atomically: a crash leaves the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, prefix=f".{path.name}.",
                                     suffix=".tmp") as handle:
        try:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        except BaseException:
            os.unlink(handle.name)  # nothing half-written is left behind
            raise
    try:
        os.replace(handle.name, path)
    except BaseException:  # e.g. `path` is a folder: the temporary file goes, the error stays the caller's
        os.unlink(handle.name)
        raise


def jsonl_rows(path: Any, strict: bool = True,
               on_bad: Callable[[int, str], None] | None = None) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) for every non-blank line of a JSON-lines file (a `Path` or a package resource).
    `strict`: a line that is not JSON raises ValueError "path:line: not valid JSON (why)"; else it is left out (the
    torn last line of a killed write), and `on_bad(line number, why)` hears of it."""
    text = path.read_text(encoding="utf-8", errors="replace") if hasattr(path, "read_text") else Path(path).read_text()
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except (ValueError, RecursionError) as error:  # nested past the parser's depth, a 5,000-digit number: bad too
            why = (f"not valid JSON ({error.msg})" if isinstance(error, json.JSONDecodeError) else "nested too deep"
                   if isinstance(error, RecursionError) else "a number past Python's digit limit")
            if strict:
                raise ValueError(f"{path}:{number}: {why}") from None
            if on_bad is not None:
                on_bad(number, why)
            continue
        yield number, value


def read_jsonl(path: Path, skip_bad: bool = True) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file, in order ([] when it does not exist). A line that is not a JSON object
    (a torn last line after a kill) is left out when `skip_bad`, else it raises ValueError naming path:line."""
    if not Path(path).exists():
        return []
    records = []
    for number, record in jsonl_rows(Path(path), strict=not skip_bad):
        if isinstance(record, dict):
            records.append(record)
        elif not skip_bad:
            raise ValueError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
    return records


def jsonl_text(records: Iterable[dict[str, Any]]) -> str:
    return "".join(json.dumps(record, sort_keys=True) + "\n" for record in records)


class JsonLines:
    """An append-only JSON-lines file, flushed and fsynced per write. On resume, lines from steps after the
    checkpoint (trained, then lost with the kill) are dropped, atomically."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def append(self, record: dict[str, Any]) -> None:
        self.extend([record])

    def extend(self, records: Sequence[dict[str, Any]]) -> None:
        """Append records with one write and one fsync (a step's trajectories go in together)."""
        with self.path.open("a") as handle:
            handle.write(jsonl_text(records))
            handle.flush()
            os.fsync(handle.fileno())

    def read(self) -> list[dict[str, Any]]:
        return read_jsonl(self.path)

    def truncate_after(self, step: int) -> None:
        self.rewrite(lambda record: record.get("step", 0) <= step)

    def rewrite(self, keep: Callable[[dict[str, Any]], bool]) -> None:
        """Keep only the records `keep` accepts, atomically (a kill leaves the old file or the new one)."""
        if self.path.exists():
            atomic_write_text(self.path, jsonl_text(r for r in self.read() if keep(r)))
