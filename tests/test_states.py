"""Action states (`coevolve.states`) and the rare signal over the states D_t lacks (`signals.unexplored_states`): the
patterns each env reads off a call sequence, worked out by hand; the missing ones raise rare events; exploration
from one reaches the state before acting, on names it has observed; abstraction keeps the shortest solution whose
last call acts in that state; validation admits it and the pool counts it."""

from __future__ import annotations

from collections import Counter

from coevolve.abstract import TemplateAbstractor, focus_of, focus_solutions
from coevolve.envs.base import step_failure
from coevolve.envs.bfcl_lite import BFCLLiteEnv
from coevolve.explore import ExploreConfig, OfflineExplorer, build_context, describe
from coevolve.records import ExplorationEpisode, Provenance, SignalEvent, Step, Task, ToolCall, Trajectory
from coevolve.signals import SignalConfig, extract_signals, unexplored_states
from coevolve.states import (ARGUMENT_STATES, DIRECTORY_STATES, is_state_pattern, new_state_tasks, reached_counts,
                             state_coverage)
from coevolve.synthesis import signal_contexts, validate
from coevolve.validate import Validator


def test_directory_states_by_hand():
    calls = [ToolCall("ls"), ToolCall("cd", {"folder": "a"}), ToolCall("ls"), ToolCall("cd", {"folder": ".."}),
             ToolCall("mkdir", {"dir_name": "x"}), ToolCall("cd", {"folder": "a/b"}), ToolCall("cat", {"file_name": "f"}),
             ToolCall("cd", {"folder": "/"}), ToolCall("rm", {"file_name": "g"}), ToolCall("cd", {"folder": ".."}),
             ToolCall("touch", {"file_name": "h"})]
    assert DIRECTORY_STATES.patterns(calls) == [
        "ls@start", "cd@start", "ls@folder", "cd@folder", "mkdir@start", "cd@start", "cat@folder", "cd@folder",
        "rm@start", "cd@start", "touch@start"]  # `..` never climbs above the start
    tools = [{"name": "ls"}, {"name": "cd"}, {"name": "cat"}]
    assert DIRECTORY_STATES.space(tools) == ["ls@start", "ls@folder", "cd@start", "cd@folder", "cat@start",
                                             "cat@folder"]
    assert DIRECTORY_STATES.space([{"name": "ls"}, {"name": "cat"}]) == ["ls@start", "cat@start"]  # no cd: no folder
    route = DIRECTORY_STATES.route("cat@folder")
    assert (route.before, route.tool, route.exact) == (("ls", "cd", "ls"), "cat", False)
    assert DIRECTORY_STATES.route("cat@start").before == ()


def test_argument_states_by_hand():
    docs = [{"name": "send", "parameters": {"type": "object", "properties": {"to": {}, "body": {}, "cc": {}},
                                            "required": ["to", "body"]}},
            {"name": "ping", "parameters": {"type": "object", "properties": {}}}]
    assert ARGUMENT_STATES.space(docs) == ["send@body,to", "send@body,cc,to", "ping@"]
    assert ARGUMENT_STATES.patterns([ToolCall("send", {"to": "a", "body": "b"}), ToolCall("ping")]) == [
        "send@body,to", "ping@"]
    route = ARGUMENT_STATES.route("send@body,cc,to")
    assert (route.before, route.tool, route.arguments, route.exact) == ((), "send", ("body", "cc", "to"), True)
    assert is_state_pattern("cat@folder") and not is_state_pattern("cd > ls") and not is_state_pattern(None)


def test_unexplored_states_by_hand():
    space = {"A": ["x@start", "x@folder"], "B": ["x@folder", "y@folder"], "C": ["x@start"]}
    counts = {"x@start": 5, "x@folder": 2}
    # below 3: x@folder (reached twice; A and B can reach it) and y@folder (never; only B). x@start: 5, not missing.
    found = unexplored_states(space, counts, below=3, iteration=4)
    assert sorted(pattern for pattern, _ in found) == ["x@folder", "y@folder"]
    assert dict(found)["y@folder"] == "B" and dict(found)["x@folder"] in ("A", "B")
    assert found == unexplored_states(space, counts, below=3, iteration=4)  # the order is the iteration's
    assert unexplored_states(space, counts, below=1, iteration=4) == [("y@folder", "B")]  # only never reached


