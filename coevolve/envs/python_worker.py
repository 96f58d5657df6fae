"""Your tools run in a worker process, each call under a deadline: a user's tool cannot end, hang or kill the run.

A tool is the user's code, and the agent chooses which one runs with which arguments. In the run's own process a
tool that calls `sys.exit(0)` or `os._exit(0)` would end the whole run with exit 0 and no word, one that sleeps or
loops forever would hang evaluation, `env check` and training whatever the time budgets say, and one that raises
KeyboardInterrupt would look like the user's Ctrl-C. So the instances of the class live in one child process
(`ToolWorker`: a fresh interpreter, `python -m coevolve.envs.python_worker`, that imports the class by name; no
thread or lock of the parent comes along, and unlike multiprocessing's `spawn` it never re-runs the caller's main
script) and every request to it (constructor and `reset`, a call, the state, the reward) waits at most
`call_timeout_s`:

    an answer in time        the observation (or the tool's exception, as any tool error)
    SystemExit / KeyboardInterrupt raised by a tool
                             an error observation naming it (the worker catches them; it is not ending)
    no answer in time        the worker is killed and a fresh one started; the call's observation says why
    the worker died          (os._exit, a crash in C code, the OOM killer) a fresh one is started likewise

After a restart, the instances the dead worker held are gone: their episodes answer every later call with an
error and score 0 with a failed `process` check, so the rollout counts as an environment failure and
`rollout.max_consecutive_failures` stops a run whose tools keep dying. What a tool prints goes to stderr (stdout
may be a `--json` answer). A class that a child cannot import by name (defined inside a function, or in the
`__main__` script) is refused when the env is made, unless `PythonEnv(isolate=False)` asks for the caller's process
(no deadline there: a tool that exits ends the run).
"""

from __future__ import annotations

import importlib
import itertools
import json
import os
import pickle
import subprocess
import sys
import weakref
from multiprocessing.connection import Connection
from typing import Any, Callable, Mapping

from coevolve.envs.base import EnvFailed
from coevolve.records import ToolCall

DEFAULT_CALL_TIMEOUT_S = 10.0
"""How long one request to the tools' worker may take (`env.options.call_timeout_s` for env `python`)."""
START_TIMEOUT_S = 60.0
"""How long a fresh worker may take to import the class."""


class WorkerLost(EnvFailed):
    """The worker did not answer in time, or died: the message says which; the worker was restarted."""


class ClassRaised(RuntimeError):
    """The class raised in the worker outside a tool call (constructor, `reset`, `state`, the reward)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind, self.message = kind, message


def _serve(connection: Any, cls: type, make_instance: Callable[..., Any]) -> None:
    """The worker's loop: requests (operation, key, payload) -> replies ("ok", value) or ("error", text)."""
    instances: dict[int, Any] = {}
    connection.send(("ok", "ready"))
    while True:
        try:
            operation, key, payload = connection.recv()
        except (EOFError, OSError):
            return  # the parent went away
        if operation == "drop":
            dropped = instances.pop(key, None)
            close = getattr(dropped, "close", None)
            if callable(close):  # an MCP session: its server ends with it
                try:
                    close()
                except Exception:  # noqa: BLE001 - closing a broken session is no failure of the next request
                    pass
            continue  # no reply: drops are sent ahead of the next request
        try:
            if operation == "new":
                instances[key] = make_instance(cls, payload, catch_exits=True)
                reply = ("ok", instances[key].opening)
            elif operation == "call":
                reply = ("ok", instances[key].run(payload))
            elif operation == "state":
                reply = ("ok", instances[key].state())
            elif operation == "reward":
                reply = ("ok", instances[key].reward())
            else:
                reply = ("error", ("ValueError", f"unknown request {operation!r}"))
        except BaseException as error:  # noqa: BLE001 - the class raised (or tried to exit) outside a tool call
            reply = ("error", (type(error).__name__, str(error)[:300]))
        try:
            connection.send(reply)
        except (pickle.PicklingError, TypeError, AttributeError) as error:
            connection.send(("error", (type(error).__name__, f"the answer cannot leave the worker ({error})")))


