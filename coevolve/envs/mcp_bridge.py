"""Sessions on MCP servers, synchronous: one event loop, in one daemon thread, carries every session of the process,
and `ServerSource` says where each session's server comes from (a factory, one shared object, a stdio command).

The rollout engine is synchronous and holds K x B episodes open at once; the official `mcp` SDK is async, and a
`Client` must be entered and left in the same task (anyio's cancel scopes). So each session is a small actor: a
task on the shared loop that enters `Client(...)`, then serves requests from a queue until it is told to close.
The caller's thread only waits on futures, each with a deadline:

    starting          `start_timeout_s` (30 s) for a factory to return (called on one of four shared helper
                      threads) and for the server to come up and answer the handshake
    each request      `call_timeout_s`; no answer in time and the session is abandoned (its task cancelled, which
                      ends a stdio server's process), the call and every later one answer `SessionLost`
    the server dies   (a stdio process exits, the transport breaks) the session is lost likewise

No thread or process is started per episode beyond what the transport needs (a stdio server is a process by
definition). `max_sessions` bounds how many sessions are open at once; one more waits for a slot at most
`call_timeout_s` and is then refused, so a leak shows as an environment failure, never as a hung run. A tool that
blocks in plain Python code (a sync tool in the SDK's worker thread that never returns) cannot be killed from
here: its session is abandoned and its slot freed, the thread is the server's to end.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import inspect
import json
import logging
import os
import shlex
import sys
import tempfile
import threading
import time
from typing import Any, Awaitable, Callable, Mapping, Sequence, TypeVar

from coevolve.envs.base import EnvFailed
from coevolve.envs.user_env import EnvDefinitionError, import_attribute

DEFAULT_MAX_SESSIONS = {"in-process": 1024, "stdio": 64}
DEFAULT_MAX_RESULT_CHARS = 8000
"""Sessions open at once, by default: a rollout opens all its episodes at its start (prompts_per_step x group_size,
and a held-out pass one per task and sample); an in-process session is a small object, a stdio one a process."""
START_TIMEOUT_S = 30.0
"""How long a server may take to start and answer the handshake (a stdio server imports its code first)."""

RESET_VARIABLE = "COEVOLVE_MCP_RESET"
"""A stdio server's `reset` arguments, as JSON, in its environment."""
MAX_SERVER_LOG_CHARS = 20000
T = TypeVar("T")
log = logging.getLogger("mcp.coevolve")


class SessionLost(EnvFailed):
    """The server could not start, did not answer in time, or died; the message says which. `holds_thread`: the
    work that timed out (a server factory) still runs on a thread of this process, which a restart frees."""

    def __init__(self, message: str, holds_thread: bool = False) -> None:
        super().__init__(message)
        self.holds_thread = holds_thread


class _Loop:
    """The process's one event loop for MCP sessions, in a daemon thread (started on first use)."""

    _shared: "_Loop | None" = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="coevolve-mcp", daemon=True)
        self.thread.start()

    @classmethod
    def shared(cls) -> "_Loop":
        with cls._lock:
            if cls._shared is None or not cls._shared.thread.is_alive():
                cls._shared = cls()
            return cls._shared