def trajectory(trajectory_id, task_id, score, calls):
    steps = tuple(Step(0, index, call.to_python(), call, "{}") for index, call in enumerate(calls))
    return Trajectory(trajectory_id, task_id, 0, 0, steps, score)


def test_a_state_neither_the_pool_nor_the_rollouts_reached_raises_a_rare_event():
    rollouts = [trajectory("A1", "A", 1.0, [ToolCall("ls")]), trajectory("A2", "A", 0.0, [ToolCall("ls")])]
    space = {"A": ["ls@start", "ls@folder"]}
    config = SignalConfig(enabled=("rare",), theta_percent=1.0, rare_below=1, unexplored_states=True)
    report = extract_signals(rollouts, {}, config, 2, None, space, {"ls@start": 2})
    states = [e for e in report.events if "unexplored_state" in e.evidence]
    assert [(e.kind, e.task_id, e.evidence["unexplored_state"], e.evidence["reached"]) for e in states] == [
        ("rare", "A", "ls@folder", 0)]
    off = SignalConfig(enabled=("rare",), theta_percent=1.0, rare_below=1)
    assert not [e for e in extract_signals(rollouts, {}, off, 2, None, space, {}).events
                if "unexplored_state" in e.evidence]
    # the context it makes names the state; it leads the rare turn with the unexplored tools
    task = BFCLLiteEnv("train").tasks()[0]
    event = SignalEvent("rare", task.id, 2, (), {"unexplored_state": "cat@folder", "reached": 0})
    context = build_context(event, task, {})
    assert context.focus_tool == "cat@folder" and context.focus_tools == ("cat",)
    assert "cat in this state: folder" in describe(context, task, 6)
    plain = SignalEvent("rare", task.id, 2, ("x",), {"frequencies": {"rm": 0.01}})
    boundary = SignalEvent("boundary", task.id, 2, (), {"scores": []})
    tool = SignalEvent("rare", task.id, 2, (), {"unexplored": "rm", "frequencies": {"rm": 0.0}})
    second = SignalEvent("rare", task.id, 2, (), {"unexplored_state": "rm@folder", "reached": 1})
    contexts = signal_contexts([boundary, plain, event, tool, second], {task.id: task}, {}, 4)
    # the states first, then the kinds' turns: boundary, then rare led by the unexplored tool
    assert [c.focus_tool or c.signal for c in contexts] == ["cat@folder", "rm@folder", "boundary", "rm"]
    # synthesis.rest_contexts: random: the same states first, then as many random tasks as the signal contexts
    # they replace (the same exploration budget), drawn by (seed, iteration) alone
    pool = {t.id: t for t in BFCLLiteEnv("train").tasks()[:30]} | {task.id: task}
    mixed = signal_contexts([boundary, plain, event, tool, second], pool, {}, 4, "random", 3, 7)
    assert [c.focus_tool for c in mixed[:2]] == ["cat@folder", "rm@folder"]
    assert len(mixed) == 4 and [c.signal for c in mixed[2:]] == [None, None]
    assert all(c.id.startswith("random-") and c.iteration == 3 and c.task_id in pool for c in mixed[2:])
    assert mixed == signal_contexts([boundary, plain, event, tool, second], pool, {}, 4, "random", 3, 7)
    assert [c.task_id for c in mixed[2:]] != [c.task_id for c in
                                              signal_contexts([boundary, event], pool, {}, 4, "random", 4, 7)[1:3]]
    only_states = signal_contexts([event, second], pool, {}, 4, "random", 3, 7)
    assert [c.focus_tool for c in only_states] == ["cat@folder", "rm@folder"]  # nothing to replace: no random


def test_state_coverage_counts_the_pool_and_the_calls_that_ran():
    env = BFCLLiteEnv("train")
    tasks = env.tasks()[:20]
    ran = Step(0, 0, "cd(folder='a')", ToolCall("cd", {"folder": "a"}), "{}")
    refused = Step(0, 1, "cat(file_name='b')", ToolCall("cat", {"file_name": "b"}), '{"error": "no"}')
    after = Step(0, 2, "ls()", ToolCall("ls"), "{}")
    rollout = Trajectory("r", tasks[0].id, 0, 0, (ran, refused, after), 0.0)
    space, counts = state_coverage(env, tasks, [rollout])
    assert list(space) == [tasks[0].id] and "cat@folder" in space[tasks[0].id]
    # the refused `cat` counts for nothing; the `ls` after the `cd` that ran acts in a folder
    assert counts == reached_counts(DIRECTORY_STATES, tasks, [[ran.call, after.call]])
    assert counts == reached_counts(DIRECTORY_STATES, tasks, []) + Counter({"cd@start": 1, "ls@folder": 1})


