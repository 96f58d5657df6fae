"""Parsing untrusted tool calls into `ToolCall` records, without ever executing them.

Agents write calls as Python-call strings (BFCL's notation, `cd(folder='x')`, or a list `[f(a=1), g(b='x')]`) or
as JSON objects (`{"name": "cd", "arguments": {"folder": "x"}}`, arguments possibly a JSON string as in the
OpenAI tool-call format). Both are parsed into a `ToolCall` whose arguments hold only JSON-like literals.

What this guards against, and how:
- Code execution: the text is parsed with `ast.parse` (which builds a syntax tree and runs nothing) and only
  these nodes are accepted: one call of a bare name, whose arguments are constants (str, int, float, bool, None),
  lists, tuples and dicts of constants, and unary minus/plus on numbers. Attribute access, subscripts, nested
  calls, names, lambdas, comprehensions, f-strings, starred or `**` arguments are refused.
- Private or magic methods: names starting with `_` are refused here; envs additionally check that the name is
  a tool they expose.
- Resource exhaustion: the text length, the number of syntax nodes, the nesting depth, the number of calls in a
  reply and the size of integers are bounded (`CallLimits`), checked before and while walking the tree.

What it does not protect against: a tool implementation that is itself slow or unsafe for some literal argument.
Envs add per-tool argument guards for those (see `coevolve.envs.bfcl`).
"""

from __future__ import annotations

import ast
import json
import warnings
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

from coevolve.records import ToolCall


@dataclass(frozen=True)
class CallLimits:
    """Bounds on one call; anything larger is refused with a reason before it can cost time or memory."""

    max_chars: int = 65_536
    """Longest call text (or JSON object text) accepted."""
    max_nodes: int = 5_000
    """Most syntax-tree nodes (or JSON values) in one call."""
    max_depth: int = 32
    """Deepest nesting of lists/dicts in an argument."""
    """Most calls in one list-form reply `[f(), g(), ...]`."""
    max_int_digits: int = 18
    """Most decimal digits in an integer argument (bounds big-int arithmetic inside tools)."""


DEFAULT_LIMITS = CallLimits()


@dataclass(frozen=True)
class CallError:
    """Why a call could not be parsed; becomes the error observation."""

    reason: str


class _Refused(Exception):
    pass


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name.isidentifier():
        raise _Refused(f"function name {str(name)[:80]!r} is not an identifier")
    if name.startswith("_"):
        raise _Refused(f"function name {name!r} is private; only public tools can be called")
    return name


# --------------------------------------------------------------------------------------------------------------
# Python-call strings
# --------------------------------------------------------------------------------------------------------------


