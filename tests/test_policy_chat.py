"""Chat rendering: tool schemas, call formatting, demonstrations, and the pieces between replies."""

from __future__ import annotations

import pytest

from coevolve.calls import parse_call
from coevolve.envs import make_env
from coevolve.policy.chat import ChatRenderer, TemplateError, build_demonstrations, format_calls, to_openai_tools
from coevolve.policy.replies import split_reply
from coevolve.records import ToolCall


def test_bfcl_docs_become_json_schema_tools():
    doc = {"name": "mv", "description": "Move.", "parameters": {"type": "dict", "properties": {
        "source": {"type": "string"}, "ratio": {"type": "float"}, "pair": {"type": "tuple", "items": {"type": "any"}}},
        "required": ["source"]}, "response": {"type": "dict"}}
    (tool,) = to_openai_tools([doc])
    assert tool["type"] == "function" and tool["function"]["name"] == "mv"
    parameters = tool["function"]["parameters"]
    assert parameters["type"] == "object" and "response" not in tool["function"]
    assert parameters["properties"]["ratio"]["type"] == "number"
    assert parameters["properties"]["pair"] == {"type": "array", "items": {"type": "string"}}


@pytest.mark.parametrize("reply_format", ["python", "hermes", "code"])
def test_formatted_calls_split_and_parse_back(reply_format):
    docs = [{"name": "sort", "parameters": {"properties": {"file_name": {"type": "string"}}}}]
    calls = [ToolCall("cd", {"folder": "a b'c"}), ToolCall("sort", {}, ("x.txt",)), ToolCall("ls", {"a": True})]
    text = format_calls(calls, reply_format, docs)
    parsed = [parse_call(t) for t in split_reply(text, reply_format).call_texts]
    assert [(c.name, dict(c.arguments)) for c in parsed] == [
        ("cd", {"folder": "a b'c"}), ("sort", {"file_name": "x.txt"}), ("ls", {"a": True})]


def test_code_format_writes_a_code_tools_code_as_a_block(tokenizer):
    from coevolve.envs.appworld import EXECUTE_DOC, code_of

    cell = "token = apis.spotify.login(username='a', password='b')\nprint(token)"
    text = format_calls([ToolCall("execute", {"code": cell})], "code")
    assert text == f"```python\n{cell}\n```"
    [call_text] = split_reply(text, "code").call_texts
    assert code_of(call_text) == cell  # what AppWorld's episode runs
    renderer = ChatRenderer(tokenizer, "code")
    system = renderer.opening_messages([EXECUTE_DOC], [{"role": "user", "content": "go"}])[0]["content"]
    assert "```python code block" in system and "execute" in system


def test_tools_go_to_the_system_prompt_when_the_template_ignores_them(tokenizer):
    env = make_env("bfcl-lite", split="train")
    episode = env.reset(env.tasks()[0])
    for reply_format, marker in (("python", "[func_name1(param1=value1"), ("hermes", "<tools>")):
        renderer = ChatRenderer(tokenizer, reply_format)
        assert not renderer.template_takes_tools
        prompt = renderer.render_prompt(renderer.opening_messages(episode.tools(), episode.user_messages()))
        assert marker in prompt and '"name": "mkdir"' in prompt and prompt.endswith("<|im_start|>assistant\n")
        assert '"name": "grep"' not in prompt  # excluded functions stay hidden


def test_continuation_skips_the_end_token_the_model_already_wrote(tokenizer):
    renderer = ChatRenderer(tokenizer, "python")
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    tool = [{"role": "tool", "content": "RESULT"}]
    after_stop = tokenizer.decode(renderer.continuation(tool, reply_ended_with=end))
    after_cut = tokenizer.decode(renderer.continuation(tool))
    assert after_stop == "\n<|im_start|>tool\nRESULT<|im_end|>\n<|im_start|>assistant\n"
    assert after_cut == "<|im_end|>" + after_stop
    assert renderer.stop_token_ids() == [end]


def test_a_template_that_rewrites_history_is_refused(tokenizer):
    import copy

    rewriting = copy.deepcopy(tokenizer)
    # Renders only the last message: appending one changes everything before it.
    rewriting.chat_template = "{{ messages[-1]['content'] }}{% if add_generation_prompt %}<|im_start|>{% endif %}"
    with pytest.raises(TemplateError, match="changes what follows a reply"):
        ChatRenderer(rewriting, "python").continuation([{"role": "tool", "content": "x"}])


