"""An MCP server as an env: the example board solved by its ground truth (in-process and over stdio), BFCL's
checks through probe calls, hostile and fuzzed calls that never reach a tool, servers that hang, die or cannot
start counted as the env's failures, one-line refusals, synthesis admitting validated tasks, the server's logs in
run.log, and one GRPO iteration with a tiny model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from coevolve.cli import main
from coevolve.envs.mcp_env import MCPEnv, check_mcp_env
from coevolve.envs.user_env import EnvDefinitionError
from coevolve.records import Task

REPO = Path(__file__).resolve().parent.parent
BOARD = "examples.board.server:make_server"
TASKS = REPO / "examples" / "board" / "tasks.jsonl"
PROBES = ["list_cards()"]
sys.path.insert(0, str(REPO))


def board_env(**options) -> MCPEnv:
    return MCPEnv(server=BOARD, tasks=str(TASKS), state_calls=PROBES, **options)


def task_named(env: MCPEnv, name: str) -> Task:
    return next(task for task in env.tasks() if task.name == name)


def play(env: MCPEnv, task: Task, turns: list[list[str]]):
    episode = env.reset(task)
    for calls in turns:
        episode.act(calls)
        episode.end_turn()
    return episode, episode.score()


def test_every_board_task_is_solved_by_its_ground_truth_through_the_cli(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    code = main(["eval", "--env", f"mcp:{BOARD}", "--tasks", str(TASKS), "--policy", "oracle", "--json",
                 "--state-call", "list_cards()"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["n"] == 20 and report["accuracy"] == 1.0
    assert main(["env", "check", f"mcp:{BOARD}", "--tasks", str(TASKS), "--state-call", "list_cards()"]) == 0
    assert "all well" in capsys.readouterr().out


def test_tools_come_from_list_tools_with_their_schemas_and_docstring_arguments():
    env = board_env()
    docs = {doc["name"]: doc for doc in env.docs}
    assert set(docs) == {"add_card", "move_card", "tag_card", "delete_card", "list_cards", "find_card"}
    add = docs["add_card"]
    assert add["description"] == "Add a new card to the board."  # the first paragraph, not the Args block
    assert add["parameters"]["properties"]["title"]["description"] == "The card's title, unique on the board."
    assert add["parameters"]["properties"]["column"]["enum"] == ["todo", "doing", "done"]
    assert add["parameters"]["required"] == ["title"]
    assert len(env.tasks()) == 20 and len(env.with_split("test").tasks()) == 8


def test_scoring_compares_probe_results_after_each_turn_and_the_ground_truths_results():
    env = board_env(split="train")
    start = task_named(env, "start-report")
    assert play(env, start, [["move_card(title='write report', column='doing')"]])[1].value == 1.0
    _, wrong = play(env, start, [["move_card(title='write report', column='done')"]])
    assert wrong.value == 0.0 and any("state differs in list_cards()" in reason for reason in wrong.reasons)
    where = task_named(env, "where-bug")  # read-only: only the response check can tell
    _, looked_elsewhere = play(env, where, [["find_card(title='call bank')"]])
    assert looked_elsewhere.value == 0.0 and any("result(s) missing" in r for r in looked_elsewhere.reasons)
    two_turns = task_named(env, "passport-two-turns")
    _, half = play(env, two_turns, [["add_card(title='renew passport')"], []])
    assert half.value == 0.0 and any("turn 1: no call" in reason for reason in half.reasons)
    # A task's own checks join the env's probes: tagging the wrong card leaves find_card(...) different.
    tag = task_named(env, "tag-report")
    assert env.probes(tag) == ("list_cards()", "find_card(title='write report')")
    episode, score = play(env, tag, [["tag_card(title='write report', tag='urgent')"]])
    assert score.value == 1.0 and "urgent" in episode.state()["find_card(title='write report')"]


def test_a_stdio_server_per_episode_scores_the_same(tmp_path):
    env = MCPEnv(command=[sys.executable, "-m", "examples.board.server"], cwd=str(REPO), tasks=str(TASKS),
                 state_calls=PROBES)
    assert env.name == f"mcp:{sys.executable} -m examples.board.server"
    for name in ("add-dentist-tag", "passport-two-turns", "slides-done"):
        task = task_named(env, name)
        assert play(env, task, task.ground_truth)[1].value == 1.0, name
    episode, wrong = play(env, task_named(env, "slides-done"), [["move_card(title='draft slides', column='todo')"]])
    assert wrong.value == 0.0 and not episode.lost


HOSTILE = ["__import__('os').system('touch /tmp/pwned-mcp')", "add_card('positional')", "_private()",
           "add_card(title=open('/etc/passwd').read())", "add_card(title='x', column='archive')",
           "add_card(title='x', color='red')", "add_card(title=['a'])", "move_card(title='x')",
           "add_card(**{'title': 'x'})", "list_cards(" + "1," * 3000 + ")", '{"name": "__init__", "arguments": {}}',
           "add_card(title=lambda: 1)", "exec(code='1')", "add_card(title='a' * 10)"]


def test_hostile_calls_are_refused_with_a_reason_and_never_reach_the_server():
    env = board_env()
    episode = env.reset(task_named(env, "add-milk"))
    before = episode.state()
    steps = episode.act(HOSTILE)
    assert all(step.error for step in steps), [step.action for step in steps if not step.error]
    assert all(step.call is None for step in steps)  # refused before sending: nothing ran
    assert episode.state() == before and not Path("/tmp/pwned-mcp").exists()
    [bad, good] = episode.act(["move_card(title='nope', column='done')", "add_card(title='buy milk')"])
    assert "no card titled 'nope'" in bad.error and good.error is None  # a tool's own error is an observation
    assert not episode.lost


def test_fuzzed_calls_never_raise_and_only_listed_tools_are_sent():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    env = board_env()
    task = task_named(env, "add-milk")
    tools = {doc["name"] for doc in env.docs}
    names = st.sampled_from(sorted(tools) + ["__init__", "run", "eval", "_tool_manager"])
    values = st.integers() | st.text(max_size=8) | st.none() | st.lists(st.integers(), max_size=2)
    texts = st.one_of(st.text(max_size=60), st.builds(lambda n, a: f"{n}({a})", names, st.text(max_size=30)),
                      st.builds(lambda n, v: {"name": n, "arguments": v}, names,
                                st.dictionaries(st.sampled_from(["title", "column", "tag", "x"]), values, max_size=3)))
    episode = env.reset(task)

    @settings(max_examples=150, deadline=None)
    @given(calls=st.lists(texts, min_size=1, max_size=4))
    def run(calls):
        for step in episode.act(calls):
            assert step.error is not None or (step.call is not None and step.call.name in tools)

    run()
    assert not episode.lost


HANGING = '''
import anyio, os
from mcp.server.mcpserver import MCPServer

def make_server():
    server = MCPServer("flaky")

    @server.tool()
    async def wait() -> str:
        """Wait forever."""
        await anyio.sleep(3600)
        return "never"

    @server.tool()
    def crash() -> str:
        """End the process."""
        os._exit(3)

    @server.tool()
    def fine() -> str:
        """Answer."""
        return "ok"

    @server.tool()
    def broken() -> str:
        """Raise."""
        raise RuntimeError("tool bug")

    return server

VERSION = "1.0"

def refuses():
    raise RuntimeError("cannot start")

def not_a_server():
    return 42

if __name__ == "__main__":
    make_server().run("stdio")
'''


@pytest.fixture()
def flaky(tmp_path, monkeypatch):
    (tmp_path / "flaky_server.py").write_text(HANGING)
    monkeypatch.syspath_prepend(str(tmp_path))
    rows = [{"id": "fine", "query": "Answer.", "ground_truth": [["fine()"]]}]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return tmp_path


def test_a_server_that_hangs_dies_or_cannot_start_fails_its_episode_as_the_envs_failure(flaky):
    tasks = str(flaky / "tasks.jsonl")
    env = MCPEnv(server="flaky_server:make_server", tasks=tasks, call_timeout_s=0.5)
    task = env.tasks()[0]
    episode = env.reset(task)
    [hung, after] = episode.act(["wait()", "fine()"])
    assert "did not answer within 0.5 s" in hung.error and "did not answer" in after.error
    checks = {check.kind: check for check in episode.score().checks}
    assert not checks["process"].passed and episode.score().value == 0.0
    broken = env.reset(task).act(["broken()"])[0]  # a tool's exception: an observation, the session goes on
    assert broken.error and "broken" in broken.error
    stdio = MCPEnv(command=[sys.executable, str(flaky / "flaky_server.py")], tasks=tasks, call_timeout_s=5)
    episode = stdio.reset(task)
    [crashed, later] = episode.act(["crash()", "fine()"])
    assert crashed.error and later.error and episode.lost
    assert any(c.kind == "process" and not c.passed for c in episode.score().checks)
    assert MCPEnv(server="flaky_server:make_server", tasks=tasks).reset(task).act(["fine()"])[0].error is None


def test_sessions_beyond_max_sessions_are_refused_not_waited_for_forever(flaky):
    env = MCPEnv(server="flaky_server:make_server", tasks=str(flaky / "tasks.jsonl"), max_sessions=2,
                 call_timeout_s=0.3)
    task = env.tasks()[0]
    held = [env.reset(task), env.reset(task)]
    third = env.reset(task)
    assert third.lost and "more than 2 MCP sessions open" in third.lost
    assert all(not episode.lost for episode in held)
    held.clear()  # closed when dropped: the slots come back
    import gc

    gc.collect()
    import time

    time.sleep(0.3)
    assert not env.reset(task).lost


@pytest.mark.parametrize(("options", "rows", "message"), [
    ({"server": "no_such_module:make"}, None, "cannot import no_such_module"),
    ({"server": "flaky_server:missing"}, None, "flaky_server has no missing"),
    ({"server": "flaky_server:VERSION"}, None, "is a str, not an MCP server"),
    ({"server": "flaky_server:refuses"}, None, "raised RuntimeError: cannot start"),
    ({"server": "flaky_server:not_a_server"}, None, "returned a int, not an MCP server"),
    ({"server": "flaky_server:make_server"}, [{"query": "Go.", "ground_truth": [["teleport()"]]}],
     "ground truth call 'teleport()': no tool named 'teleport'"),
    ({"server": "flaky_server:make_server"}, [{"query": "Go.", "reset": {"size": 3}, "ground_truth": [["fine()"]]}],
     "does not fit flaky_server:make_server()"),
    ({"server": "flaky_server:make_server"}, [{"query": "Go.", "ground_truth": [["fine(loud=True)"]]}],
     "Additional properties are not allowed"),
    ({"server": "flaky_server:make_server"}, [{"query": "Go."}], "env.options.reward_tool is not set"),
    ({"server": "flaky_server:make_server", "state_calls": ["fine(1)"]}, None, "named arguments only"),
    ({"server": "flaky_server:make_server", "reward_tool": "score"}, None, "has no tool 'score'"),
    ({}, None, "give env.options.server"),
])
def test_bad_specs_and_tasks_are_refused_in_one_line_before_anything_runs(flaky, options, rows, message):
    path = flaky / "tasks.jsonl"
    if rows is not None:
        path = flaky / "bad.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(EnvDefinitionError) as refused:
        MCPEnv(tasks=str(path), **options)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_the_cli_refuses_a_bad_server_with_exit_2_and_one_line(flaky, capsys, monkeypatch):
    monkeypatch.chdir(flaky)
    code = main(["eval", "--env", "mcp:flaky_server:nothing", "--tasks", "tasks.jsonl", "--policy", "oracle"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "flaky_server has no nothing" in err


SHARED = '''
from mcp.server.mcpserver import MCPServer

server = MCPServer("counter")
count = {"n": 0}

@server.tool()
def bump() -> str:
    """Add one."""
    count["n"] += 1
    return str(count["n"])

@server.tool()
def score() -> float:
    """How well it went."""
    return 1.0 if count["n"] >= 1 else 0.0
'''


def test_env_check_says_a_shared_server_leaks_state_and_a_reward_tool_scores_without_ground_truth(tmp_path,
                                                                                                  monkeypatch):
    (tmp_path / "shared_server.py").write_text(SHARED)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"id": "bump", "query": "Bump.", "ground_truth": [["bump()"]]})
                                          + "\n")
    problems = check_mcp_env(str(tmp_path / "tasks.jsonl"), server="shared_server:server")
    assert any("two runs of its ground truth end differently (one shared server" in p for p in problems), problems
    assert any("no state_calls and no task checks" in p for p in problems)
    (tmp_path / "open.jsonl").write_text(json.dumps({"id": "open", "query": "Bump it."}) + "\n")
    env = MCPEnv(server="shared_server:server", tasks=str(tmp_path / "open.jsonl"), reward_tool="score")
    assert "score" not in {doc["name"] for doc in env.docs}  # hidden from the agent
    episode = env.reset(env.tasks()[0])
    assert episode.act(["score()"])[0].error  # and not callable by it
    episode.act(["bump()"])
    episode.end_turn()
    score = episode.score()
    assert score.value == 1.0 and [check.reason for check in score.checks] == ["score() = '1.0'"]


def test_the_servers_logs_go_to_run_log_not_the_console(flaky, tmp_path, capfd):
    from coevolve.run_setup import run_logging

    import time

    env = MCPEnv(server="flaky_server:make_server", tasks=str(flaky / "tasks.jsonl"))
    stdio = MCPEnv(command=[sys.executable, str(flaky / "flaky_server.py")], tasks=str(flaky / "tasks.jsonl"))
    with run_logging(tmp_path):
        step = env.reset(env.tasks()[0]).act(["broken()"])[0]
        episode = stdio.reset(stdio.tasks()[0])
        assert episode.act(["broken()"])[0].error
        episode.close()  # a stdio server's stderr is logged when its session ends
        label = f"{sys.executable} {flaky / 'flaky_server.py'}: "
        for _ in range(100):
            if label in (tmp_path / "run.log").read_text():
                break
            time.sleep(0.1)
    assert step.error
    log = (tmp_path / "run.log").read_text()
    assert "RuntimeError: tool bug" in log  # the traceback the SDK logs when a tool raises
    assert label in log  # the stdio server's own stderr, line by line
    captured = capfd.readouterr()
    assert "tool bug" not in captured.err and "tool bug" not in captured.out


def test_synthesis_writes_validated_tasks_for_an_mcp_server(tmp_path):
    from coevolve.abstract import TemplateAbstractor
    from coevolve.evaluate import evaluate, oracle_script
    from coevolve.explore import ExploreConfig, OfflineExplorer, random_contexts
    from coevolve.synthesis import synthesis_phase
    from coevolve.validate import Validator

    env = board_env(split="train")
    tasks = env.tasks()
    assert env.exploration_problems() == []
    result = synthesis_phase(env, random_contexts(tasks, 4, 1, 0), {t.id: t for t in tasks},
                             OfflineExplorer(ExploreConfig(step_budget=4, focus_weight=0.3)), TemplateAbstractor(),
                             Validator(env, known=tasks), iteration=1)
    admitted = result.admitted
    assert admitted and all(t.provenance.source == "synthetic" and t.env == env.name for t in admitted)
    assert evaluate(env, list(admitted), oracle_script, "oracle").accuracy == 1.0
    assert result.rejected_by_code()


DICE = '''
import random
from mcp.server.mcpserver import MCPServer

def make_server():
    server = MCPServer("dice")
    rolls = []

    @server.tool()
    def roll(sides: int) -> str:
        """Roll a die and keep the result."""
        rolls.append(random.randint(1, 10**9))
        return str(rolls[-1])

    @server.tool()
    def history() -> str:
        """The rolls so far."""
        return str(rolls)

    return server
'''


def test_validation_runs_each_candidate_twice_in_fresh_servers_and_catches_a_random_tool(tmp_path, monkeypatch):
    from coevolve.abstract import TemplateAbstractor
    from coevolve.explore import ExploreConfig, OfflineExplorer, random_contexts
    from coevolve.synthesis import synthesis_phase
    from coevolve.validate import Validator

    (tmp_path / "dice_server.py").write_text(DICE)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"id": "roll", "query": "Roll a six.",
                                                      "ground_truth": [["roll(sides=6)"]]}) + "\n")
    env = MCPEnv(server="dice_server:make_server", tasks=str(tmp_path / "tasks.jsonl"), state_calls=["history()"])
    tasks = env.tasks()
    result = synthesis_phase(env, random_contexts(tasks, 4, 1, 0), {t.id: t for t in tasks},
                             OfflineExplorer(ExploreConfig(step_budget=3)), TemplateAbstractor(),
                             Validator(env, known=tasks), iteration=1)
    assert not result.admitted and result.rejected_by_code().get("not_reproducible", 0) > 0, result.rejected_by_code()


def test_a_schema_the_offline_explorer_cannot_fill_is_refused_before_a_run(tmp_path, monkeypatch):
    from coevolve.schemas import unfillable_arguments

    docs = [{"name": "plot", "parameters": {"type": "object", "required": ["points", "label", "style"],
                                            "properties": {"points": {"type": "array", "items": {"type": "number"}},
                                                           "label": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                                                           "style": {"$ref": "#/$defs/Style"}},
                                            "$defs": {"Style": {"type": "object", "required": ["color"],
                                                                "properties": {"color": {"type": "string"}}}}}},
            {"name": "merge", "parameters": {"type": "object", "required": ["left"],
                                             "properties": {"left": {"allOf": [{"type": "string"}]}}}}]
    assert unfillable_arguments(docs) == ["merge(left)"]
    # A run that would explore such a server offline is refused when its env is built, in one line.
    from coevolve.config import ConfigError, load_config
    from coevolve.run_setup import build_env

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(MCPEnv, "exploration_problems", lambda self: ["merge(left)"])
    with pytest.raises(ConfigError, match=r"cannot draw a value for merge\(left\)"):
        build_env(load_config(str(REPO / "examples" / "board" / "config.yaml")))
    assert build_env(load_config(str(REPO / "examples" / "board" / "config.yaml"), ["run.mode=static"])).docs
    with pytest.raises(ConfigError, match="opens 16 episodes at once .*max_sessions \\(4\\)"):
        build_env(load_config(str(REPO / "examples" / "board" / "config.yaml"),
                              ["run.mode=static", "env.options.max_sessions=4"]))


def test_one_grpo_iteration_on_an_mcp_server(tmp_path, tiny_dir):
    from coevolve.loop import run

    out = tmp_path / "board"
    result = run(str(REPO / "examples" / "board" / "config.yaml"), [
        f"model.name={tiny_dir}", "model.device=cpu", f"env.options.tasks={TASKS}", "rollout.max_new_tokens=8",
        "rollout.max_replies_per_turn=1", "rollout.max_episode_tokens=64", "grpo.prompts_per_step=2",
        "run.max_steps=1", "loop.steps_per_iteration=1", "loop.eval_limit=2"], str(out), say=lambda text: None)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert result.final_step == 1 and [m["iteration"] for m in metrics] == [0, 1]
    config = (out / "config.yaml").read_text()
    assert "examples.board.server:make_server" in config and "list_cards()" in config
