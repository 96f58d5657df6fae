"""The call parser on valid, partial and hostile input (it must never execute anything)."""

from __future__ import annotations

import keyword

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coevolve.calls import CallError, CallLimits, parse_call, parse_python_call
from coevolve.records import ToolCall


@pytest.mark.parametrize(
    "text, expected",
    [
        ("cd(folder='x')", ToolCall("cd", {"folder": "x"})),
        ("ls(a=True)", ToolCall("ls", {"a": True})),
        ("sort('f.txt')", ToolCall("sort", {}, ("f.txt",))),
        ("f(x=-1.5, y=[1, {'k': None}], z=(1, 2))", ToolCall("f", {"x": -1.5, "y": [1, {"k": None}], "z": (1, 2)})),
        ("  pwd()  ", ToolCall("pwd", {})),
    ],
)
def test_valid_python_calls(text, expected):
    assert parse_python_call(text) == expected


@pytest.mark.parametrize(
    "text, reason",
    [
        ("cd(folder=pwd())", "not a literal"),
        ("a.b()", "plain function names"),
        ("_hidden()", "private"),
        ("__import__('os')", "private"),
        ("cd(*x)", "unpacking"),
        ("cd(**x)", "unpacking"),
        ("cd(folder='x'", "syntax error"),
        ("cd(x=1, x=2)", "given twice"),
        ("cd", "expected a function call"),
        ("cd(x=b'1')", "bytes"),
        ("cd(x=1j)", "complex"),
        ("cd(x=" + "9" * 40 + ")", "digits"),
        ("cd(x=" + "[" * 40 + "]" * 40 + ")", "nesting"),
        ("cd(x='" + "a" * 70_000 + "')", "limit"),
        ("cd(x='\x00')", "null bytes"),
    ],
)
def test_refused_python_calls_carry_reasons(text, reason):
    result = parse_python_call(text)
    assert isinstance(result, CallError) and reason in result.reason, result


def test_a_call_past_the_syntax_node_limit_is_refused():
    nodes = parse_python_call("f(x=[" + "[1, 2, 3], " * 40 + "])", CallLimits(max_nodes=100))
    assert isinstance(nodes, CallError) and "syntax nodes" in nodes.reason


def test_json_calls():
    assert parse_call({"name": "cd", "arguments": {"folder": "x"}}) == ToolCall("cd", {"folder": "x"})
    assert parse_call('{"name": "cd", "arguments": "{\\"folder\\": \\"x\\"}"}') == ToolCall("cd", {"folder": "x"})
    assert parse_call({"name": "pwd", "arguments": ""}) == ToolCall("pwd", {})
    for bad, reason in [({"name": "__init__"}, "private"), ({"name": "cd", "arguments": [1]}, "object"),
                        ({"name": "cd", "arguments": "{"}, "not valid JSON"), ({"name": "cd", "x": 1}, "unexpected keys"),
                        ({"name": "cd", "arguments": {"not an identifier": 1}}, "identifier"), (42, "string or a JSON")]:
        result = parse_call(bad)
        assert isinstance(result, CallError) and reason in result.reason, (bad, result)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_never_raises(text):
    result = parse_call(text)
    assert isinstance(result, (ToolCall, CallError))
    if isinstance(result, ToolCall):
        assert result.name.isidentifier() and not result.name.startswith("_")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True).filter(lambda s: not keyword.iskeyword(s)),
       st.dictionaries(st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True).filter(lambda s: not keyword.iskeyword(s)),
                       json_values, max_size=4))
def test_python_rendering_round_trips(name, arguments):
    # Python keywords (`or`, `if`) cannot name a function or an argument in a Python call: not a round trip case.
    call = ToolCall(name, arguments)
    assert parse_python_call(call.to_python()) == call
    assert parse_call({"name": name, "arguments": arguments}) == call
