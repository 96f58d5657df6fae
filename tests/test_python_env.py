"""Your own tools as an env: schemas from hints and docstrings, the two examples solved by their ground truth, a
TRL `environment_factory`-style class unchanged, hostile calls refused, synthesis on a class it has never seen,
one GRPO iteration, and `coevolve env check` saying what is wrong."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Literal, Optional

import pytest

from coevolve.cli import main
from coevolve.envs import make_env
from coevolve.envs.python_env import EnvDefinitionError, PythonEnv, check_env, tool_docs

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = {"shop": ("examples.shop.shop:Shop", REPO / "examples" / "shop" / "tasks.jsonl"),
            "calendar": ("examples.calendar.calendar_app:Calendar", REPO / "examples" / "calendar" / "tasks.jsonl")}
sys.path.insert(0, str(REPO))


class Library:
    """A lending library."""

    def __init__(self) -> None:
        self.loans: dict = {}

    def lend(self, title: str, member: str, days: int = 14, kind: Literal["book", "film"] = "book",
             note: Optional[str] = None) -> str:
        """Lend a title to a member.

        Args:
            title: The title to lend.
            member: Who borrows it.
            days: For how long.
            kind: What it is.
            note: Anything to remember.
        """
        self.loans[title] = member
        return f"{title} lent to {member}"

    def count(self, shelf: list[str]) -> int:
        """Count titles on a shelf.

        Parameters
        ----------
        shelf : list of str
            The titles.
        """
        return len(shelf)


def test_schemas_come_from_type_hints_and_google_or_numpy_docstrings():
    lend, count = tool_docs(Library)
    assert lend["name"] == "lend" and lend["description"] == "Lend a title to a member."
    properties = lend["parameters"]["properties"]
    assert lend["parameters"]["required"] == ["title", "member"]
    assert properties["days"] == {"type": "integer", "description": "For how long.", "default": 14}
    assert properties["kind"]["enum"] == ["book", "film"] and properties["note"]["type"] == "string"
    assert count["parameters"]["properties"]["shelf"] == {"type": "array", "items": {"type": "string"},
                                                          "description": "The titles."}


@pytest.mark.parametrize("source, message", [
    ("def go(self, where):\n    'Go somewhere.'\n    return where", "Broken.go: argument 'where' has no type hint"),
    ("def go(self, where: str):\n    return where", "Broken.go has no docstring"),
])
def test_a_method_without_hints_or_docstring_is_refused_by_name(source, message):
    namespace: dict = {}
    exec(compile("class Broken:\n" + textwrap.indent(source, "    "), "<test>", "exec"), namespace)  # test code
    with pytest.raises(EnvDefinitionError, match=message):
        tool_docs(namespace["Broken"])


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_each_example_is_solved_by_its_ground_truth_through_the_cli(example, capsys):
    spec, tasks = EXAMPLES[example]
    code = main(["eval", "--env", f"python:{spec}", "--tasks", str(tasks), "--policy", "oracle", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["accuracy"] == 1.0 and report["n"] >= 12
    assert check_env(spec, str(tasks)) == []


TRL_STYLE = '''
class Counter:
    """The environment_factory style TRL documents: tools are documented public methods, reset(**row) starts."""

    def __init__(self):
        self.value = 0
        self.target = 0

    def reset(self, target: int = 3, **row) -> str:
        self.value, self.target = 0, target
        return f"Reach {target}."

    def increment(self, by: int) -> int:
        """Add to the counter.

        Args:
            by: How much to add.
        """
        self.value += by
        return self.value

    def get_reward(self) -> float:
        return 1.0 if self.value == self.target else 0.0
'''


def test_a_trl_environment_factory_class_works_unchanged(tmp_path, monkeypatch):
    (tmp_path / "counter_env.py").write_text(TRL_STYLE)
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"id": "c", "query": "Count up.", "reset": {"target": 3}}) + "\n")
    monkeypatch.chdir(tmp_path)
    env = make_env("python", cls="counter_env:Counter", tasks="tasks.jsonl")
    [task] = env.tasks()
    episode = env.reset(task)
    assert episode.user_messages()[0]["content"] == "Count up.\n\nReach 3."  # what reset returned joins the prompt
    assert [doc["name"] for doc in episode.tools()] == ["increment"]  # reset and the reward are never tools
    episode.act(["increment(by=1)", "increment(by=2)"])
    episode.end_turn()
    assert episode.score().value == 1.0  # no ground truth: the class's own reward
    again = env.reset(task)
    again.act(["increment(by=5)"])
    again.end_turn()
    assert again.score().value == 0.0 and episode.state() == {"value": 3, "target": 3}


HOSTILE = ["__import__('os').system('touch /tmp/pwned')", "reset(stock={})", "get_reward()", "_private()",
           "add_to_cart(item=open('/etc/passwd').read())", "add_to_cart(item='apple', quantity=10**100)",
           "checkout.__globals__", "add_to_cart(**{'item': 'apple'})", "list_items(" + "1," * 3000 + ")",
           '{"name": "__init__", "arguments": {}}', "stock.clear()", "add_to_cart('apple', 1, 2, 3)",
           "refund(order=lambda: 1)", "add_to_cart(item=[i for i in range(10)])"]


def test_hostile_calls_are_refused_with_a_reason_and_nothing_runs(tmp_path):
    spec, tasks = EXAMPLES["shop"]
    env = PythonEnv(spec, tasks=str(tasks))
    task = env.tasks()[0]
    episode = env.reset(task)
    before = episode.state()
    steps = episode.act(HOSTILE)
    assert len(steps) == len(HOSTILE) and all(step.error for step in steps), [s.error for s in steps if not s.error]
    assert episode.state() == before and not Path("/tmp/pwned").exists()
    # A tool's own exception is an observation too, and the episode goes on.
    [bad, good] = episode.act(["add_to_cart(item='caviar')", "add_to_cart(item='apple')"])
    assert "no item 'caviar'" in bad.error and good.error is None


def test_synthesis_writes_validated_tasks_for_a_class_it_has_never_seen(tmp_path):
    from coevolve.abstract import TemplateAbstractor
    from coevolve.evaluate import evaluate, oracle_script
    from coevolve.explore import ExploreConfig, OfflineExplorer, random_contexts
    from coevolve.pool import TaskPool
    from coevolve.synthesis import synthesis_phase
    from coevolve.validate import Validator

    spec, tasks_path = EXAMPLES["calendar"]
    env = PythonEnv(spec, tasks=str(tasks_path), split="train")
    tasks = env.tasks()
    result = synthesis_phase(env, random_contexts(tasks, 8, 1, 0), {t.id: t for t in tasks},
                             OfflineExplorer(ExploreConfig(step_budget=6, focus_weight=0.3)), TemplateAbstractor(),
                             Validator(env, known=tasks), iteration=1)
    admitted = result.admitted
    assert admitted and all(t.provenance.source == "synthetic" and t.provenance.parent_id and t.provenance.episode_id
                            for t in admitted)
    assert evaluate(env, list(admitted), oracle_script, "oracle").accuracy == 1.0
    assert result.rejected_by_code()  # and some were found wanting by running them
    with TaskPool(tmp_path / "pool.sqlite") as pool:
        pool.add_tasks(tasks, 0)
        pool.add_tasks(admitted, 1)
        assert len(pool.tasks_at(1, source="synthetic")) == len(admitted)


def test_one_grpo_iteration_on_your_own_tools(tmp_path, tiny_dir):
    from coevolve.loop import run

    spec, tasks = EXAMPLES["shop"]
    out = tmp_path / "shop"
    result = run(str(REPO / "examples" / "shop" / "config.yaml"), [
        f"model.name={tiny_dir}", "model.device=cpu", f"env.options.tasks={tasks}", "rollout.max_new_tokens=8",
        "rollout.max_replies_per_turn=1", "rollout.max_episode_tokens=64", "grpo.prompts_per_step=2",
        "run.max_steps=1", "loop.steps_per_iteration=1", "loop.eval_limit=2"], str(out), say=lambda text: None)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert result.final_step == 1 and [m["iteration"] for m in metrics] == [0, 1]


NONDETERMINISTIC = '''
import random

class Dice:
    """A die."""

    def __init__(self):
        self.last = 0

    def roll(self) -> int:
        """Roll it."""
        self.last = random.randint(1, 10**9)
        return self.last

    def wait(self) -> None:
        """Wait a moment."""
'''


def test_env_check_says_what_is_wrong_in_plain_words(tmp_path, monkeypatch, capsys):
    (tmp_path / "dice.py").write_text(NONDETERMINISTIC)
    rows = [{"id": "roll", "query": "Roll.", "ground_truth": [["roll()"]]},
            {"id": "bad-reset", "query": "Roll.", "reset": {"sides": 6}, "ground_truth": [["roll()"]]},
            {"id": "fails", "query": "Roll.", "ground_truth": [["roll(times=2)"]]},
            {"id": "idle", "query": "Wait.", "ground_truth": [["wait()"]]}]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    monkeypatch.chdir(tmp_path)
    code = main(["env", "check", "dice:Dice", "--tasks", "tasks.jsonl"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert code == 1 and len(lines) == 4, lines
    assert "task 'roll': two runs of its ground truth end differently" in lines[0]
    assert "task 'bad-reset': gives reset arguments, but Dice has no reset()" in lines[1]
    assert "task 'fails': ground truth call 'roll(times=2)' fails" in lines[2]
    assert "task 'idle': its ground truth changes nothing and returns nothing" in lines[3]
    assert main(["env", "check", "dice:Nope", "--tasks", "tasks.jsonl"]) == 1
    assert "has no class Nope" in capsys.readouterr().out


def test_fuzzed_calls_never_raise_and_only_tools_ever_run():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    spec, tasks = EXAMPLES["shop"]
    env = PythonEnv(spec, tasks=str(tasks))
    task = env.tasks()[0]
    tools = {doc["name"] for doc in env.docs}
    names = st.sampled_from(sorted(tools) + ["reset", "get_reward", "__init__", "_x", "open", "eval", "stock"])
    texts = st.one_of(st.text(max_size=60), st.builds(lambda n, a: f"{n}({a})", names, st.text(max_size=30)),
                      st.builds(lambda n, v: {"name": n, "arguments": v}, names,
                                st.dictionaries(st.text(max_size=6), st.integers() | st.text(max_size=6), max_size=3)))

    @settings(max_examples=300, deadline=None)
    @given(calls=st.lists(texts, min_size=1, max_size=4))
    def run(calls):
        episode = env.reset(task)
        for step in episode.act(calls):
            assert step.error is not None or (step.call is not None and step.call.name in tools)

    run()


def test_a_module_in_the_working_directory_never_shadows_an_installed_one(tmp_path, monkeypatch):
    """The current directory comes last on sys.path: a `json.py` there is not what `import json` finds, while the
    user's own module (a name nothing installed has) still imports from it."""
    import importlib

    (tmp_path / "textwrap.py").write_text("raise SystemExit('the working directory shadowed textwrap')\n")
    (tmp_path / "my_tools_xyz.py").write_text(TRL_STYLE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "textwrap")
    from coevolve.envs.python_env import load_class

    assert load_class("my_tools_xyz:Counter").__name__ == "Counter"
    assert sys.path[-1] == str(tmp_path)
    assert importlib.import_module("textwrap").__file__ != str(tmp_path / "textwrap.py")
    for spec, said in (("../dir/mod:Class", "dotted names only"), ("mod:", "expected package.module:ClassName")):
        with pytest.raises(EnvDefinitionError, match=said):
            load_class(spec)
    (tmp_path / "broken_tools_xyz.py").write_text("raise RuntimeError('half-written module')\n")
    with pytest.raises(EnvDefinitionError, match="importing broken_tools_xyz raised RuntimeError"):
        load_class("broken_tools_xyz:Anything")
