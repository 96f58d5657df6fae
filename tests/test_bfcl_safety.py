"""Hostile input to the BFCL env: nothing escapes, nothing outside the episode is touched, state never leaks.

The fuzz test feeds more than 10,000 random and hostile call strings and JSON calls through `episode.act` with a
Python audit hook armed (PEP 578): any `exec` (what `eval`/`exec` raise), `open`, `os.*`, `subprocess.*`,
`socket.*`, `shutil.*` or `import` event (and a few more, see `_FORBIDDEN_PREFIXES`) during the run fails the
test. `compile` events are expected: `ast.parse` raises them while only building a syntax tree.
"""

from __future__ import annotations

import os
import random
import string
import sys

import pytest

from coevolve.envs.bfcl import BFCLEnv, load_tasks

_AUDIT = {"armed": False, "events": []}
# Events that would mean code ran, a file or process was touched, or a module was loaded on agent input.
_FORBIDDEN_PREFIXES = ("exec", "open", "os.", "subprocess.", "socket.", "shutil.", "import", "ctypes.", "pty.",
                       "urllib.", "http.", "webbrowser.", "builtins.input", "code.__new__", "function.__new__",
                       "sys._getframe", "sys.settrace", "sys.setprofile", "marshal.", "pickle.", "glob.", "tempfile.")


def _audit_hook(event: str, args) -> None:
    if _AUDIT["armed"] and event.startswith(_FORBIDDEN_PREFIXES):
        _AUDIT["events"].append((event, repr(args)[:200]))


sys.addaudithook(_audit_hook)  # hooks cannot be removed; it records only while armed


HOSTILE = [
    "__import__('os').system('touch /tmp/pwned')",
    "eval('1+1')",
    "exec('import os')",
    "open('/etc/passwd').read()",
    "compile('1', 'x', 'eval')",
    "globals()",
    "locals()",
    "vars()",
    "getattr(ls, '__globals__')",
    "ls.__globals__['os'].system('id')",
    "().__class__.__bases__[0].__subclasses__()",
    "[].__class__.__mro__[1].__subclasses__()",
    "__builtins__['eval']('1')",
    "ls(a=__import__('os').getcwd())",
    "cd(folder=open('/etc/passwd').read())",
    "cd(folder=pwd())",
    "cd(folder=(lambda: 'x')())",
    "cd(folder=[x for x in range(10)])",
    "cd(folder=f'{1+1}')",
    "cd(folder=(y := 'x'))",
    "cd(folder='a' + 'b')",
    "cd(folder='a' * 1000000)",
    "cd(folder='x' if True else 'y')",
    "cd(folder=os.sep)",
    "cd(*['x'])",
    "cd(**{'folder': 'x'})",
    "cd(folder=b'x')",
    "cd(folder=1j)",
    "cd(folder=...)",
    "cd(folder={1, 2})",
    "cd(folder={**{}})",
    "cd(folder=not True)",
    "cd(folder=~1)",
    "_load_scenario({})",
    "__init__()",
    "__class__()",
    "__dict__",
    "_random.random()",
    "self.cd(folder='x')",
    "GorillaFileSystem.cd(folder='x')",
    "cd.__call__(folder='x')",
    "cd(folder='x').__class__",
    "cd(folder='x')[0]",
    "cd(folder='x'); import os",
    "import os",
    "from os import system",
    "lambda: 0",
    "def f(): pass",
    "while True: pass",
    "cd(folder='x'",
    "cd(folder=='x')",
    "cd(folder='x',)(1)",
    "x = cd(folder='x')",
    "print('hello')",
    "input()",
    "breakpoint()",
    "exit()",
    "quit()",
    "help()",
    "kill(pid=1)",
    "remove(path='/')",
    "unlink(path='/etc/passwd')",
    "system(cmd='rm -rf /')",
    "popen(cmd='id')",
    "run(args=['id'])",
    "",
    "   ",
    "\x00",
    "cd(folder='\\x00')\x00",
    "cd(folder=" + "[" * 500 + "]" * 500 + ")",
    "cd(folder=" + "(" * 300 + "1" + ")" * 300 + ")",
    "cd(folder=" + "-" * 5000 + "1)",
    "cd(folder=" + "9" * 5000 + ")",
    "cd(folder=" + "9" * 30 + ")",
    "power(base=10, exponent=999999999999)",
    "power(base=999999999999, exponent=999999)",
    "logarithm(value=10, base=2, precision=100000000)",
    "square_root(number=2, precision=999999999)",
    "round_number(number=1.5, decimal_places=10000000)",
    "[" + "cd(folder='x'), " * 200 + "]",
    "cd(folder='x') " * 50,
    "ls(a=True, a=False)",
    "ls(nonexistent_argument=1)",
    "mean(numbers=" + str(list(range(20000))) + ")",
    "x" * 70000,
    "cd(folder='" + "A" * 1_000_000 + "')",
    "{\"name\": \"__class__\", \"arguments\": {}}",
    "{\"name\": \"cd\", \"arguments\": \"[1, 2]\"}",
    "{\"name\": \"cd\", \"arguments\": \"not json\"}",
    "{\"name\": \"cd\", \"arguments\": {\"folder\": " + "[" * 200 + "]" * 200 + "}}",
    "{\"name\": \"cd\", \"arguments\": {\"__class__\": 1}}",
    "{\"name\": \"cd\", \"arguments\": {\"folder\": \"x\"}, \"extra\": 1}",
    "{\"name\": 12, \"arguments\": {}}",
    "{\"name\": \"os.system\", \"arguments\": {\"command\": \"id\"}}",
    "{not json at all",
    "{\"name\": \"cd\", \"arguments\": {\"folder\": " + "9" * 5000 + "}}",
]