class Slots:
    """At most `limit` sessions open at once (one `Slots` per env)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"max_sessions must be at least 1, got {limit}")
        self.limit = limit
        self._free = threading.Semaphore(limit)

    def take(self, timeout: float) -> None:
        if not self._free.acquire(timeout=timeout):
            raise SessionLost(f"more than {self.limit} MCP sessions open at once for {timeout:g} s; raise "
                              "env.options.max_sessions (a rollout holds all its episodes open: prompts_per_step x "
                              "group_size, or a held-out pass's tasks x samples)")

    def give_back(self) -> None:
        self._free.release()


class Session:
    """One open session: `Session(connect, slots)` where `connect()` returns an un-entered `mcp.Client`;
    `request(operation)` runs `await operation(client)` on the loop and returns its result (or raises what it
    raised, or `SessionLost`)."""

    def __init__(self, connect: Callable[[], Any], slots: Slots, call_timeout_s: float,
                 start_timeout_s: float = START_TIMEOUT_S, started_at: float | None = None) -> None:
        """`started_at` (time.monotonic()): when the server's start began (a factory's call counts): one
        deadline, `start_timeout_s`, covers the factory, the process and the handshake."""
        self.call_timeout_s = call_timeout_s
        self.lost: str | None = None
        self._slots, self._slot_lock, self._holding = slots, threading.Lock(), False
        slots.take(call_timeout_s)
        self._holding = True
        self._loop = _Loop.shared().loop
        self._queue: asyncio.Queue | None = None
        self._finished = False
        # Not waited for here: a rollout opens all its episodes first, so their servers (a process each, for
        # stdio) start side by side on the loop; the first request waits for its own.
        self._ready: concurrent.futures.Future | None = concurrent.futures.Future()
        self._start_deadline = (time.monotonic() if started_at is None else started_at) + start_timeout_s
        self._start_timeout_s = start_timeout_s
        self._task_future = asyncio.run_coroutine_threadsafe(self._serve(connect, self._ready), self._loop)

    def _started(self) -> None:
        """Wait (once) for the server to answer the handshake; raises `SessionLost` when it did not."""
        if self._ready is None:
            return
        ready, self._ready = self._ready, None
        try:
            ready.result(max(0.0, self._start_deadline - time.monotonic()))
        except concurrent.futures.TimeoutError:
            self._abandon(f"the MCP server did not start within {self._start_timeout_s:g} s "
                          "(env.options.start_timeout_s)")
            raise SessionLost(self.lost) from None
        except BaseException as error:  # noqa: BLE001 - the server could not start: one line, why
            self.lost = f"the MCP server could not start: {describe(error)}"
            self._release()
            raise SessionLost(self.lost) from None

    async def _serve(self, connect: Callable[[], Any], ready: concurrent.futures.Future) -> None:
        self._queue = asyncio.Queue()
        try:
            async with connect() as client:
                ready.set_result(None)
                while True:
                    item = await self._queue.get()
                    if item is None:
                        return
                    operation, reply = item
                    try:
                        result = await operation(client)
                    except asyncio.CancelledError:
                        raise
                    except BaseException as error:  # noqa: BLE001 - handed to the caller, who says what it means
                        if not reply.done():
                            reply.set_exception(error)
                    else:
                        if not reply.done():
                            reply.set_result(result)
        except BaseException as error:  # noqa: BLE001 - a transport that broke or a server that died
            if not ready.done():
                ready.set_exception(error)
            elif self.lost is None and not isinstance(error, asyncio.CancelledError):
                self.lost = f"the MCP server's session ended: {describe(error)}"
        finally:
            self._finished = True
            while self._queue is not None and not self._queue.empty():  # nobody will answer these: say so now
                item = self._queue.get_nowait()
                if item is not None and not item[1].done():
                    item[1].set_exception(SessionLost(self.lost or "the MCP session is closed"))
            self._release()

    def _put(self, item: Any) -> None:
        """On the loop: queue a request, or answer it at once when the session is over."""
        if self._finished or self._queue is None:
            if item is not None and not item[1].done():
                item[1].set_exception(SessionLost(self.lost or "the MCP session is closed"))
            return
        self._queue.put_nowait(item)

    def request(self, operation: Callable[[Any], Awaitable[T]], timeout: float | None = None) -> T:
        if self.lost is not None:
            raise SessionLost(self.lost)
        self._started()
        reply: concurrent.futures.Future = concurrent.futures.Future()
        self._loop.call_soon_threadsafe(self._put, (operation, reply))
        limit = self.call_timeout_s if timeout is None else timeout
        try:
            return reply.result(limit)
        except concurrent.futures.TimeoutError:
            self._abandon(f"the MCP server did not answer within {limit:g} s (env.options.call_timeout_s)")
            raise SessionLost(self.lost) from None
        except SessionLost:
            raise
        except (concurrent.futures.CancelledError, RuntimeError) as error:
            if self.lost is not None:
                raise SessionLost(self.lost) from None
            raise error

    def list_tools(self) -> list[dict[str, Any]]:
        """Every listed tool (every page) as plain data: name, description, title, input schema."""
        try:
            listed = self.request(_all_tools)
        except SessionLost:
            raise
        except Exception as error:  # noqa: BLE001 - the server's answer was refused (an invalid tool list)
            raise SessionLost(f"the server's tool list was refused: {describe(error)}") from None
        return [{"name": tool.name, "description": tool.description, "title": tool.title,
                 "input_schema": dict(tool.input_schema or {"type": "object"})} for tool in listed]

    def call(self, name: str, arguments: Mapping[str, Any], max_chars: int = DEFAULT_MAX_RESULT_CHARS
             ) -> tuple[str, str | None]:
        """(observation, error) of one tool call; raises `SessionLost` when the server is gone. A protocol error
        and a result with `isError` are observations with their text (the agent's call, answered)."""
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED

        async def send(client: Any) -> Any:
            return await client.call_tool(name, dict(arguments))

        try:
            result = self.request(send)
        except MCPError as error:  # the server refused the request (the agent's call, answered), or is gone
            if error.code == CONNECTION_CLOSED:
                self.lose(f"the MCP server closed the connection during {name} (it exited or crashed)")
                raise SessionLost(self.lost) from None
            reason = f"{name}: {str(error)[:300]}"
            return f"Error: {reason}", reason
        except SessionLost:
            raise
        except Exception as error:  # noqa: BLE001 - a broken transport or a malformed answer: the server's failure
            self.lose(f"the MCP session broke on {name}: {describe(error)}")
            raise SessionLost(self.lost) from None
        text = result_text(result, max_chars)
        if result.is_error:
            return f"Error: {text}", f"{name}: {text[:300]}"
        return text, None

    def responsive(self, within_s: float = 1.0) -> bool:
        """Whether the sessions' event loop still runs (a tool that blocks it in plain code stalls every session
        on it: the caller then gives up the whole loop, e.g. the MCP worker process)."""
        try:
            asyncio.run_coroutine_threadsafe(asyncio.sleep(0), self._loop).result(within_s)
        except (concurrent.futures.TimeoutError, RuntimeError):
            return False
        return True

    def lose(self, reason: str) -> None:
        """Give the session up (a broken transport): every later request answers `SessionLost(reason)`."""
        self._abandon(reason)

    def close(self) -> None:
        """End the session (idempotent, does not wait): the actor leaves the `Client`, which stops the server."""
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._put, None)

    def _abandon(self, reason: str) -> None:
        self.lost = self.lost or reason
        self._task_future.cancel()  # cancels the actor's task: the Client's exit ends a stdio server's process
        self._release()  # a sync tool stuck in a thread may keep the task alive: its slot is free now anyway

    def _release(self) -> None:
        with self._slot_lock:
            if self._holding:
                self._holding = False
                self._slots.give_back()


