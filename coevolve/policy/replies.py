"""Splitting a model's reply into the tool calls it makes, for the two formats our users meet.

- `hermes`: Hermes / Qwen2.5 / Qwen3 function calling, `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
  one block per call, any text around them. A block left open at the end of the reply (generation stopped at a
  token limit) still counts as a call attempt.
- `python`: BFCL's prompting format, `[f(a=1), g(b='x')]` (or a single call), possibly inside a ``` fence.
- `code`: AppWorld's (and CodeAct's) way of acting: each fenced code block (```python ... ```) is one action, its
  text handed to the env as is (AppWorld runs it as a cell; BFCL parses it as a call). A block left open at the end
  of the reply still counts. Text outside the blocks is talk; a reply without a block ends the turn.

A reasoning model's `<think>...</think>` blocks are thought, not action: calls inside them are not calls.

`split_reply` only finds where calls are; it never interprets them. Each call comes back as text, and the env
parses it (`coevolve.calls`, no evaluation), so a malformed call becomes an error observation with the env's own
reason, exactly as a well-formed but wrong one does. A reply in which no call is attempted ends the model's turn.

What counts as an attempt: any `<tool_call>` tag (hermes); in python format, text whose first non-blank token
(after an optional fence) opens a call or a list of calls (`name(` or `[name(`) — prose and code blocks that do
something else are treated as talk, since BFCL scores them as no call either.
"""

from __future__ import annotations

import ast
import re
import warnings
from dataclasses import dataclass

REPLY_FORMATS = ("hermes", "python", "code")

_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"
_HERMES_OPEN_PATTERN = re.compile(re.escape(_HERMES_OPEN))
_BLOCK_OPEN = re.compile(r"```[A-Za-z0-9_+-]*[ \t]*\n?")  # a code fence with an optional language tag
_FENCE = re.compile(r"^\s*```[A-Za-z0-9_+-]*\s*\n?(.*?)\n?\s*```\s*$", re.DOTALL)
_CALL_START = re.compile(r"^\s*\[?\s*[A-Za-z_][A-Za-z0-9_]*\s*\(")
_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL)
MAX_CALLS_PER_REPLY = 64


@dataclass(frozen=True)
class SplitReply:
    """Where the calls of one reply are."""

    call_texts: tuple[str, ...]
    """Each attempted call as written (hermes: the JSON inside the tags; python: one call's source)."""
    content: str
    """The reply's text outside the calls (what the model said to the user)."""
    truncated: bool = False
    """True when more than `MAX_CALLS_PER_REPLY` calls were attempted and the rest were dropped."""


def split_reply(text: str, reply_format: str) -> SplitReply:
    text = without_reasoning(text)
    if reply_format == "hermes":
        return _split_hermes(text)
    if reply_format == "python":
        return _split_python(text)
    if reply_format == "code":
        return _split_code(text)
    raise ValueError(f"unknown reply format {reply_format!r}; choose one of {REPLY_FORMATS}")


def without_reasoning(text: str) -> str:
    """The reply without its `<think>` blocks (Qwen3 and other reasoning models): a call written while thinking is
    not a call, and a block left open at the token limit is all thought."""
    return _THINK.sub("", text) if "<think>" in text else text


def _limited(calls: list[str], content: str) -> SplitReply:
    truncated = len(calls) > MAX_CALLS_PER_REPLY
    return SplitReply(tuple(calls[:MAX_CALLS_PER_REPLY]), content, truncated)


def _split_blocks(text: str, opening: re.Pattern[str], closing: str, keep_empty: bool) -> SplitReply:
    """Each `opening ... closing` block is one call attempt (a block left open at the end still counts); the text
    outside the blocks is the reply's content."""
    calls: list[str] = []
    outside: list[str] = []
    position = 0
    while True:
        found = opening.search(text, position)
        if found is None:
            outside.append(text[position:])
            break
        outside.append(text[position:found.start()])
        end = text.find(closing, found.end())
        body = text[found.end():] if end < 0 else text[found.end():end]  # left open: cut at the token limit
        if keep_empty or body.strip():
            calls.append(body.strip() if keep_empty else body.strip("\n").rstrip())
        if end < 0:
            break
        position = end + len(closing)
    return _limited(calls, "".join(outside).strip())


def _split_hermes(text: str) -> SplitReply:
    return _split_blocks(text, _HERMES_OPEN_PATTERN, _HERMES_CLOSE, keep_empty=True)


def _split_python(text: str) -> SplitReply:
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1).strip()
    if not _CALL_START.match(body):
        return SplitReply((), text.strip())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes in model text are the model's concern
            node = ast.parse(body, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        # An attempted call we cannot split: hand it over whole, the env reports the syntax error.
        return SplitReply((body,), "")
    items = node.elts if isinstance(node, (ast.List, ast.Tuple)) else [node]
    calls = [ast.get_source_segment(body, item) or "" for item in items]
    return _limited(calls, "")


def _split_code(text: str) -> SplitReply:
    return _split_blocks(text, _BLOCK_OPEN, "```", keep_empty=False)