HOSTILE_OBJECTS = [
    {"name": "__init__", "arguments": {}},
    {"name": "eval", "arguments": {"source": "1"}},
    {"name": "cd", "arguments": ["x"]},
    {"name": "cd", "arguments": {"folder": {"nested": [1, {"deeper": None}]}, "1bad": 2}},
    {"name": None},
    {},
    {"arguments": {"folder": "x"}},
    {"name": "cd", "arguments": {"folder": "x"}, "code": "import os"},
    {"name": "ls", "arguments": {"a": 10 ** 40}},
]

NAMES = ["cd", "ls", "mkdir", "cat", "add", "power", "logarithm", "post_tweet", "send_message", "get_stock_info",
         "book_flight", "startEngine", "eval", "exec", "open", "__import__", "getattr", "system", "_private", "os",
         "__class__", "__subclasses__", "globals", "compile", "lambda"]
PAYLOADS = ["'x'", "1", "-1", "1.5", "True", "None", "[1, 2]", "{'a': 1}", "(1, 2)", "__import__('os')", "x",
            "x.y", "f()", "lambda: 1", "*a", "**k", "'a'*9", "open('/etc/passwd')", "[i for i in range(9)]",
            "{1}", "b'x'", "...", "1j", "not x", "'../../..'", "'/etc/passwd'", "'\\x00'"]


def _random_calls(rng: random.Random, count: int) -> list[str]:
    calls = []
    alphabet = string.printable + "\x00\u200b\u202eé漢"
    for _ in range(count):
        style = rng.random()
        if style < 0.45:  # call-shaped strings built from hostile parts
            name = rng.choice(NAMES)
            args = ", ".join(
                (f"{rng.choice(['folder', 'a', 'x', '_y', 'file_name'])}={rng.choice(PAYLOADS)}" if rng.random() < 0.6
                 else rng.choice(PAYLOADS))
                for _ in range(rng.randrange(0, 4))
            )
            wrapper = rng.choice(["{}({})", "[{}({})]", "{}({}).__class__", "({})({})", "{}.{}()", "{}({})()"])
            calls.append(wrapper.format(name, args))
        elif style < 0.75:  # random printable garbage
            calls.append("".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 80))))
        else:  # JSON-shaped garbage
            calls.append('{"name": "%s", "arguments": %s}' % (rng.choice(NAMES), rng.choice(
                ['{}', '"{}"', '[1]', '{"folder": %s}' % rng.choice(["1", '"x"', "null", "[", "{}"]), '"garbage', "1e999"]
            )))
    return calls


def _mutated_ground_truth(rng: random.Random, tasks, count: int) -> list[str]:
    pool = [call for task in tasks for turn in task.ground_truth for call in turn]
    mutated = []
    for _ in range(count):
        text = list(rng.choice(pool))
        for _ in range(rng.randrange(1, 4)):
            position = rng.randrange(len(text) + 1)
            action = rng.random()
            if action < 0.4 and text:
                del text[min(position, len(text) - 1)]
            elif action < 0.8:
                text.insert(position, rng.choice("()[]{}'\",=._*\\ \x00a1"))
            elif text:
                text[min(position, len(text) - 1)] = rng.choice("_.(")
        mutated.append("".join(text))
    return mutated


def _fuzz_tasks():
    """Tasks that together involve all eight backend classes."""
    chosen, seen = [], set()
    for task in load_tasks("multi_turn_base"):
        new = set(task.meta["involved_classes"]) - seen
        if new:
            chosen.append(task)
            seen |= new
    assert len(seen) == 8, seen
    return chosen