MAX_TOOL_PAGES = 100
"""`list_tools` pages read at most: a server whose cursor never ends cannot hang the env's start."""
MAX_TOOLS = 512
"""Tools a server may list: more is refused when the env is made (every tool is in every prompt; 10,000 of them
made a 617,933-token prompt). Set env.options.max_tools to allow more."""


async def _all_tools(client: Any, limit: int = MAX_TOOLS) -> list[Any]:
    tools, cursor = [], None
    for _ in range(MAX_TOOL_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor or len(tools) > limit:
            break
    return tools


def result_text(result: Any, limit: int = DEFAULT_MAX_RESULT_CHARS) -> str:
    """A `CallToolResult` as an observation: its text blocks (other blocks named), else its structured content."""
    from coevolve.records import canonical_json

    parts = [block.text if getattr(block, "type", "") == "text" else f"[{getattr(block, 'type', 'other')} content]"
             for block in (result.content or [])]
    if parts:
        text = "\n".join(str(part) for part in parts)
    else:
        structured = getattr(result, "structured_content", None)
        text = canonical_json(structured) if structured is not None else ""
    return text if len(text) <= limit else text[:limit] + " ...(cut)"


def describe(error: BaseException) -> str:
    """One line for an exception, the first of a group's (anyio raises groups from task groups)."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    text = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


# --------------------------------------------------------------------------------------------------------------
# Where a session's server comes from
# --------------------------------------------------------------------------------------------------------------


def _is_server(value: Any) -> bool:
    from mcp.server import Server
    from mcp.server.mcpserver import MCPServer

    return isinstance(value, (Server, MCPServer))


@contextlib.contextmanager
def _console_kept():
    """The SDK's `MCPServer()` calls `logging.basicConfig` with a rich console handler at INFO: a server made here
    must not take over the run's console, so the root logger is put back as it was."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def route_logs() -> None:
    """The `mcp` logger keeps its records to itself: a run sends them to run.log (`run_setup.LIBRARY_LOGGERS`);
    elsewhere they are dropped, as the observations carry what went wrong."""
    logger = logging.getLogger("mcp")
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
        logger.propagate = False
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)


def _in_daemon_thread(function: Callable[[], T], timeout: float) -> T:
    """`function()` on a daemon thread of its own, waited for at most `timeout` s: a factory that never returns
    holds only that thread, never the caller, and never the interpreter's exit (an executor's threads are joined
    at exit: a factory sleeping 70 s kept the CLI alive 40 s after its answer)."""
    done: concurrent.futures.Future = concurrent.futures.Future()

    def run() -> None:
        try:
            done.set_result(function())
        except BaseException as error:  # noqa: BLE001 - SystemExit included: handed to the caller
            done.set_exception(error)

    threading.Thread(target=run, name="coevolve-mcp-factory", daemon=True).start()
    return done.result(timeout)


ORPHAN_GUARD = ("import ctypes, os, signal, sys\n"
                "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG\n"
                "if os.getppid() != int(sys.argv[1]): os._exit(1)  # the parent died before the line above\n"
                "os.execvp(sys.argv[2], sys.argv[2:])")
"""Runs a stdio server's command so that it dies with the process that started it (Linux): a server that never
answers, or one left behind when the CLI exits, is killed with it instead of living on under init."""