def test_demonstrations_are_real_solved_conversations():
    env = make_env("bfcl-lite", split="train")
    demos = build_demonstrations(env, env.tasks(), "python", 3)
    assert len(demos) == 3
    first_tools = {demo[1]["content"].split("(")[0].lstrip("[") for demo in demos}
    assert len(first_tools) == 3  # they cover different tools
    for demo in demos:
        roles = [m["role"] for m in demo]
        assert roles[0] == "user" and roles[1] == "assistant" and roles[-1] == "assistant" and "tool" in roles
        assert demo[-1]["content"] == "Done."
        assert all(not m["content"].startswith("Error during") and "\"error\"" not in m["content"]
                   for m in demo if m["role"] == "tool")
    assert build_demonstrations(env, env.tasks(), "python", 0) == ()


def test_coverage_demonstrations_show_the_most_tools_and_a_multi_call_task():
    env = make_env("bfcl-lite", split="train")
    tasks = env.tasks()
    demos = build_demonstrations(env, tasks, "python", 4, choice="coverage")
    replies = [demo[1]["content"] for demo in demos]
    # The first pick is the first two-call task (two new tools); each later one adds a tool not shown yet.
    first_two_call = next(task for task in tasks if len(task.ground_truth[0]) == 2)
    assert demos[0][0]["content"] == first_two_call.turns[0][0]["content"]
    assert replies[0].count("(") == 2 and replies[0].startswith("[cd(")
    shown = [{call.split("(")[0].lstrip("[ ") for call in reply.strip("[]").split("), ")} for reply in replies]
    for index in range(1, len(shown)):
        assert shown[index] - set().union(*shown[:index]), replies  # every example shows a new tool
    assert len(set().union(*shown)) == 5  # cd, its companion, and three more tools
    # The default keeps the earlier choice (first tools in order), so existing prompts do not change.
    assert build_demonstrations(env, tasks, "python", 3) == build_demonstrations(env, tasks, "python", 3, "first-tool")
    # ... which on this split shows one call per example: the reason `coverage` exists.
    assert all(demo[1]["content"].count("(") == 1 for demo in build_demonstrations(env, tasks, "python", 3))
    with pytest.raises(ValueError, match="unknown demonstration choice"):
        build_demonstrations(env, tasks, "python", 3, choice="best")


def test_signatures_tool_style_lists_each_tool_on_one_line(tokenizer):
    from coevolve.envs.bfcl_lite import BFCLLiteEnv
    from coevolve.policy.chat import ChatRenderer, tool_signature

    env = BFCLLiteEnv("train")
    episode = env.reset(env.tasks()[0])
    docs, user = episode.tools(), episode.user_messages()
    assert tool_signature(next(d for d in docs if d["name"] == "ls")) == \
        "- ls(a: boolean = false): List the contents of the current directory."
    assert tool_signature(next(d for d in docs if d["name"] == "cd")) == \
        "- cd(folder: string): Change the current working directory to the specified folder."
    compact = ChatRenderer(tokenizer, "python", tool_style="signatures")
    full = ChatRenderer(tokenizer, "python")
    system = compact.opening_messages(docs, user)[0]["content"]
    assert "Here are the functions you can call:" in system and "Gorilla" not in system
    # One line per tool in both styles; the JSON list adds its `[` and `]` lines.
    assert len(system.splitlines()) == len(full.opening_messages(docs, user)[0]["content"].splitlines()) - 2
    short, long = compact.prompt_ids(compact.opening_messages(docs, user)), full.prompt_ids(
        full.opening_messages(docs, user))
    assert len(short) < 0.5 * len(long)  # the BFCL boilerplate repeated in every doc is gone


def test_the_signatures_style_shows_an_enums_choices_not_just_its_type():
    from coevolve.policy.chat import tool_signature

    doc = {"name": "set_unit", "description": "Set the unit.",
           "parameters": {"type": "dict", "required": ["unit"], "properties": {
               "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
               "level": {"type": "integer", "enum": list(range(20)), "default": 3}}}}
    line = tool_signature(doc)
    assert 'unit: "celsius"|"fahrenheit"' in line
    assert "level: 0|1|2|3|4|5|6|7|8|9|10|11|... = 3" in line
