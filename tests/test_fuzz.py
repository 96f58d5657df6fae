"""Fuzz the two things a user writes: their own tools (a class and a task file, generated at random) and YAML configs.
Whatever comes, the CLI answers with exit 0, or a refusal (exit 1 or 2) in one line: never a traceback, a hang or a
silent exit (a SystemExit escaping `main` would fail the example, as would any exception)."""

from __future__ import annotations

import itertools
import json
import sys
import textwrap
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coevolve.cli import main

REPO = Path(__file__).resolve().parent.parent
# Mostly well-formed, so that many examples get past loading and their tasks run (the odd ones are still there).
NAMES = st.sampled_from(["a", "b", "item", "count", "name", "add", "look", "reset", "state", "get_reward", "_hidden"])
HINTS = st.sampled_from(["int", "int", "str", "str", "float", "bool", "list[str]", "dict", "Optional[int]", "Any",
                         "", "set", "Literal['a', 'b']", "'NoSuchType'"])
BODIES = st.sampled_from([
    "return {arg}", "return {arg}", "self.log.append({arg})\n        return len(self.log)", "return None",
    "return {{'k': [{arg}]}}", "raise ValueError('no')", "sys.exit(3)", "raise KeyboardInterrupt",
    "return set([1, 2])", "return object()", "return 1 / 0", "os._exit(0)",
])
ORDER = {"p": 0, "q": 1, "*args": 2, "**kw": 3}
_modules = itertools.count()


@st.composite
def tool_class(draw) -> tuple[str, list[str]]:
    """Python source of a class `Tools` with random methods (hints, docstrings, bodies, async), and its names."""
    methods, names = [], []
    clean = draw(st.booleans())  # half the classes are well formed, so their tasks get to run
    for name in draw(st.lists(NAMES.filter(lambda n: not clean or n[0] != "_" and n not in ("reset", "state",
                                                                                              "get_reward")),
                              min_size=1, max_size=4, unique=True)):
        options = ["p", "q"] if clean else ["p", "p", "q", "*args", "**kw"]
        params = sorted(draw(st.lists(st.sampled_from(options), max_size=2, unique=True)), key=ORDER.get)
        hints = [draw(st.sampled_from(["int", "str", "Optional[int]"]) if clean else HINTS) for _ in params]
        signature = ", ".join(["self"] + [f"{p}: {h}" if h and not p.startswith("*") else p
                                          for p, h in zip(params, hints)])
        body = draw(BODIES).format(arg=next((p for p in params if not p.startswith("*")), "1"))
        doc = draw(st.sampled_from(['"""Do it."""', '"""Do it.\n\n        Args:\n            p: the p.\n        """']
                                   + ([] if clean else [""])))
        prefix = draw(st.sampled_from(["def"] * 6 + ([] if clean else ["async def"])))
        methods.append(f"    {prefix} {name}({signature}) -> Any:\n        {doc}\n        {body}\n")
        names.append(name)
    init = draw(st.sampled_from(["    def __init__(self):\n        self.log = []\n"] * 3 + ([] if clean else [
        "    def __init__(self, needed):\n        self.log = []\n", "    log: list = []\n"])))
    source = ("import os, sys\nfrom typing import Any, Literal, Optional\n\n\nclass Tools:\n    \"\"\"Fuzzed tools.\"\"\"\n\n"
              + init + "\n" + "\n".join(methods))
    return source, names


def call_text(names: list[str]):
    return st.one_of(st.sampled_from(names).map(lambda n: f"{n}()"), st.sampled_from(names).map(lambda n: f"{n}(p=1)"),
                     st.tuples(st.sampled_from(names), st.sampled_from(["1", "'x'", "[1]", "p=2", "q='a'", "1, 2"]))
                     .map(lambda pair: f"{pair[0]}({pair[1]})"),
                     st.text(max_size=20))


@st.composite
def task_rows(draw, names: list[str]) -> list:
    rows = []
    if draw(st.booleans()):  # half the task files are well formed: one-turn tasks calling the class's methods
        for index in range(draw(st.integers(1, 3))):
            calls = draw(st.lists(st.sampled_from(names).map(lambda n: f"{n}(p=1)"), min_size=1, max_size=2))
            rows.append({"id": f"t{index}", "query": f"Do {index}.", "ground_truth": [calls]})
        return rows
    for index in range(draw(st.integers(1, 3))):
        row: dict = draw(st.sampled_from([{"query": "Do it."}] * 3 + [{"turns": [["One."], ["Two."]]}, {},
                                                                       {"query": 3}]))
        turns = len(row.get("turns", [[0]]))
        truth = draw(st.one_of(st.lists(st.lists(call_text(names), max_size=2), min_size=turns, max_size=turns),
                               st.text(max_size=10), st.none()))
        if truth is not None:
            row["ground_truth"] = truth
        if draw(st.integers(0, 3)) == 0:
            row["reset"] = draw(st.sampled_from([{}, {"seed": 1}, "x", {"needed": 2}]))
        if draw(st.booleans()):
            row["id"] = draw(st.sampled_from(["t", "u", str(index)]))
        if draw(st.integers(0, 3)) == 0:
            row["split"] = draw(st.sampled_from(["train", "test", "dev"]))
        rows.append(row)
    if draw(st.integers(0, 4)) == 0:
        rows.append(draw(st.sampled_from(["not an object", [1, 2], None])))
    return rows


