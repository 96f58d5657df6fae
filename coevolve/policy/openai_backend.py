"""Chat backend for any OpenAI-compatible endpoint (hosted APIs, `vllm serve`, `coevolve serve`), via `openai`.

Requests of one batch run concurrently (a thread pool; the endpoint does the batching). Each request is retried
with exponential backoff on what is worth retrying (connection errors, timeouts, 429, 5xx, a reply that is not a
chat completion) up to `max_retries` times; after that, or at once on other 4xx errors, the request yields a
`Generation` with `error` set, the episode ends with that reason (scored 0) and the run goes on. The client's own
retry loop is turned off so that every attempt is counted in `stats`.

Tool calls: when tools are passed (`hermes` format with `tools_in_template`), the endpoint's native function
calling is used and its `tool_calls` come back as JSON texts `{"name", "arguments"}`; arguments that are not
valid JSON are passed on as a string, which the env refuses with a reason. Otherwise the reply's text is parsed.
"""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping, Sequence

from coevolve.policy.backends import Generation, SamplingConfig


class OpenAIBackend:
    def __init__(self, model: str, base_url: str | None = None, api_key: str | None = None, timeout: float = 60.0,
                 max_retries: int = 3, backoff_seconds: float = 0.5, max_concurrency: int = 8) -> None:
        from openai import OpenAI

        self.model = model
        self.max_retries = max_retries
        self.backoff_seconds = backoff_seconds
        self.max_concurrency = max_concurrency
        key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"  # local servers take any key
        self.client = OpenAI(base_url=base_url, api_key=key, timeout=timeout, max_retries=0)
        self.stats = {"requests": 0, "attempts": 0, "retries": 0, "failures": 0}
        self._lock = threading.Lock()

    def _count(self, key: str) -> None:
        with self._lock:
            self.stats[key] += 1

    def chat(self, conversations: Sequence[Sequence[Mapping[str, Any]]], tools: Sequence[Sequence[Mapping[str, Any]]],
             sampling: SamplingConfig) -> list[Generation]:
        if not conversations:
            return []
        tools = list(tools) or [[] for _ in conversations]
        workers = max(1, min(self.max_concurrency, len(conversations)))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(lambda pair: self.complete(pair[0], pair[1], sampling), zip(conversations, tools)))

    def complete(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]],
                 sampling: SamplingConfig) -> Generation:
        import openai

        self._count("requests")
        request: dict[str, Any] = {
            "model": self.model, "messages": [dict(m) for m in messages], "temperature": sampling.temperature,
            "top_p": sampling.top_p, "max_tokens": sampling.max_new_tokens,
        }
        if sampling.seed is not None:
            request["seed"] = sampling.seed
        if tools:
            request["tools"] = [dict(tool) for tool in tools]
        last_error = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                self._count("retries")
                time.sleep(self.backoff_seconds * 2 ** (attempt - 1))
            self._count("attempts")
            try:
                response = self.client.chat.completions.create(**request)
                return _generation(response)
            except (openai.APIConnectionError, openai.APITimeoutError, openai.RateLimitError,
                    openai.InternalServerError) as error:
                last_error = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
            except openai.APIStatusError as error:  # other 4xx: the request itself is wrong, retrying won't help
                self._count("failures")
                return Generation("", error=f"HTTP {error.status_code}: {str(error).splitlines()[0][:200]}")
            except (ValueError, TypeError, AttributeError, IndexError, KeyError) as error:
                last_error = f"malformed completion ({type(error).__name__}: {str(error)[:200]})"
        self._count("failures")
        return Generation("", error=f"gave up after {self.max_retries + 1} attempts: {last_error}")


def _generation(response: Any) -> Generation:
    choice = response.choices[0]
    message = choice.message
    text = message.content or ""
    tool_calls = None
    if getattr(message, "tool_calls", None):
        tool_calls = tuple(_call_json(call.function.name, call.function.arguments) for call in message.tool_calls)
    finish = "length" if choice.finish_reason == "length" else "stop"
    return Generation(text, finish_reason=finish, tool_calls=tool_calls)


def _call_json(name: Any, arguments: Any) -> str:
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        parsed = arguments  # the env reports that arguments must be an object
    return json.dumps({"name": name, "arguments": parsed if parsed is not None else {}}, ensure_ascii=False)