class ToolWorker:
    """One child process holding the instances of one class; `ask` sends a request and waits for its answer."""

    def __init__(self, cls: type, make_instance: Callable[..., Any], call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
                 label: str = "tools' worker") -> None:
        if not call_timeout_s > 0:
            raise ValueError(f"call_timeout_s must be > 0, got {call_timeout_s!r}")
        self.cls, self.make_instance, self.call_timeout_s = cls, make_instance, call_timeout_s
        self.label = label
        self.generation = 0
        """Counts the workers lost: an instance made before the last loss is gone."""
        self._keys = itertools.count()
        self._process: Any = None
        self._connection: Any = None
        self._drops: list[int] = []

    def new_key(self) -> int:
        return next(self._keys)

    def drop(self, key: int, generation: int) -> None:
        """Forget an instance (its episode is gone); sent with the next request."""
        if generation == self.generation:
            self._drops.append(key)

    def ask(self, operation: str, key: int, payload: Any = None, generation: int | None = None,
            timeout: float | None = None) -> Any:
        """The answer to one request, within `timeout` (`call_timeout_s` unless given); raises WorkerLost (and
        restarts the worker) when none comes, and ClassRaised when the class raised."""
        if generation is not None and generation != self.generation:
            raise WorkerLost(f"this episode's instance was lost when the {self.label} restarted")
        limit = self.call_timeout_s if timeout is None else timeout
        self._ensure_started()
        try:
            for dropped in self._drops:
                self._connection.send(("drop", dropped, None))
            self._drops.clear()
            self._connection.send((operation, key, payload))
        except (OSError, ValueError) as error:  # the worker died since the last answer
            self._restart()
            raise WorkerLost(f"the {self.label} had died ({error}); a fresh one was started") from None
        if not self._connection.poll(limit):
            reason = (f"no answer within {limit:g} s (a tool that sleeps or loops?); the {self.label} "
                      "was restarted" if self._process.poll() is None else self._death())
            self._restart()
            raise WorkerLost(reason)
        try:
            status, value = self._connection.recv()
        except (EOFError, OSError):
            reason = self._death()
            self._restart()
            raise WorkerLost(reason) from None
        if status != "ok":
            raise ClassRaised(*value)
        return value

    def _death(self) -> str:
        try:
            code = self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        return (f"the {self.label} process ended (exit code {code}: a tool called sys.exit or os._exit, or "
                "crashed); a fresh one was started")

    def _ensure_started(self) -> None:
        if self._process is not None and self._process.poll() is None:
            return
        if self._process is not None:  # it died between two requests
            self._restart()
        to_child, from_parent = os.pipe()
        to_parent, from_child = os.pipe()
        spec = json.dumps({"path": sys.path, "cls": _name_of(self.cls), "factory": _name_of(self.make_instance),
                           "fds": [to_child, from_child], "parent": os.getpid()})
        stderr = sys.__stderr__.fileno() if sys.__stderr__ is not None else subprocess.DEVNULL
        # -P: the working directory never leads sys.path, so a `pickle.py` or `json.py` lying there is never what
        # the worker imports; the caller's path follows the standard library's (`_main`).
        self._process = subprocess.Popen([sys.executable, "-P", "-m", "coevolve.envs.python_worker", spec],
                                         pass_fds=(to_child, from_child), stdin=subprocess.DEVNULL, stdout=stderr,
                                         close_fds=True)
        os.close(to_child)
        os.close(from_child)
        self._connection = _Pipe(Connection(to_parent, writable=False), Connection(from_parent, readable=False))
        if not self._connection.poll(START_TIMEOUT_S):
            self.close()
            raise WorkerLost(f"the {self.label} did not start within {START_TIMEOUT_S:g} s")
        try:
            self._connection.recv()
        except (EOFError, OSError):
            self.close()
            raise WorkerLost(f"the {self.label} could not import its code (it exited at start)") from None

    def restart(self) -> None:
        """Give up the worker and every instance in it (a fresh one starts at the next request)."""
        self._restart()

    def _restart(self) -> None:
        """The worker is lost with every instance in it: later requests for them say so (`generation`)."""
        self.generation += 1
        self.close()
        self._drops.clear()

    def close(self) -> None:
        if self._process is not None:
            if self._process.poll() is None:
                self._process.kill()
            self._process.wait(timeout=10)
        if self._connection is not None:
            self._connection.close()
        self._process = self._connection = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit anything may be gone already
            pass


class _Pipe:
    """Two one-way connections (the child's stdin/stdout stay free) with the face of a duplex one."""

    def __init__(self, reader: Connection, writer: Connection) -> None:
        self.reader, self.writer = reader, writer

    def send(self, value: Any) -> None:
        self.writer.send(value)

    def recv(self) -> Any:
        return self.reader.recv()

    def poll(self, timeout: float) -> bool:
        return self.reader.poll(timeout)

    def close(self) -> None:
        self.reader.close()
        self.writer.close()


