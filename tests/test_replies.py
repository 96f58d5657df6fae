"""Splitting model replies into call texts: valid, partial and hostile replies in both formats."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coevolve.envs.bfcl import BFCLEnv, load_tasks
from coevolve.policy.replies import MAX_CALLS_PER_REPLY, split_reply


@pytest.mark.parametrize(
    "text, calls, content",
    [
        ('<tool_call>\n{"name": "cd", "arguments": {"folder": "x"}}\n</tool_call>',
         ['{"name": "cd", "arguments": {"folder": "x"}}'], ""),
        ('I will list.<tool_call>{"name": "ls", "arguments": {}}</tool_call><tool_call>{"name": "pwd", '
         '"arguments": {}}</tool_call> done', ['{"name": "ls", "arguments": {}}', '{"name": "pwd", "arguments": {}}'],
         "I will list. done"),
        ('<tool_call>{"name": "cd", "argum', ['{"name": "cd", "argum'], ""),  # cut off by the token limit
        ("<tool_call></tool_call>", [""], ""),
        ("No tools needed: the answer is 4.", [], "No tools needed: the answer is 4."),
        ("<tool_call>{bad json}</tool_call>", ["{bad json}"], ""),
    ],
)
def test_hermes(text, calls, content):
    reply = split_reply(text, "hermes")
    assert list(reply.call_texts) == calls and reply.content == content


@pytest.mark.parametrize(
    "text, calls",
    [
        ("[cd(folder='x'), ls(a=True)]", ["cd(folder='x')", "ls(a=True)"]),
        ("cd(folder='x')", ["cd(folder='x')"]),
        ("```python\n[mkdir(dir_name='a b')]\n```", ["mkdir(dir_name='a b')"]),
        ("  [ touch(file_name='[x].txt') ]  ", ["touch(file_name='[x].txt')"]),
        ("[cd(folder='x'), ls(", ["[cd(folder='x'), ls("]),  # unparseable attempt: handed over whole
        ("[cd(folder=pwd())]", ["cd(folder=pwd())"]),  # split here, refused by the env (nested call)
        ("The folder is empty.", []),
        ("```python\nimport os\nos.system('ls')\n```", []),  # code that is not a call list: talk, no call
        ("[]", []),
        ("", []),
    ],
)
def test_python(text, calls):
    assert list(split_reply(text, "python").call_texts) == calls


@pytest.mark.parametrize(
    "text, calls, content",
    [
        ("Look first.\n```python\nprint(1)\nx = 2\n```\nthen\n```\nprint(x)\n```", ["print(1)\nx = 2", "print(x)"],
         "Look first.\n\nthen"),
        ("```python\nfor i in range(3):\n    print(i)\n```", ["for i in range(3):\n    print(i)"], ""),
        ("```python\nprint(apis.spot", ["print(apis.spot"], ""),  # left open at the token limit: still an attempt
        ("```python\n```", [], ""),
        ("All done, the note is saved.", [], "All done, the note is saved."),
        ("```python\ncd(folder='x')\n```", ["cd(folder='x')"], ""),  # BFCL's envs parse a block as a call
    ],
)
def test_code(text, calls, content):
    reply = split_reply(text, "code")
    assert list(reply.call_texts) == calls and reply.content == content


def test_too_many_calls_are_cut_and_flagged():
    reply = split_reply("[" + "ls(), " * (MAX_CALLS_PER_REPLY + 5) + "]", "python")
    assert len(reply.call_texts) == MAX_CALLS_PER_REPLY and reply.truncated


def test_unknown_format():
    with pytest.raises(ValueError, match="unknown reply format"):
        split_reply("x", "xml")


def test_split_calls_run_in_the_env_with_reasons_for_the_bad_ones():
    task = next(t for t in load_tasks("base") if t.meta["involved_classes"] == ["GorillaFileSystem"])
    episode = BFCLEnv("base").reset(task)
    hermes = split_reply('<tool_call>{"name": "ls", "arguments": {"a": true}}</tool_call>'
                         '<tool_call>{"name": "ls", "arguments": </tool_call>', "hermes")
    good, bad = episode.act(hermes.call_texts)
    assert good.error is None and "current_directory_content" in good.observation
    assert "invalid JSON" in bad.error
    python = split_reply("[ls(a=True), __import__('os')]", "python")
    good, bad = episode.act(python.call_texts)
    assert good.error is None and "private" in bad.error
    code = split_reply("```python\nls(a=True)\n```\n```python\nimport os\n```", "code")
    good, bad = episode.act(code.call_texts)
    assert good.error is None and bad.error is not None


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300), st.sampled_from(["hermes", "python", "code"]))
def test_any_text_splits_without_raising(text, reply_format):
    reply = split_reply(text, reply_format)
    assert len(reply.call_texts) <= MAX_CALLS_PER_REPLY
    assert all(isinstance(call, str) for call in reply.call_texts)
