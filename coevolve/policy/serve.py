"""A small OpenAI-compatible chat server over a local model: `coevolve serve --model smollm2 --port 8000`.

What it is for: an offline endpoint for the explorer/abstractor LLM of synthesis and for trying the
`openai` backend without a GPU; the tests use it to exercise the HTTP backend over real HTTP. For real serving
on GPUs use `vllm serve`.

Endpoints: `GET /v1/models`, `POST /v1/chat/completions` (messages, tools, temperature, top_p, max_tokens, seed;
one choice). Concurrent requests are gathered by one worker thread into a single batched `generate` call (up to
`max_batch` requests, waiting at most `batch_window_seconds` for company), so the shared-prefill engine serves
parallel clients. Tool calling follows the Hermes convention, like `vllm serve --tool-call-parser hermes`: the
tools go to the chat template (or into the system prompt when the template ignores them), and `<tool_call>`
blocks in the reply come back as `tool_calls`.

`before_request(path, body)` may return `(status, payload)` to answer a request itself: a hook for access control,
quotas, or fault injection in tests.

Bounds (a client cannot make it use unbounded memory or time): a body over `MAX_BODY_BYTES` is refused (413)
before it is read; a prompt longer than the model's context is refused (400), by its length in characters before
tokenising when it cannot fit at `MAX_CHARS_PER_TOKEN`, else by its token count; `max_tokens` is clamped to what the
context leaves; each request has a deadline (`request_timeout_seconds`, 504 past it; a request still queued then is
dropped, one already generating finishes in its batch). Every malformed request gets a 4xx JSON error: a bad
`Content-Length`, a message without `role`, a bad `seed`/`max_tokens`/`temperature`, `stream: true` (not
supported: refused rather than ignored), a model name it does not serve (404, as OpenAI's API answers), a body
nested deeper than the JSON parser goes, a temperature or top_p that is not a finite number in range; every other
method and every protocol error gets a JSON answer too (405, 400), never an HTML page. Connections: at most
`MAX_CONNECTIONS` are served at once (the next is answered 503 and closed), and a connection idle for
`IDLE_TIMEOUT_SECONDS` (a client that sends half a request and waits) is closed.
"""

from __future__ import annotations

import json
import math
import queue
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from coevolve.policy.backends import Generation, SamplingConfig
from coevolve.policy.chat import HERMES_SYSTEM, ChatRenderer, format_calls
from coevolve.policy.replies import split_reply
from coevolve.records import ToolCall

MAX_BODY_BYTES = 2 * 1024 * 1024
MAX_CONNECTIONS = 256
IDLE_TIMEOUT_SECONDS = 30.0
READ_DEADLINE_SECONDS = 20.0
"""A request must arrive whole within this (headers and body): a client dripping a byte every 29 s passed the idle
timeout forever, and 256 of them held every connection slot (503 for everyone else) for as long as they liked."""
UNSUPPORTED = {"n": 1, "stop": None, "logit_bias": None, "presence_penalty": 0, "frequency_penalty": 0,
               "logprobs": False, "top_logprobs": None, "response_format": None, "stream_options": None}
"""OpenAI parameters this server does not honour, with the one value it takes (what leaving them out means):
any other value is refused with a 400, never silently ignored."""
MAX_CHARS_PER_TOKEN = 32
"""No token of a byte-level BPE vocabulary spans more characters than this, so a prompt of more than
context x 32 characters cannot fit whatever it says: refused without tokenising it."""


@dataclass
class _Pending:
    prompt_ids: list[int]
    sampling: SamplingConfig
    done: threading.Event = field(default_factory=threading.Event)
    result: Generation | None = None
    error: str | None = None
    cancelled: bool = False