def test_fuzz_hostile_calls_are_refused_with_reasons_and_touch_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rng = random.Random(20261129)
    tasks = _fuzz_tasks()
    # No force-quit: every one of the calls must reach the parser and the dispatch.
    env = BFCLEnv("multi_turn_base", scope="exposed", max_replies_per_turn=1_000_000)
    hostile = HOSTILE + _random_calls(rng, 6000)
    mutated = _mutated_ground_truth(rng, load_tasks("multi_turn_base"), 4000)
    assert len(hostile) + len(HOSTILE_OBJECTS) + len(mutated) >= 10_000

    episodes = [env.reset(task) for task in tasks]
    for episode in episodes:  # warm up lazy imports inside the backends before arming the audit hook
        episode.act(["ls(a=True)", "add(a=1, b=2)", "{\"name\": \"pwd\", \"arguments\": {}}"])
    # The working directory must stay as it was; the audit hook covers every other path (any `open`, `os.*` or
    # process start in this process is an event), so other programs' files in /tmp cannot make this test flaky.
    before = sorted(os.listdir(tmp_path))

    _AUDIT["events"].clear()
    _AUDIT["armed"] = True
    try:
        refused = []
        for index, call in enumerate(hostile + HOSTILE_OBJECTS):
            steps = episodes[index % len(episodes)].act([call])
            refused.append((call, steps))
        for index, call in enumerate(mutated):
            episodes[index % len(episodes)].act([call])  # may be valid calls: they only must not escape
    finally:
        _AUDIT["armed"] = False

    assert _AUDIT["events"] == [], _AUDIT["events"][:10]
    assert not any(episode.done for episode in episodes)
    assert sorted(os.listdir(tmp_path)) == before
    failures = []
    for call, steps in refused:
        if len(steps) != 1 or not steps[0].error or not steps[0].observation.startswith("Error"):
            failures.append((str(call)[:100], steps[0].error if steps else None))
    # Random call-shaped strings may, rarely, be real calls (`ls()`); the fixed hostile list never is.
    fixed = {str(c) for c in HOSTILE + HOSTILE_OBJECTS}
    assert not [f for f in failures if f[0] in {c[:100] for c in fixed}], failures[:10]
    assert len(failures) < 0.02 * len(refused), failures[:10]


def test_refusal_reasons_name_the_problem():
    env = BFCLEnv("multi_turn_base")
    task = next(t for t in load_tasks("multi_turn_base") if "GorillaFileSystem" in t.meta["involved_classes"])
    episode = env.reset(task)
    cases = {
        "frobnicate(x=1)": "unknown function",
        "__import__('os')": "private",
        "cd(folder=pwd())": "not a literal",
        "cd(folder='x'": "syntax error",
        "cd(folder='" + "a" * 70_000 + "')": "limit",
        "os.system('id')": "plain function names",
        "cd(**{'folder': 'x'})": "unpacking",
        "ls(bogus=1)": "raised TypeError",
    }
    for call, expected in cases.items():
        (step,) = episode.act([call])
        assert expected in step.error, (call, step.error)
        assert step.observation.startswith("Error during execution:")


def test_resource_guards_refuse_runaway_arguments():
    env = BFCLEnv("multi_turn_base")
    task = next(t for t in load_tasks("multi_turn_base") if "MathAPI" in t.meta["involved_classes"])
    episode = env.reset(task)
    steps = episode.act([
        "power(base=10, exponent=999999999)",
        "power(10, 999999999)",
        "logarithm(value=10, base=2, precision=100000000)",
        "logarithm(10, 2, 100000000)",
        "square_root(number=2, precision=999999999)",
        "square_root(2, 999999999)",
        "round_number(1.5, 1000000000)",
        "power(base=2, exponent=10)",
    ])
    assert [bool(step.error) for step in steps] == [True] * 7 + [False]
    assert steps[-1].observation == '{"result": 1024}'


def test_interleaved_episodes_of_one_entry_keep_separate_state():
    env = BFCLEnv("multi_turn_base")
    task = next(t for t in load_tasks("multi_turn_base") if t.meta["involved_classes"] == ["GorillaFileSystem"])
    first, second = env.reset(task), env.reset(task)
    initial = second.state()
    first.act(["mkdir(dir_name='only_in_first')"])
    second.act(["ls()"])
    assert "only_in_first" in first.act(["ls()"])[0].observation
    assert "only_in_first" not in second.act(["ls()"])[0].observation
    assert second.state() == initial
    # Play the ground truth in `second` while `first` wanders off: they score independently.
    for turn in task.ground_truth:
        second.act(list(turn)) if turn else None
        first.act(["mkdir(dir_name='noise')"])
        second.end_turn()
        first.end_turn()
    assert second.score().success
    assert not first.score().success
    # A third episode, opened afterwards, starts from the initial state again.
    assert env.reset(task).state() == initial


def test_official_executor_module_globals_are_never_touched():
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    before = set(vars(multi_turn_utils))
    env = BFCLEnv("multi_turn_base")
    for task in load_tasks("multi_turn_base")[:20]:
        episode = env.reset(task)
        episode.act(list(task.ground_truth[0]))
        episode.end_turn()
    assert set(vars(multi_turn_utils)) == before


@pytest.mark.parametrize("value", ["ls(a=True)", {"name": "ls", "arguments": {"a": True}},
                                   {"name": "ls", "arguments": "{\"a\": true}"}, "{\"name\": \"ls\", \"arguments\": {\"a\": true}}"])
def test_python_and_json_calls_run_identically(value):
    env = BFCLEnv("multi_turn_base")
    task = next(t for t in load_tasks("multi_turn_base") if t.meta["involved_classes"] == ["GorillaFileSystem"])
    reference = env.reset(task).act(["ls(a=True)"])[0].observation
    (step,) = env.reset(task).act([value])
    assert step.error is None and step.observation == reference
