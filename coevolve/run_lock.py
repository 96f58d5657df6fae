"""One writer per run directory: the process that trains a run holds `DIR/run.lock` until it ends.

Two `coevolve train` processes on one directory (the same command started twice, a run and a `--resume` of it at
once, `make quickstart` twice) would both append to metrics.jsonl, steps.jsonl and rollouts.jsonl and both write the
pool. So the run takes an exclusive advisory lock (`fcntl.flock`) on `run.lock` before it writes anything and keeps
it to the end; a second writer is refused at once, with the holder named (pid, host, since when, its command).

A lock cannot go stale: the kernel releases an flock when its holder dies, kill -9 included. The file stays with the
dead holder's line; the next run takes the lock and writes its own line (a takeover, said in run.log's first lines
through the returned `previous`). With several processes (torchrun), the main one holds the lock for all of them.
Where `fcntl` does not exist (not POSIX) the run goes on unlocked, with a warning.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import warnings
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from coevolve.config import ConfigError

LOCK_FILE = "run.lock"


class RunDirectoryBusy(ConfigError):
    """Another live process writes this run directory (the message names it)."""


class RunLock:
    """`with RunLock(directory): ...` holds the directory's lock (see the module docstring); `enabled=False` (a
    non-main process) holds nothing."""

    def __init__(self, directory: Path, enabled: bool = True) -> None:
        self.path = Path(directory) / LOCK_FILE
        self.enabled = enabled
        self.previous: dict[str, Any] | None = None
        """The holder line a takeover found (a run that died without releasing), or None."""
        self._handle: IO[str] | None = None

    def __enter__(self) -> "RunLock":
        if not self.enabled:
            return self
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            warnings.warn("no fcntl here: the run directory is not locked against a second writer", RuntimeWarning,
                          stacklevel=2)
            return self
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(self.path, "a+", encoding="utf-8")  # never truncated before we hold it: the holder's line
        except OSError as error:  # e.g. a folder under /proc, a full or read-only disk
            raise ConfigError(f"--output-dir {self.path.parent}: cannot be written ({error.strerror or error}); "
                              "name a folder you can write") from None
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(handle)
            handle.close()
            raise RunDirectoryBusy(f"{self.path.parent} is being written by another run ({_describe(holder)}); "
                                   "wait for it to end or stop it, or pick another --output-dir") from None
        self.previous = _read_holder(handle) or None
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "since": time.strftime("%Y-%m-%d %H:%M:%S"),
                                 "command": " ".join(sys.argv)[:300]}) + "\n")
        handle.flush()
        self._handle = handle
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._handle is not None:
            import fcntl

            fcntl.flock(self._handle.fileno(), fcntl.LOCK_UN)  # the line stays: who wrote the run last
            self._handle.close()
            self._handle = None


def _read_holder(handle: IO[str]) -> dict[str, Any]:
    handle.seek(0)
    try:
        holder = json.loads(handle.read(4096) or "{}")
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "holder unknown"
    return (f"pid {holder.get('pid')} on {holder.get('host')} since {holder.get('since')}: "
            f"{str(holder.get('command', ''))[:120]}")