class ChatServer:
    def __init__(self, backend: Any, model_name: str = "local", host: str = "127.0.0.1", port: int = 0,
                 max_batch: int = 32, batch_window_seconds: float = 0.02,
                 before_request: Callable[[str, dict], tuple[int, dict] | None] | None = None,
                 request_timeout_seconds: float = 300.0) -> None:
        self.backend = backend
        self.model_name = model_name
        self.request_timeout_seconds = request_timeout_seconds
        config = getattr(getattr(backend, "model", None), "config", None)
        self.context_tokens = int(getattr(config, "max_position_embeddings", 0) or 32768)
        self.renderer = ChatRenderer(backend.tokenizer, "hermes")
        self.stop_token_ids = self.renderer.stop_token_ids()
        self.max_batch = max_batch
        self.batch_window_seconds = batch_window_seconds
        self.before_request = before_request
        self._queue: queue.Queue[_Pending] = queue.Queue()
        self._httpd = _Server((host, port), _handler_for(self))
        self._threads: list[threading.Thread] = []

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> "ChatServer":
        for target in (self._httpd.serve_forever, self._batch_worker):
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._queue.put(None)  # type: ignore[arg-type]

    def __enter__(self) -> "ChatServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- batching -------------------------------------------------------------------------------------------
    def _batch_worker(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            deadline = time.monotonic() + self.batch_window_seconds
            while len(batch) < self.max_batch:
                try:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)  # type: ignore[arg-type]
                    break
                batch.append(item)
            by_sampling: dict[SamplingConfig, list[_Pending]] = {}
            for item in batch:
                if item.cancelled:  # its client's deadline passed while it waited: nobody reads the answer
                    item.done.set()
                    continue
                by_sampling.setdefault(item.sampling, []).append(item)
            for sampling, items in by_sampling.items():
                try:
                    results = self.backend.generate([item.prompt_ids for item in items], sampling,
                                                    self.stop_token_ids)
                    for item, result in zip(items, results):
                        item.result = result
                except Exception as error:  # noqa: BLE001 - reported to the client as a 500, the server lives on
                    for item in items:
                        item.error = f"{type(error).__name__}: {error}"
                for item in items:
                    item.done.set()

    # -- requests -------------------------------------------------------------------------------------------
    def template_messages(self, messages: list[dict], tools: list[dict]) -> tuple[list[dict], list[dict] | None]:
        """OpenAI messages -> what the chat template renders (Hermes text where the template lacks tool support)."""
        out = []
        for message in messages:
            message = dict(message)
            if message.get("tool_calls"):
                calls = [ToolCall(c["function"]["name"], _loads_object(c["function"].get("arguments")))
                         for c in message["tool_calls"]]
                text = format_calls(calls, "hermes")
                message = {"role": "assistant", "content": ((message.get("content") or "") + "\n" + text).strip()}
            message["content"] = message.get("content") or ""
            out.append({k: v for k, v in message.items() if k in ("role", "content", "name")})
        if not tools or self.renderer.template_takes_tools:
            return out, tools or None
        system = HERMES_SYSTEM.format(tools="\n".join(json.dumps(tool) for tool in tools))
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + system}
        else:
            out.insert(0, {"role": "system", "content": system})
        return out, None

    def complete(self, body: dict) -> tuple[int, dict]:
        problem = _check_body(body, self.model_name)
        if problem is not None:
            return problem
        messages, tools = body["messages"], body.get("tools") or []
        try:
            rendered, template_tools = self.template_messages(messages, tools)
            # Guarded: a client's message or tool result that holds `<|im_start|>` stays plain text.
            prompt = self.renderer.render(rendered, template_tools)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            return 400, _error(f"bad request: {error}")
        if len(prompt) > self.context_tokens * MAX_CHARS_PER_TOKEN:
            return 400, _error(f"the prompt ({len(prompt)} characters) cannot fit the model's context of "
                               f"{self.context_tokens} tokens")
        prompt_ids = self.renderer.encode(prompt)
        room = self.context_tokens - len(prompt_ids)
        if room < 1:
            return 400, _error(f"the prompt is {len(prompt_ids)} tokens; the model's context is {self.context_tokens}")
        try:
            sampling = SamplingConfig(temperature=float(body.get("temperature", 1.0)),
                                      top_p=float(body.get("top_p", 1.0)),
                                      max_new_tokens=min(int(body.get("max_tokens") or 256), room),
                                      seed=body.get("seed"))
        except (TypeError, ValueError) as error:
            return 400, _error(f"bad request: {error}")
        pending = _Pending(prompt_ids, sampling)
        self._queue.put(pending)
        if not pending.done.wait(self.request_timeout_seconds):
            pending.cancelled = True
            return 504, _error(f"no answer within {self.request_timeout_seconds:.0f} s")
        if pending.error is not None or pending.result is None:
            return 500, _error(pending.error or "generation failed")
        return 200, self._response(pending.result, bool(tools))

    def _response(self, generation: Generation, with_tools: bool) -> dict:
        message: dict[str, Any] = {"role": "assistant", "content": generation.text}
        finish = generation.finish_reason
        if with_tools:
            split = split_reply(generation.text, "hermes")
            calls = []
            for text in split.call_texts:
                parsed = _loads_object(text)
                if isinstance(parsed.get("name"), str):
                    arguments = json.dumps(parsed.get("arguments", {}), ensure_ascii=False)
                    calls.append({"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                                  "function": {"name": parsed["name"], "arguments": arguments}})
            if calls:
                message = {"role": "assistant", "content": split.content or None, "tool_calls": calls}
                finish = "tool_calls" if finish == "stop" else finish
        usage = {"completion_tokens": len(generation.token_ids)}
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:16]}", "object": "chat.completion", "created": int(time.time()),
                "model": self.model_name, "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": usage}


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # socketserver's 5 resets connections of a burst of clients before a thread takes them
    daemon_threads = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread per connection, at most MAX_CONNECTIONS at once: past that, 503 and close (no thread)."""
        if not self.slots.acquire(blocking=False):
            body = json.dumps(_error(f"over {MAX_CONNECTIONS} connections at once; retry")).encode()
            try:
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


def _loads_object(text: Any) -> dict:
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text) if isinstance(text, str) else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _error(message: str) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error"}}


def _check_body(body: dict, model_name: str) -> tuple[int, dict] | None:
    """What an OpenAI-compatible server refuses before any work: a 4xx with the reason, or None."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return 400, _error("'messages' must be a non-empty list")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            return 400, _error(f"messages[{index}] needs a 'role'")
        if message.get("content") is not None and not isinstance(message["content"], str):
            return 400, _error(f"messages[{index}].content must be a string")
    if body.get("stream"):
        return 400, _error("stream: true is not supported by this server; send stream: false")
    for name, default in UNSUPPORTED.items():
        if name in body and body[name] != default and not (default is None and body[name] in ([], {})):
            taken = "leave it out" if default is None else f"send {json.dumps(default)} or leave it out"
            return 400, _error(f"'{name}' is not supported by this server ({taken}); it is not ignored in silence")
    model = body.get("model")
    if model is not None and model != model_name:
        return 404, {"error": {"message": f"model {model!r} does not exist here; this server serves {model_name!r}",
                               "type": "invalid_request_error", "code": "model_not_found"}}
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
        return 400, _error("'seed' must be a non-negative integer")
    max_tokens = body.get("max_tokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        return 400, _error("'max_tokens' must be an integer >= 1")
    if not isinstance(body.get("tools") or [], list):
        return 400, _error("'tools' must be a list")
    for name, low, high in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0)):
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or not low <= value <= high):
            return 400, _error(f"'{name}' must be a number in [{low:g}, {high:g}]")
    return None