def guarded_command(command: Sequence[str]) -> list[str]:
    """`command`, started through ORPHAN_GUARD where the platform has PR_SET_PDEATHSIG (Linux), else as it is."""
    if not sys.platform.startswith("linux"):
        return list(command)
    return [sys.executable, "-I", "-S", "-c", ORPHAN_GUARD, str(os.getpid()), *command]


class ServerSource:
    """How each session gets its server: a factory called with the task's `reset`, one shared object, or a stdio
    command. `label` names it in the env's name (`mcp:LABEL`), which tasks carry."""

    def __init__(self, server: Any = None, command: Sequence[str] | None = None, cwd: str | None = None) -> None:
        if (server is None) == (command is None):
            raise EnvDefinitionError("env mcp: give env.options.server (package.module:ATTR, a server or a factory) "
                                     "or env.options.command ([program, arg, ...], a stdio server), one of them")
        self.factory: Callable[..., Any] | None = None
        self.shared: Any = None
        self.command: tuple[str, ...] = ()
        self.cwd = cwd
        if command is not None:
            if isinstance(command, str) or not command or not all(isinstance(part, str) for part in command):
                raise EnvDefinitionError("env.options.command: a list of strings, [program, arg, ...]")
            self.command, self.label = tuple(command), shlex.join(command)
            return
        if isinstance(server, str):
            with _console_kept():
                value = import_attribute(server, "ATTR")
            if value is None:
                module, _, name = server.partition(":")
                raise EnvDefinitionError(f"{server!r}: {module} has no {name} (an MCP server or a factory of one)")
            self.label = server
        else:
            value, self.label = server, f"{type(server).__module__}:{getattr(server, 'name', type(server).__name__)}"
        if _is_server(value):
            self.shared = value
        elif callable(value):
            self.factory = value
        else:
            raise EnvDefinitionError(f"{self.label!r} is a {type(value).__name__}, not an MCP server (MCPServer or "
                                     "Server) nor a factory returning one")

    def reset_problem(self, reset: Mapping[str, Any]) -> str | None:
        """Why a task's `reset` arguments cannot reach this server, or None."""
        if not reset or self.command:
            return None
        if self.factory is None:
            return (f"gives reset arguments {sorted(reset)}, but {self.label} is one shared server: name a factory "
                    "that takes them (def make_server(...) -> MCPServer)")
        try:
            inspect.signature(self.factory).bind(**reset)
        except TypeError as error:
            return f"reset {sorted(reset)} does not fit {self.label}{inspect.signature(self.factory)} ({error})"
        except ValueError:  # a builtin without a signature: let the call say
            return None
        return None

    def connect(self, reset: Mapping[str, Any], start_timeout_s: float = START_TIMEOUT_S) -> Callable[[], Any]:
        """A callable that returns an un-entered `mcp.Client` on a server for `reset` (made now, in this thread:
        a slow factory never stalls the other sessions' loop)."""
        from mcp import Client

        if self.command:
            return lambda: Client(_stdio_transport(self.command, reset, self.cwd, self.label), cache=None)
        if self.factory is None:
            return lambda: Client(self.shared, cache=None)
        def make() -> Any:
            with _console_kept():
                return self.factory(**copy.deepcopy(dict(reset)))

        try:  # on a helper thread, under the start deadline: a factory that never returns costs one episode
            server = _in_daemon_thread(make, start_timeout_s)
        except concurrent.futures.TimeoutError:
            raise SessionLost(f"the server factory {self.label} did not return within {start_timeout_s:g} s "
                              "(env.options.start_timeout_s)", holds_thread=True) from None
        except BaseException as error:  # noqa: BLE001 - a factory that raises (or exits): the episode says why
            raise SessionLost(f"the server factory {self.label} raised {describe(error)}") from None
        if not _is_server(server):
            raise SessionLost(f"the server factory {self.label} returned a {type(server).__name__}, not an MCP server")
        return lambda: Client(server, cache=None)


@contextlib.asynccontextmanager
async def _stdio_transport(command: Sequence[str], reset: Mapping[str, Any], cwd: str | None, label: str):
    """The SDK's stdio transport, with the server's stderr kept in a file and logged when the session ends."""
    from mcp import StdioServerParameters
    from mcp.client.stdio import stdio_client

    guarded = guarded_command(command)
    parameters = StdioServerParameters(command=guarded[0], args=guarded[1:], cwd=cwd,
                                       env={RESET_VARIABLE: json.dumps(dict(reset))})
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as errors:
        try:
            async with stdio_client(parameters, errlog=errors) as streams:
                yield streams
        finally:
            errors.seek(0)
            for line in errors.read(MAX_SERVER_LOG_CHARS).splitlines():
                if line.strip():
                    log.info("%s: %s", label, line)
