"""In-process MCP servers run in a worker process: a server's tool cannot end, hang or kill the run.

An in-process server (`env.options.server: package.module:ATTR`) is the user's code, and the agent chooses which
of its tools runs with which arguments. In the run's own process a tool that calls `sys.exit(0)` ended the whole
run with exit 0 and no word, `os._exit(7)` ended it with 7, and an `async def` tool that blocks in plain code
(`time.sleep(600)`) stalled the one event loop every session shares, so evaluation hung with no output. So the
sessions live where env `python`'s tools live: in one child process per env (`coevolve.envs.python_worker`'s
`ToolWorker`: a fresh interpreter that imports this module by name, never the caller's main script, and nothing
from the working directory before the standard library), on that process's own event loop
(`coevolve.envs.mcp_bridge`), every request under a deadline:

    a result in time          the observation (a tool error or a protocol error as an observation with its text)
    a session that died       (the server's transport broke) that episode's later calls say why
    no answer in time         the worker's own deadline (`call_timeout_s`) gives that session up; when the loop
                              itself no longer runs (a tool blocking it), the worker is killed and a fresh one
                              started: every session it held is lost, and their episodes say so
    the worker died           (`sys.exit` or `os._exit` in a tool or factory, a crash in C code) likewise
    a factory                 one deadline (`start_timeout_s`, 30 s) covers its call and the handshake

An episode whose session is lost scores 0 with a failed `process` check, so the rollout counts an environment
failure and `rollout.max_consecutive_failures` stops a run whose server keeps failing. What the server's code
logs reaches the parent's `mcp` logger with the answer (a run writes it to run.log); what it prints goes to
stderr. A server given as an object (not a `package.module:ATTR` name a child can import) runs in the caller's
process, said once as a warning; so does everything with `env.options.isolate: false`.
"""

from __future__ import annotations

import logging
import time
import weakref
from typing import Any, Mapping

from coevolve.envs.mcp_bridge import (START_TIMEOUT_S, ServerSource, Session, SessionLost, Slots, describe,
                                      route_logs)
from coevolve.envs.python_worker import ClassRaised, ToolWorker, WorkerLost

log = logging.getLogger("mcp.coevolve")
MAX_LOG_LINES = 200
"""Log lines one answer carries back at most (the rest are counted)."""
MARGIN_S = 5.0
"""How much longer the parent waits than the worker's own deadline: the worker answers first when it can."""


# --------------------------------------------------------------------------------------------------------------
# In the worker
# --------------------------------------------------------------------------------------------------------------