def _handler_for(server: ChatServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = IDLE_TIMEOUT_SECONDS  # a socket timeout: a connection that goes quiet mid-request is closed

        def log_message(self, *args: Any) -> None:  # quiet: the caller reports progress
            pass

        def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
            """http.server's protocol errors (bad request line, unsupported method, ...) as JSON, not HTML."""
            self.close_connection = True
            self._send(code, _error(message or explain or "bad request"))

        def _not_allowed(self) -> None:
            self._send(405, _error(f"{self.command} is not served here; use GET /v1/models or POST "
                                   "/v1/chat/completions"))

        do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _not_allowed

        def do_HEAD(self) -> None:  # noqa: N802 - a 405 like any other method, its headers without the body
            self._head_only = True
            self._not_allowed()

        def handle_one_request(self) -> None:
            """One request, read whole within READ_DEADLINE_SECONDS (see there), then answered without a deadline
            of the connection's (the answer has its own, `request_timeout_seconds`)."""
            self._head_only = False
            self._reading = threading.Timer(READ_DEADLINE_SECONDS, self._cut_off)
            self._reading.daemon = True
            self._reading.start()
            try:
                super().handle_one_request()
            finally:
                self._reading.cancel()

        def _cut_off(self) -> None:
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        def _send(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode("utf-8")
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if not getattr(self, "_head_only", False):
                    self.wfile.write(data)
            except OSError:  # the client left, or was cut off at its read deadline: nobody to answer
                self.close_connection = True

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            self._reading.cancel()
            if self.path.rstrip("/") == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": server.model_name, "object": "model"}]})
            else:
                self._send(404, _error(f"no route {self.path}"))

        def do_POST(self) -> None:  # noqa: N802
            header = self.headers.get("Content-Length")
            if header is None or not header.strip().isdigit():
                self.close_connection = True  # the body's end is unknown: nothing more can be read on this connection
                self._send(400 if header is not None else 411, _error("a Content-Length of 0 or more bytes is needed"))
                return
            length = int(header)
            if length > MAX_BODY_BYTES:
                self.close_connection = True
                self._send(413, _error(f"request body over {MAX_BODY_BYTES} bytes"))
                return
            try:
                raw = self.rfile.read(length)
                self._reading.cancel()  # read whole: the answer may take as long as generation takes
                body = json.loads(raw or b"{}")
            except ValueError:
                self._send(400, _error("body is not JSON"))
                return
            except RecursionError:
                self._send(400, _error("body is nested too deep"))
                return
            if server.before_request is not None:
                answered = server.before_request(self.path, body)
                if answered is not None:
                    self._send(*answered)
                    return
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._send(404, _error(f"no route {self.path}"))
                return
            self._send(*server.complete(body if isinstance(body, dict) else {}))

    return Handler
