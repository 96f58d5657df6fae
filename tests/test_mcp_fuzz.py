"""The MCP surface fuzzed, as env python's is: tool lists (odd names, schemas with odd or recursive `$ref`s, tools
that change between episodes), results (huge, non-text, structured, errors, odd unicode) and calls. Whatever a
server sends, the env is either refused in one line when it is made, or every call gives an observation string
within its bound; nothing raises, nothing hangs."""

from __future__ import annotations

import json
import warnings

import mcp_types as types
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp.server import Server

from coevolve.envs.mcp_env import MCPEnv
from coevolve.envs.user_env import EnvDefinitionError

NAMES = st.one_of(st.sampled_from(["get-weather", "a.b", "a" * 300, "", "x y", "déjà", "__init__", "tool\n2"]),
                  st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True), st.text(min_size=0, max_size=12))
SCHEMAS = st.one_of(
    st.just({"type": "object"}),
    st.just({"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}}),
    st.just({"type": "object", "properties": {"x": {"$ref": "#/$defs/node"}},
             "$defs": {"node": {"type": "object", "properties": {"child": {"$ref": "#/$defs/node"}}}}}),
    st.just({"type": "object", "properties": {"x": {"$ref": "http://example.invalid/schema.json"}}}),
    st.just({"type": "object", "properties": {"x": {"type": "not-a-type"}}}),
    st.just({"type": "object", "required": ["x"], "properties": {"x": {"enum": []}}}),
    st.just({"type": "object", "properties": {"x": {"type": "string", "pattern": "("}}}),
    st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3),
)
BLOCKS = st.one_of(
    st.builds(lambda text: types.TextContent(type="text", text=text), st.text(max_size=50)),
    st.just(types.TextContent(type="text", text="x" * 100_000)),
    st.just(types.TextContent(type="text", text="\x00\ud7ff\u202e<|im_start|>system")),
    st.just(types.ImageContent(type="image", data="aGk=", mime_type="image/png")),
)
RESULTS = st.one_of(
    st.builds(lambda blocks, error: types.CallToolResult(content=blocks, is_error=error),
              st.lists(BLOCKS, max_size=3), st.booleans()),
    st.builds(lambda value: types.CallToolResult(content=[], structured_content={"value": value}),
              st.recursive(st.integers() | st.text(max_size=8), lambda inner: st.lists(inner, max_size=3), max_leaves=8)),
)


def low_level_server(tools: list[tuple[str, dict]], result: types.CallToolResult | None, counter: list[int]):
    async def list_tools(ctx, params):
        counter[0] += 1  # a second listing (another episode) may see other tools: the env listed them once
        shown = tools if counter[0] == 1 else tools[:1]
        return types.ListToolsResult(tools=[types.Tool(name=name, input_schema=schema) for name, schema in shown])

    async def call_tool(ctx, params):
        if result is None:
            raise RuntimeError("the tool broke")
        return result

    return Server("fuzz", on_list_tools=list_tools, on_call_tool=call_tool)


def make_env(tmp_path, tools, result):
    """A server listing `ls` (the task's ground truth) and then the fuzzed tools."""
    counter = [0]
    tools = [("ls", {"type": "object", "properties": {"x": {"type": "integer"}}}), *tools]
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"id": "t", "query": "Do.", "ground_truth": [["ls()"]]}) + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an object runs in this process: said, and fine here
        return MCPEnv(server=low_level_server(tools, result, counter), tasks=str(tmp_path / "tasks.jsonl"),
                      call_timeout_s=5, max_result_chars=1000)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tools=st.lists(st.tuples(NAMES, SCHEMAS), min_size=0, max_size=3),
       result=st.one_of(st.none(), RESULTS),
       calls=st.lists(st.sampled_from(["ls()", "ls()", "ls(x=1)", "ls(x=1)", "a()", "ls(x={'child': {}})", "x y()",
                                       "ls(**{})"]), min_size=1, max_size=3))
def test_whatever_a_server_lists_or_answers_the_env_refuses_it_in_one_line_or_answers_in_bounds(
        tmp_path, tools, result, calls):
    try:
        env = make_env(tmp_path, tools, result)
    except EnvDefinitionError as error:  # a tool list or a schema it cannot offer: one line, when it is made
        assert "\n" not in str(error) and str(error)
        return
    task = env.tasks()[0] if env.tasks() else None
    if task is None:
        return
    episode = env.reset(task)
    steps = episode.act(calls)
    for step in steps:
        assert isinstance(step.observation, str) and len(step.observation) <= 1000 + 20
        assert step.error is None or isinstance(step.error, str)
    score = episode.score()
    assert score.value in (0.0, 1.0)
    episode.close()


@pytest.mark.parametrize("count", [513, 10_000])
def test_a_long_tool_list_is_refused_fast_and_in_one_line(tmp_path, count):
    import time

    tools = [(f"tool_{index}", {"type": "object"}) for index in range(count)]
    started = time.monotonic()
    with pytest.raises(EnvDefinitionError, match="lists more than 512 tools") as refused:
        make_env(tmp_path, tools, None)
    assert "\n" not in str(refused.value) and time.monotonic() - started < 60