class _Lines(logging.Handler):
    """The `mcp` logger's records in the worker, kept for the next answer."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self.dropped = 0

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.lines) < MAX_LOG_LINES:
            self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}"[:2000])
        else:
            self.dropped += 1

    def take(self) -> list[str]:
        lines, self.lines = self.lines, []
        if self.dropped:
            lines.append(f"({self.dropped} more log lines dropped)")
            self.dropped = 0
        return lines


_SOURCES: dict[str, ServerSource] = {}
_SLOTS: dict[str, Slots] = {}
_LOG: _Lines | None = None


def _logs() -> _Lines:
    global _LOG
    if _LOG is None:
        route_logs()
        _LOG = _Lines()
        logging.getLogger("mcp").addHandler(_LOG)
    return _LOG


class MCPHost:
    """One session in the worker. `opening`: None, or ("lost" | "stuck", why) when it could not start; `run`
    answers (status, value, log lines): status "ok", "lost" (this session is gone) or "stuck" (the worker's event
    loop no longer runs: the parent must restart the worker)."""

    def __init__(self, server: str, reset: Mapping[str, Any], call_timeout_s: float, max_sessions: int,
                 start_timeout_s: float = START_TIMEOUT_S) -> None:
        _logs()
        self.session: Session | None = None
        self.opening: tuple[str, str] | None = None
        started = time.monotonic()
        try:
            if server not in _SOURCES:
                _SOURCES[server], _SLOTS[server] = ServerSource(server), Slots(max_sessions)
            source = _SOURCES[server]
            self.session = Session(source.connect(reset, start_timeout_s), _SLOTS[server], call_timeout_s,
                                   start_timeout_s, started_at=started)
        except SessionLost as error:
            # A factory still running holds a thread of this worker: the parent restarts it.
            self.opening = ("stuck" if error.holds_thread else "lost", str(error))
        except Exception as error:  # noqa: BLE001 - e.g. the module no longer imports: the episode says why
            self.opening = ("lost", f"the MCP server could not be made: {describe(error)}")

    def run(self, request: tuple) -> tuple[str, Any, list[str]]:
        if self.session is None:
            return "lost", (self.opening or ("lost", "no session"))[1], _logs().take()
        try:
            if request[0] == "list":
                value: Any = self.session.list_tools()
            elif request[0] == "call":
                _, name, arguments, max_chars = request
                value = self.session.call(name, arguments, max_chars)
            else:
                raise ValueError(f"unknown MCP request {request[0]!r}")
        except SessionLost as error:
            status = "lost" if self.session.responsive() else "stuck"
            return status, str(error), _logs().take()
        return "ok", value, _logs().take()

    def close(self) -> None:
        if self.session is not None:
            self.session.close()


def host_session(cls: type, payload: Mapping[str, Any], catch_exits: bool = False) -> MCPHost:
    """The worker's way to make an instance (`python_worker`'s `new` request): a session on a fresh server."""
    return cls(payload["server"], payload["reset"], payload["call_timeout_s"], payload["max_sessions"],
               payload["start_timeout_s"])


# --------------------------------------------------------------------------------------------------------------
# In the caller
# --------------------------------------------------------------------------------------------------------------


def mcp_worker(call_timeout_s: float) -> ToolWorker:
    """The worker process of one MCP env (started at its first request)."""
    return ToolWorker(MCPHost, host_session, call_timeout_s, label="MCP server's worker")


class WorkerSession:
    """A session in the worker, with `Session`'s face as `MCPEnv` uses it: `list_tools`, `call`, `lose`, `close`,
    `lost`. Raises `SessionLost` with why once its session, or the worker holding it, is gone."""

    def __init__(self, worker: ToolWorker, server: str, reset: Mapping[str, Any], call_timeout_s: float,
                 max_sessions: int, start_timeout_s: float = START_TIMEOUT_S) -> None:
        self.worker, self.key, self.generation = worker, worker.new_key(), worker.generation
        self.call_timeout_s, self.start_timeout_s = call_timeout_s, start_timeout_s
        self.lost: str | None = None
        self._first = True
        payload = {"server": server, "reset": dict(reset), "call_timeout_s": call_timeout_s,
                   "max_sessions": max_sessions, "start_timeout_s": start_timeout_s}
        try:  # a factory's call, and a wait for a free slot, happen in the worker before it answers
            opening = worker.ask("new", self.key, payload, self.generation,
                                 timeout=start_timeout_s + call_timeout_s + MARGIN_S)
        except (WorkerLost, ClassRaised) as error:
            raise SessionLost(f"the MCP server could not start: {error}") from None
        weakref.finalize(self, worker.drop, self.key, self.generation)
        if opening is not None:
            status, reason = opening
            if status == "stuck":
                worker.restart()
            raise SessionLost(reason)

    def _ask(self, request: tuple) -> Any:
        if self.lost is not None:
            raise SessionLost(self.lost)
        # The first request also waits for the server's start, under its own deadline in the worker.
        timeout = self.call_timeout_s + MARGIN_S + (self.start_timeout_s if self._first else 0.0)
        self._first = False
        try:
            status, value, lines = self.worker.ask("call", self.key, request, self.generation, timeout=timeout)
        except WorkerLost as error:
            self.lost = f"the MCP server's worker was lost: {error}"
            raise SessionLost(self.lost) from None
        except ClassRaised as error:  # SystemExit or KeyboardInterrupt out of a tool: caught in the worker
            self.lost = f"the MCP server raised {error.kind} ({error.message or 'no message'}): a tool tried to exit"
            raise SessionLost(self.lost) from None
        for line in lines:
            log.info("%s", line)
        if status == "stuck":
            self.worker.restart()
            value = f"{value}; a tool blocks the server's event loop, so its worker was restarted"
        if status != "ok":
            self.lost = str(value)
            raise SessionLost(self.lost)
        return value

    def list_tools(self) -> list[dict[str, Any]]:
        return self._ask(("list",))

    def call(self, name: str, arguments: Mapping[str, Any], max_chars: int) -> tuple[str, str | None]:
        text, error = self._ask(("call", name, dict(arguments), max_chars))
        return text, error

    def lose(self, reason: str) -> None:
        self.lost = self.lost or reason
        self.close()

    def close(self) -> None:
        self.worker.drop(self.key, self.generation)