class _LiteralReader:
    """Turns an argument's syntax tree into a Python value, accepting only JSON-like literals."""

    def __init__(self, limits: CallLimits) -> None:
        self.limits = limits
        self.nodes = 0

    def read(self, node: ast.AST, depth: int = 0) -> Any:
        self.nodes += 1
        if self.nodes > self.limits.max_nodes:
            raise _Refused(f"call has more than {self.limits.max_nodes} syntax nodes")
        if depth > self.limits.max_depth:
            raise _Refused(f"argument nesting deeper than {self.limits.max_depth}")
        if isinstance(node, ast.Constant):
            return self._constant(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            operand = node.operand
            if isinstance(operand, ast.Constant) and type(operand.value) in (int, float):
                value = self._constant(operand.value)
                return -value if isinstance(node.op, ast.USub) else value
            raise _Refused("unary operators apply only to number literals")
        if isinstance(node, ast.List):
            return [self.read(item, depth + 1) for item in node.elts]
        if isinstance(node, ast.Tuple):
            return tuple(self.read(item, depth + 1) for item in node.elts)
        if isinstance(node, ast.Dict):
            if any(key is None for key in node.keys):
                raise _Refused("`**` unpacking inside a dict literal is not allowed")
            result = {}
            for key_node, value_node in zip(node.keys, node.values):
                key = self.read(key_node, depth + 1)  # type: ignore[arg-type]
                if not isinstance(key, (str, int, float, bool)) and key is not None:
                    raise _Refused("dict keys must be str, number, bool or None literals")
                result[key] = self.read(value_node, depth + 1)
            return result
        raise _Refused(f"argument is not a literal ({type(node).__name__} expressions are not allowed)")

    def _constant(self, value: Any) -> Any:
        # bool is a subclass of int: test it first so True stays True.
        if value is None or isinstance(value, (bool, str, float)):
            return value
        if isinstance(value, int):
            if len(str(abs(value))) > self.limits.max_int_digits:
                raise _Refused(f"integer literal longer than {self.limits.max_int_digits} digits")
            return value
        raise _Refused(f"{type(value).__name__} literals are not allowed")


def _call_from_node(node: ast.AST, reader: _LiteralReader) -> ToolCall:
    if not isinstance(node, ast.Call):
        raise _Refused(f"expected a function call like name(arg=value), got a {type(node).__name__} expression")
    if not isinstance(node.func, ast.Name):
        raise _Refused(
            "only plain function names can be called (no attributes, subscripts or nested calls in the callee)"
        )
    name = _check_name(node.func.id)
    positional = []
    for arg in node.args:
        if isinstance(arg, ast.Starred):
            raise _Refused("`*` argument unpacking is not allowed")
        positional.append(reader.read(arg, 1))
    arguments: dict[str, Any] = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            raise _Refused("`**` argument unpacking is not allowed")
        if keyword.arg in arguments:
            raise _Refused(f"argument {keyword.arg!r} given twice")
        arguments[keyword.arg] = reader.read(keyword.value, 1)
    return ToolCall(name, arguments, tuple(positional))


def _parse_expression(text: str, limits: CallLimits) -> ast.expr:
    if len(text) > limits.max_chars:
        raise _Refused(f"call text is {len(text)} characters; the limit is {limits.max_chars}")
    try:
        with warnings.catch_warnings():
            # Invalid escapes in agent text ("\d") would print a DeprecationWarning per call: not our user's concern.
            warnings.simplefilter("ignore")
            return ast.parse(text.strip(), mode="eval").body
    except SyntaxError as error:
        raise _Refused(f"syntax error: {error.msg}") from None
    except (ValueError, RecursionError, MemoryError) as error:  # null bytes, pathological nesting
        raise _Refused(f"unparseable call text ({type(error).__name__})") from None


def parse_python_call(text: str, limits: CallLimits = DEFAULT_LIMITS) -> ToolCall | CallError:
    """`cd(folder='x')` -> ToolCall('cd', {'folder': 'x'}); anything else -> CallError with the reason.

    Results are memoised (the K rollouts of one prompt repeat the same calls): a returned ToolCall is shared, so
    callers must not mutate its arguments; `fresh_arguments` gives a private copy for dispatch.
    """
    if len(text) > limits.max_chars:  # checked before the cache so huge strings are never kept
        return CallError(f"call text is {len(text)} characters; the limit is {limits.max_chars}")
    return _parse_python_call_cached(text, limits)


@lru_cache(maxsize=16_384)
def _parse_python_call_cached(text: str, limits: CallLimits) -> ToolCall | CallError:
    try:
        return _call_from_node(_parse_expression(text, limits), _LiteralReader(limits))
    except _Refused as refused:
        return CallError(str(refused))


def _check_json_value(value: Any, limits: CallLimits, budget: list[int], depth: int = 0) -> None:
    budget[0] -= 1
    if budget[0] < 0:
        raise _Refused(f"call has more than {limits.max_nodes} JSON values")
    if depth > limits.max_depth:
        raise _Refused(f"argument nesting deeper than {limits.max_depth}")
    if isinstance(value, bool) or value is None or isinstance(value, (str, float)):
        return
    if isinstance(value, int):
        if len(str(abs(value))) > limits.max_int_digits:
            raise _Refused(f"integer longer than {limits.max_int_digits} digits")
        return
    if isinstance(value, (list, tuple)):  # tuples come from Python-call literals
        for item in value:
            _check_json_value(item, limits, budget, depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not (key is None or isinstance(key, (str, int, float, bool))):
                raise _Refused("object keys must be str, number, bool or None")
            _check_json_value(item, limits, budget, depth + 1)
        return
    raise _Refused(f"{type(value).__name__} values are not allowed in arguments")


def parse_json_call(value: Mapping[str, Any] | str, limits: CallLimits = DEFAULT_LIMITS) -> ToolCall | CallError:
    """`{"name": "cd", "arguments": {"folder": "x"}}` (arguments may be a JSON string) -> ToolCall."""
    try:
        if isinstance(value, str):
            if len(value) > limits.max_chars:
                raise _Refused(f"call text is {len(value)} characters; the limit is {limits.max_chars}")
            try:
                value = json.loads(value)
            except (ValueError, RecursionError) as error:
                raise _Refused(f"invalid JSON: {str(error)[:120]}") from None
        if not isinstance(value, Mapping):
            raise _Refused("a JSON call must be an object with `name` and `arguments`")
        unknown = set(value) - {"name", "arguments"}
        if unknown:
            raise _Refused(f"unexpected keys in JSON call: {sorted(map(str, unknown))[:5]}")
        name = _check_name(value.get("name"))
        arguments = value.get("arguments", {})
        if isinstance(arguments, str):
            if len(arguments) > limits.max_chars:
                raise _Refused(f"arguments are {len(arguments)} characters; the limit is {limits.max_chars}")
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except (ValueError, RecursionError) as error:
                raise _Refused(f"arguments are not valid JSON: {str(error)[:120]}") from None
        if not isinstance(arguments, dict):
            raise _Refused("`arguments` must be a JSON object")
        for key in arguments:
            if not isinstance(key, str) or not key.isidentifier():
                raise _Refused(f"argument name {str(key)[:80]!r} is not an identifier")
        _check_json_value(arguments, limits, [limits.max_nodes])
        if len(json.dumps(arguments)) > limits.max_chars:
            raise _Refused(f"arguments exceed {limits.max_chars} characters")
        return ToolCall(name, dict(arguments))
    except _Refused as refused:
        return CallError(str(refused))


def fresh_arguments(call: ToolCall) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Private copies of a call's positional and keyword arguments, for handing to a tool that may keep or
    mutate them (a list stored in env state must not alias the parsed call, or a cached parse of it)."""
    return tuple(_copy_literal(v) for v in call.positional), {k: _copy_literal(v) for k, v in call.arguments.items()}


def _copy_literal(value: Any) -> Any:
    if isinstance(value, list):
        return [_copy_literal(item) for item in value]
    if isinstance(value, dict):
        return {key: _copy_literal(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return tuple(_copy_literal(item) for item in value)
    return value  # str, int, float, bool, None are immutable


def parse_call(value: Any, limits: CallLimits = DEFAULT_LIMITS) -> ToolCall | CallError:
    """Parse any accepted call form. A string that starts with `{` is read as JSON, any other as a Python call."""
    if isinstance(value, ToolCall):
        # Records built in code are trusted for shape, not for content: apply the same name and value checks.
        try:
            _check_name(value.name)
            _check_json_value([list(value.positional), dict(value.arguments)], limits, [limits.max_nodes])
        except _Refused as refused:
            return CallError(str(refused))
        return value
    if isinstance(value, Mapping):
        return parse_json_call(value, limits)
    if isinstance(value, str):
        return parse_json_call(value, limits) if value.lstrip().startswith("{") else parse_python_call(value, limits)
    return CallError(f"a call must be a string or a JSON object, got {type(value).__name__}")