def test_focus_solutions_keep_the_last_call_in_the_state():
    steps = [Step(0, 0, "ls()", ToolCall("ls"), "{}"), Step(0, 1, "cd", ToolCall("cd", {"folder": "a"}), "{}"),
             Step(0, 2, "cat", ToolCall("cat", {"file_name": "x"}), "{}")]
    solutions = focus_solutions(steps, "cat@folder", 3, DIRECTORY_STATES)
    assert [[s.call.name for s in solution] for solution in solutions] == [["cd", "cat"]]  # `ls` first: not needed
    assert focus_solutions(steps, "cat@start", 3, DIRECTORY_STATES)[0] == [steps[2]]  # cat alone acts at the start
    episode = ExplorationEpisode("e", "c", "t", "rare", "offline", tuple(steps), focus="cat@folder")
    assert focus_of(episode, ["cd(folder='a')", "cat(file_name='x')"], DIRECTORY_STATES) == "cat@folder"
    assert focus_of(episode, ["cat(file_name='x')"], DIRECTORY_STATES) is None


def test_a_state_episode_enters_a_folder_it_observed_and_yields_tasks_that_act_there():
    env = BFCLLiteEnv("train")
    tasks = env.tasks()[:12]
    by_id = {task.id: task for task in tasks}
    contexts = [build_context(SignalEvent("rare", task.id, 1, (), {"unexplored_state": pattern, "reached": 0}), task,
                              {}) for task in tasks for pattern in ("cat@folder", "mkdir@folder")]
    explorer = OfflineExplorer(ExploreConfig(step_budget=6))
    episodes = explorer.explore(env, contexts, by_id, seed=0)
    for episode in episodes:
        ran = [s.call for s in episode.steps if s.call is not None and step_failure(s) is None]
        assert [call.name for call in ran[:1]] == ["ls"]  # the route starts by looking
        if len(ran) > 1:
            listed = episode.steps[0].observation
            assert ran[1].name == "cd" and ran[1].arguments["folder"] in listed  # a name it has just seen
    reached = [e for e in episodes if e.focus in DIRECTORY_STATES.patterns(
        [s.call for s in e.steps if s.call is not None and step_failure(s) is None])]
    assert len(reached) >= len(episodes) // 2, [e.steps for e in episodes]
    abstractions = TemplateAbstractor().abstract(env, episodes, by_id)
    accepted = [v.task for v in validate(abstractions, Validator(env, known=env.tasks()), 1).items if v.task]
    shapes = {t.truth_tools for t in accepted}
    assert ("cd", "cat") in shapes and ("cd", "mkdir") in shapes
    assert all(t.truth_tools[0] == "cd" and len(t.truth_tools) >= 2 for t in accepted)  # never the call alone
    assert {t.provenance.focus_tool for t in accepted} <= {"cat@folder", "mkdir@folder"}
    # the pool's count: each admitted task reaches a state no seed task reaches, and was steered there
    one_call = [task for task in env.tasks() if len(task.truth_tools) == 1]  # a D_0 that acts at the start only
    assert new_state_tasks(DIRECTORY_STATES, one_call, accepted) == {"admitted": len(accepted), "steered": len(accepted)}


def test_new_state_tasks_by_hand():
    def task(name, calls, focus=None):
        made = Task.create("bfcl-lite", name, [[{"role": "user", "content": name}]], {}, [calls], {})
        return Task(made.id, made.env, made.name, made.turns, made.initial_state, made.ground_truth, made.meta,
                    Provenance("synthetic", focus_tool=focus))

    seed = [task("s1", ["ls()"]), task("s2", ["cd(folder='a')"])]
    synthetic = [task("n1", ["cd(folder='a')", "ls()"], "ls@folder"), task("n2", ["ls()"]),
                 task("n3", ["cd(folder='a')", "cat(file_name='x')"])]
    assert new_state_tasks(DIRECTORY_STATES, seed, synthetic) == {"admitted": 2, "steered": 1}