def _name_of(thing: Any) -> list[str]:
    return [thing.__module__, thing.__qualname__]


def _resolve(name: list[str]) -> Any:
    module, qualname = name
    value: Any = importlib.import_module(module)
    for part in qualname.split("."):
        value = getattr(value, part)
    return value


def can_isolate(cls: type) -> bool:
    """Whether a fresh interpreter can import the class by its module and qualified name."""
    module, qualname = getattr(cls, "__module__", ""), getattr(cls, "__qualname__", "<locals>")
    if module == "__main__" or "<locals>" in qualname:
        return False
    try:
        return _resolve([module, qualname]) is cls
    except (ImportError, AttributeError):
        return False


class RemoteInstance:
    """An instance living in the tools' worker: the same face as the env's in-process instance, every request under its deadline.
    Once its worker is lost (`lost`), every call answers with why, and the episode fails as the env's doing."""

    def __init__(self, worker: ToolWorker, reset: Mapping[str, Any]) -> None:
        self.worker, self.key, self.generation = worker, worker.new_key(), worker.generation
        self.lost: str | None = None
        self.opening = ""
        try:
            self.opening = worker.ask("new", self.key, dict(reset), self.generation)
        except WorkerLost as error:
            self.lost = str(error)
        except ClassRaised as error:
            self.lost = f"the class raised {error.kind} before any call: {error.message}"
        weakref.finalize(self, worker.drop, self.key, self.generation)

    def _ask(self, operation: str, payload: Any = None) -> Any:
        try:
            return self.worker.ask(operation, self.key, payload, self.generation)
        except WorkerLost as error:
            self.lost = str(error)
            raise

    def run(self, call: ToolCall) -> tuple[str, str | None]:
        if self.lost:
            reason = f"this episode's instance is gone: {self.lost}"
            return f"Error: {reason}", reason
        try:
            return tuple(self._ask("call", call))  # type: ignore[return-value]
        except WorkerLost as error:
            return f"Error: {call.name}: {error}", f"{call.name}: {error}"

    def state(self) -> dict[str, Any]:
        if self.lost:
            return {}
        try:
            return self._ask("state")
        except (WorkerLost, ClassRaised) as error:
            self.lost = self.lost or f"state() could not be read ({error})"
            return {}

    def reward(self) -> Any:
        if self.lost:
            raise WorkerLost(self.lost)
        return self._ask("reward")


class BrokenInstance:
    """An instance that could not be made: every call and the score say why."""

    def __init__(self, reason: str) -> None:
        self.lost, self.opening = reason, ""

    def run(self, call: ToolCall) -> tuple[str, str | None]:
        return f"Error: {self.lost}", self.lost

    def state(self) -> dict[str, Any]:
        return {}

    def reward(self) -> Any:
        raise WorkerLost(self.lost)


def _watch_parent(parent: int) -> None:
    """End the worker once its parent is gone (killed, crashed), even while a tool blocks the worker: nothing the
    run started outlives it. A daemon thread, polling once a second."""
    import threading
    import time

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="coevolve-parent-watch", daemon=True).start()


def _main(spec_text: str) -> None:
    """The worker's entry: `python -m coevolve.envs.python_worker SPEC` (SPEC: JSON with the parent's sys.path,
    the class and the instance factory by name, and the two pipe ends)."""
    spec = json.loads(spec_text)
    _watch_parent(spec["parent"])
    # The standard library and the installed packages first (what -P started with), then the caller's entries:
    # a module lying beside the user's code (a planted `pickle.py`) never shadows the real one.
    sys.path[:] = [*sys.path, *(entry for entry in spec["path"] if entry not in sys.path)]
    reading, writing = spec["fds"]
    connection = _Pipe(Connection(reading, writable=False), Connection(writing, readable=False))
    try:
        cls, factory = _resolve(spec["cls"]), _resolve(spec["factory"])
    except BaseException as error:  # noqa: BLE001 - the parent hears of it as a worker that exited at start
        print(f"coevolve tools' worker: cannot import {spec['cls']}: {error}", file=sys.stderr)
        raise SystemExit(3) from None
    _serve(connection, cls, factory)


if __name__ == "__main__":
    _main(sys.argv[1])
