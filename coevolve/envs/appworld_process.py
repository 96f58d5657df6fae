"""The process boundary to AppWorld: its worker processes, their deadlines, and what a failure looks like.

`WorkerProcess` starts `appworld_worker.py` under AppWorld's own interpreter (`.venv-appworld`, see
`coevolve.envs.appworld`) and exchanges JSON lines with it. Every request has a deadline: a worker that misses it
is killed (a hung AppWorld cell, a stopped process), one that exits mid-request is reported with the tail of its
stderr, and either way the caller gets `WorkerFailed` with the reason while the process is gone, so the next
request starts a fresh one. A reply `{"ok": false}` is an ordinary error (`RuntimeError`), except missing data,
which is `AppWorldUnavailable`: nothing can run until the user fetches it.

`WorkerPool` reuses idle workers (their world closed) and caps how many run at once (`max_workers`; each holds
one open world, ~0.3 GB).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coevolve.envs.base import EnvFailed, EnvUnavailable

SPLITS = ("train", "dev", "test_normal", "test_challenge")
WORKER_SCRIPT = Path(__file__).with_name("appworld_worker.py")
DEFAULT_VENV = Path(".venv-appworld")


class AppWorldUnavailable(EnvUnavailable):
    """AppWorld cannot run here; the message says what to do."""


class WorkerFailed(EnvFailed):
    """A worker crashed, hung past its deadline or answered garbage; it has been killed."""


@dataclass(frozen=True)
class AppWorldConfig:
    split: str = "train"
    root: str | None = None
    """APPWORLD_ROOT (its `data/` holds the tasks); default: $APPWORLD_ROOT, else the current directory."""
    python: str | None = None
    """The AppWorld venv's interpreter; default: $COEVOLVE_APPWORLD_PYTHON, else .venv-appworld/bin/python."""
    limit: int | None = None
    """Use only the split's first `limit` tasks."""
    step_timeout_s: int = 30
    """AppWorld's own per-cell timeout; the client's deadline is this plus `grace_s`."""
    open_timeout_s: float = 180.0
    """Deadline for starting a worker and opening a world (imports and database loading)."""
    grace_s: float = 15.0
    max_output_chars: int = 4000
    max_workers: int = 16
    """Most AppWorld processes at once (one per open episode; about 0.3 GB each)."""
    dense_reward: bool = False

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"unknown AppWorld split {self.split!r}; choose one of {SPLITS}")
        if self.step_timeout_s < 1 or self.max_output_chars < 100 or self.max_workers < 1:
            raise ValueError(f"invalid AppWorld config: {self}")

    def interpreter(self) -> Path:
        chosen = self.python or os.environ.get("COEVOLVE_APPWORLD_PYTHON") or str(DEFAULT_VENV / "bin" / "python")
        return Path(chosen).expanduser().absolute()  # not resolve(): a venv's python is a symlink to the base one

    def data_root(self) -> Path:
        return Path(self.root or os.environ.get("APPWORLD_ROOT") or os.getcwd()).resolve()


def download_hint(root: Path, python: Path) -> str:
    return f"APPWORLD_ROOT={root} {python.parent / 'appworld'} download data"


# ---------------------------------------------------------------------------------------------------------------
# The process boundary
# ---------------------------------------------------------------------------------------------------------------


class WorkerProcess:
    """One AppWorld process; `request` returns the result or raises WorkerFailed (and kills it) / RuntimeError."""

    def __init__(self, config: AppWorldConfig) -> None:
        python = config.interpreter()
        if not python.exists():
            raise AppWorldUnavailable(f"AppWorld's virtualenv is missing ({python} not found): run "
                                      f"`make appworld-venv`, or point COEVOLVE_APPWORLD_PYTHON at its python")
        environment = {**os.environ, "APPWORLD_ROOT": str(config.data_root()), "PYTHONUNBUFFERED": "1"}
        # -I: the worker's folder must not lead sys.path, or `import appworld` would find coevolve/envs/appworld.py
        self.process = subprocess.Popen([str(python), "-I", str(WORKER_SCRIPT)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        env=environment, cwd=str(config.data_root()), bufsize=1)
        self._replies: queue.Queue[str | None] = queue.Queue()
        self._stderr_tail: list[str] = []
        threading.Thread(target=self._pump, args=(self.process.stdout, self._replies.put), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.process.stderr, self._keep_stderr), daemon=True).start()

    @staticmethod
    def _pump(stream: Any, sink: Any) -> None:
        for line in stream:
            sink(line)
        sink(None)

    def _keep_stderr(self, line: str | None) -> None:
        if line is not None:
            self._stderr_tail = (self._stderr_tail + [line.rstrip()])[-20:]

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def request(self, op: str, timeout_s: float, **arguments: Any) -> Any:
        if not self.alive:
            raise WorkerFailed(f"the AppWorld process had exited (code {self.process.returncode})")
        try:
            self.process.stdin.write(json.dumps({"op": op, **arguments}) + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError) as error:
            self.kill()
            raise WorkerFailed(f"the AppWorld process is gone ({error})") from None
        try:
            line = self._replies.get(timeout=timeout_s)
        except queue.Empty:
            self.kill()
            raise WorkerFailed(f"the AppWorld process did not answer `{op}` within {timeout_s:.0f} s; killed "
                               f"and replaced") from None
        if line is None:
            self.process.wait(timeout=5)
            tail = " | ".join(self._stderr_tail[-3:])
            raise WorkerFailed(f"the AppWorld process crashed during `{op}` (exit code {self.process.returncode})"
                               + (f": {tail[-300:]}" if tail else ""))
        try:
            reply = json.loads(line)
        except ValueError:
            self.kill()
            raise WorkerFailed(f"the AppWorld process answered `{op}` with a non-JSON line") from None
        if not reply.get("ok"):
            if reply.get("kind") == "missing_data":
                raise AppWorldUnavailable(reply["error"])
            raise RuntimeError(f"AppWorld `{op}` failed: {reply.get('error')}")
        return reply.get("result")

    def kill(self) -> None:
        if self.alive:
            self.process.kill()
            self.process.wait(timeout=10)

    def quit(self) -> None:
        try:
            self.request("quit", timeout_s=10)
        except (WorkerFailed, RuntimeError):
            pass
        self.kill()


class WorkerPool:
    """Idle workers are reused (their world closed); at most `max_workers` exist at once."""

    def __init__(self, config: AppWorldConfig) -> None:
        self.config = config
        self._idle: list[WorkerProcess] = []
        self._busy = 0
        self._lock = threading.Lock()

    def acquire(self) -> WorkerProcess:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.alive:
                    self._busy += 1
                    return worker
            if self._busy >= self.config.max_workers:
                raise RuntimeError(f"all {self.config.max_workers} AppWorld processes hold open episodes; score or "
                                   f"close episodes, or raise max_workers")
            self._busy += 1
        try:
            return WorkerProcess(self.config)
        except Exception:
            with self._lock:
                self._busy -= 1
            raise

    def release(self, worker: WorkerProcess) -> None:
        with self._lock:
            self._busy -= 1
            if worker.alive:
                self._idle.append(worker)

    def shutdown(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.quit()