def answered(code: int, capsys) -> None:
    """Exit 0, or 1/2 with a refusal of one line on stderr; nothing else (a traceback would have raised)."""
    captured = capsys.readouterr()
    assert code in (0, 1, 2), code
    assert "Traceback" not in captured.err + captured.out
    if code == 2:
        assert len(captured.err.strip().splitlines()) == 1, captured.err


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                    HealthCheck.too_slow])
@given(data=st.data())
def test_random_tool_classes_and_task_files_are_answered_or_refused(tmp_path, monkeypatch, capsys, data):
    source, names = data.draw(tool_class())
    rows = data.draw(task_rows(names))
    module = f"fuzzed_tools_{next(_modules)}"
    (tmp_path / f"{module}.py").write_text(source)
    (tmp_path / "tasks.jsonl").write_text("".join((json.dumps(row) if not isinstance(row, str) else row) + "\n"
                                                  for row in rows))
    monkeypatch.chdir(tmp_path)
    if str(tmp_path) not in sys.path:
        monkeypatch.syspath_prepend(str(tmp_path))
    answered(main(["env", "check", f"{module}:Tools", "--tasks", "tasks.jsonl"]), capsys)
    answered(main(["eval", "--env", f"python:{module}:Tools", "--tasks", "tasks.jsonl", "--policy", "oracle",
                   "--json"]), capsys)


SECTIONS = ["run", "env", "model", "rollout", "grpo", "loop", "signals", "synthesis", "lora", "nosuch"]
KEYS = ["mode", "max_steps", "seed", "name", "split", "options", "group_size", "learning_rate", "guidance",
        "unexplored", "eval_limit", "theta_percent", "demos", "enabled", "x"]
VALUES = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True),
                                st.text(max_size=12), st.sampled_from(["static", "coevolve", "auto", "solution",
                                                                       "bfcl-lite", "smollm2", "nosuch"])),
                      lambda inner: st.one_of(st.lists(inner, max_size=3),
                                              st.dictionaries(st.sampled_from(KEYS), inner, max_size=3)),
                      max_leaves=8)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(config=st.one_of(st.dictionaries(st.sampled_from(SECTIONS), st.one_of(
           st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=4), VALUES), max_size=4),
           VALUES), mangle=st.one_of(st.none(), st.text(alphabet="&*[]{}:!|>-'\"\n ", max_size=8)))
def test_random_yaml_configs_are_answered_or_refused(tmp_path, capsys, config, mangle):
    text = yaml.safe_dump(config)
    if mangle is not None:  # broken YAML, anchors and aliases included
        text = mangle + text if len(text) % 2 else text + mangle
    path = tmp_path / "config.yaml"
    path.write_text(text)
    answered(main(["train", "--config", str(path), "--dry-run", "--output-dir", str(tmp_path / "run")]), capsys)
    assert not (tmp_path / "run").exists()  # a dry run writes nothing


def test_the_fuzzers_reach_both_outcomes(tmp_path, monkeypatch, capsys):
    """What the fuzz asserts is not vacuous: a good class and config exit 0, bad ones are refused."""
    good = textwrap.dedent('''
        class Tools:
            """Tools."""

            def __init__(self):
                self.log = []

            def add(self, p: int) -> int:
                """Add p."""
                self.log.append(p)
                return len(self.log)
    ''')
    (tmp_path / "good_fuzz_tools.py").write_text(good)
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"id": "t", "query": "Add.", "ground_truth": [["add(p=1)"]]})
                                          + "\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["env", "check", "good_fuzz_tools:Tools", "--tasks", "tasks.jsonl"]) == 0
    assert main(["train", "--config", str(REPO / "configs" / "quickstart.yaml"), "--dry-run", "--output-dir",
                 str(tmp_path / "run")]) == 0
    capsys.readouterr()
    (tmp_path / "bad.yaml").write_text("run: [1\n")
    assert main(["train", "--config", str(tmp_path / "bad.yaml"), "--dry-run"]) == 2
