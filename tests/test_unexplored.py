"""Rare over the unexplored tools (`signals.unexplored`) and the exploration that yields the missing task: a tool the
iteration's tasks expose and no rollout called raises a rare event; its context names the tool; the explorer calls
it; the abstractor proposes the shortest solutions ending in it and validation keeps the shortest that passes. The
same for an order of tools no rollout made (`signals.unexplored_orders`), where validation also refuses an order
whose last call does not need it (`order_free`)."""

from __future__ import annotations

from coevolve.abstract import Abstraction, TemplateAbstractor, focus_of, focus_solutions
from coevolve.envs.base import step_failure
from coevolve.envs.bfcl_lite import BFCLLiteEnv
from coevolve.explore import ExploreConfig, OfflineExplorer, build_context, describe
from coevolve.records import Candidate, ExplorationEpisode, SignalEvent, Step, ToolCall, Trajectory
from coevolve.signals import SignalConfig, extract_signals, unexplored_orders, unexplored_tools
from coevolve.synthesis import signal_contexts, validate
from coevolve.validate import Validator


def rollout(trajectory_id, task_id, score, names):
    steps = tuple(Step(0, index, f"{name}()", ToolCall(name), "ok") for index, name in enumerate(names))
    return Trajectory(trajectory_id, task_id, 0, 0, steps, score)


def test_unexplored_tools_by_hand():
    exposed = {"A": ["ls", "cd", "cat"], "B": ["ls", "cat", "rm"], "C": ["cat", "rm"]}
    # cd: exposed by A only; cat: by A, B, C (second unexplored tool -> second task exposing it); rm: B, C (third
    # -> index 2 mod 2 = 0 -> B). ls was called.
    assert unexplored_tools(exposed, {"ls"}) == [("cd", "A"), ("cat", "B"), ("rm", "B")]
    assert unexplored_tools(exposed, {"ls", "cd", "cat", "rm"}) == []
    assert unexplored_tools({}, ()) == []


def test_a_tool_no_rollout_called_raises_a_rare_event_only_when_switched_on():
    rollouts = [rollout("A1", "A", 1.0, ("ls",)), rollout("A2", "A", 0.0, ("ls", "ls")),
                rollout("B1", "B", 0.0, ("rm",)), rollout("B2", "B", 0.0, ("rm",))]
    exposed = {"A": ["ls", "cd", "cat", "rm"], "B": ["ls", "cat", "rm"], "Z": ["mkdir"]}  # Z had no rollout
    config = SignalConfig(theta_percent=1.0, enabled=("rare",), unexplored=True)
    report = extract_signals(rollouts, {}, config, 3, exposed)
    unexplored = [e for e in report.events if "unexplored" in e.evidence]
    assert [(e.kind, e.evidence["unexplored"], e.task_id, e.trajectory_ids) for e in unexplored] == [
        ("rare", "cd", "A", ()), ("rare", "cat", "B", ())]  # cat: exposed by A and B, second unexplored tool -> B
    assert unexplored[0].evidence["frequencies"] == {"cd": 0.0}
    assert report.events[-2:] == tuple(unexplored)  # after the task-by-task events
    assert not [e for e in extract_signals(rollouts, {}, SignalConfig(theta_percent=1.0, enabled=("rare",)), 3,
                                           exposed).events if "unexplored" in e.evidence]
    no_rare = SignalConfig(enabled=("boundary",), unexplored=True)
    assert [e.kind for e in extract_signals(rollouts, {}, no_rare, 3, exposed).events] == ["boundary"]


def test_an_order_no_rollout_made_raises_a_rare_event_after_the_tools():
    exposed = {"A": ["ls", "cd"], "B": ["cd", "ls", "cat"]}
    # Ordered pairs of two different exposed tools, minus the bigram a rollout made (ls > cd): A gives cd > ls; B
    # adds cd > cat, ls > cat, cat > cd, cat > ls. Each goes to a task exposing both tools.
    orders = unexplored_orders(exposed, {"ls > cd"}, iteration=2)
    assert sorted(pattern for pattern, _ in orders) == ["cat > cd", "cat > ls", "cd > cat", "cd > ls", "ls > cat"]
    assert all(set(pattern.split(" > ")) <= set(exposed[task]) for pattern, task in orders)
    assert orders == unexplored_orders(exposed, {"ls > cd"}, iteration=2)  # drawn from the iteration, repeatable
    assert len({tuple(p for p, _ in unexplored_orders(exposed, (), iteration=i)) for i in range(1, 9)}) > 1
    rollouts = [rollout("A1", "A", 1.0, ("ls", "cd")), rollout("B1", "B", 0.0, ("cat",))]
    config = SignalConfig(theta_percent=1.0, enabled=("rare",), unexplored=True, unexplored_orders=True)
    events = [e for e in extract_signals(rollouts, {}, config, 2, exposed).events if "unexplored" in e.evidence]
    assert all(" > " in e.evidence["unexplored"] for e in events)  # every tool was called: no tool event
    assert sorted(e.evidence["unexplored"] for e in events) == sorted(p for p, _ in orders)
    assert all(e.evidence["frequencies"] == {e.evidence["unexplored"]: 0.0} and not e.trajectory_ids for e in events)


def test_an_order_focus_episode_makes_the_order_and_yields_its_shortest_task():
    env = BFCLLiteEnv("train")
    task = next(t for t in env.tasks() if t.truth_tools == ("ls",))
    event = SignalEvent("rare", task.id, 1, (), {"unexplored": "cd > ls", "frequencies": {"cd > ls": 0.0}})
    context = build_context(event, task, {})
    assert context.focus_tool == "cd > ls" and context.focus_tools == ("cd", "ls")
    assert "called cd and then ls right after it" in describe(context, task, 6)
    # No focus weight: only the forced last calls make the order; a refused `cd` is drawn again (focus_retries).
    explorer = OfflineExplorer(ExploreConfig(step_budget=4, focus_weight=0.0, focus_retries=8))
    episodes = [explorer.explore(env, [context], {task.id: task}, seed=seed)[0] for seed in range(6)]
    ran = [[s.call.name for s in e.steps if s.call is not None and step_failure(s) is None] for e in episodes]
    made = [names for names in ran if any(names[i:i + 2] == ["cd", "ls"] for i in range(len(names)))]
    assert len(made) >= 4, ran
    abstractions = TemplateAbstractor().abstract(env, episodes, {task.id: task})
    solutions = [c.solution for a in abstractions for c in a.candidates]
    assert solutions and all(s[-2].startswith("cd(") and s[-1].startswith("ls(") for s in solutions)
    accepted = [v.task for v in validate(abstractions, Validator(env, known=env.tasks()), 1).items if v.task]
    assert accepted and all(t.truth_tools == ("cd", "ls") for t in accepted)  # the shortest that passes: 2 calls
    assert {t.provenance.focus_tool for t in accepted} == {"cd > ls"}


def test_validation_refuses_an_order_task_whose_last_call_does_not_need_the_order():
    env = BFCLLiteEnv("train")
    task = next(t for t in env.tasks() if t.truth_tools == ("ls",))
    home = next(iter(task.initial_state["GorillaFileSystem"]["root"].values()))["contents"]
    folder = next(name for name, item in home.items() if item["type"] == "directory")
    validator = Validator(env, known=env.tasks())

    def verdict(solution, focus):
        candidate = Candidate.create(task.env, "i", "q " + " ".join(solution), solution, task.initial_state,
                                     dict(task.meta), task.id, "rare", "e", "template", focus)
        return validator.validate(candidate, 1).verdict

    # The second touch makes the same file, with the same answer, whether the first ran or not.
    free = verdict(["touch(file_name='a1')", "touch(file_name='b1')"], "touch > touch")
    assert free.codes == ("order_free",) and "touch(file_name='b1')" in free.reasons[0]
    assert verdict(["touch(file_name='a2')", "touch(file_name='b2')"], None).accepted  # no order asked: as before
    assert verdict([f"cd(folder='{folder}')", "touch(file_name='zz')"], "cd > touch").accepted  # made in the folder
    assert verdict(["mkdir(dir_name='nn')", "cd(folder='nn')"], "mkdir > cd").accepted  # fails without the mkdir
    assert verdict(["touch(file_name='q')", "ls()"], "touch > ls").accepted  # the listing shows the new file


def lite():
    env = BFCLLiteEnv("train")
    task = next(t for t in env.tasks() if t.truth_tools == ("ls",))
    return env, task


def test_the_context_names_the_tool_and_unexplored_events_lead_the_rare_turn():
    env, task = lite()
    event = SignalEvent("rare", task.id, 2, (), {"unexplored": "cat", "frequencies": {"cat": 0.0}})
    context = build_context(event, task, {})
    assert context.focus_tool == "cat" and context.focus_tools == ("cat",) and context.signal == "rare"
    assert context.id == f"rare-cat-{task.id}-i2" and "No agent has called cat yet" in describe(context, task, 6)
    plain_rare = SignalEvent("rare", task.id, 2, ("x",), {"frequencies": {"rm": 0.01}})
    boundary = SignalEvent("boundary", task.id, 2, (), {"scores": []})
    contexts = signal_contexts([plain_rare, boundary, event], {task.id: task}, {}, max_contexts=2)
    assert [c.id for c in contexts] == [f"boundary-{task.id}-i2", f"rare-cat-{task.id}-i2"]


def test_a_focus_episode_calls_its_tool_and_yields_a_one_call_task():
    env, task = lite()
    event = SignalEvent("rare", task.id, 1, (), {"unexplored": "cat", "frequencies": {"cat": 0.0}})
    context = build_context(event, task, {})
    # No focus weight at all: only the guaranteed last call makes the episode call cat.
    explorer = OfflineExplorer(ExploreConfig(step_budget=4, focus_weight=0.0))
    episodes = [explorer.explore(env, [context], {task.id: task}, seed=seed)[0] for seed in range(12)]
    assert all(e.focus == "cat" for e in episodes)
    assert all(any(s.call is not None and s.call.name == "cat" for s in e.steps) for e in episodes)
    ran = [e for e in episodes if any(s.call.name == "cat" and step_failure(s) is None
                                      for s in e.steps if s.call is not None)]
    assert ran, "some seed's cat call should find a file"

    abstractor = TemplateAbstractor()
    abstractions = abstractor.abstract(env, ran, {task.id: task})
    assert all(a.shortest_only for a in abstractions)
    for abstraction in abstractions:
        assert all(c.solution[-1].startswith("cat(") for c in abstraction.candidates)
        assert len(abstraction.candidates[0].solution) == 1  # the call alone first
    validated = validate(abstractions, Validator(env, known=env.tasks()), 1)
    accepted = [v.task for v in validated.items if v.task is not None]
    assert accepted and all(t.truth_tools[-1] == "cat" for t in accepted)
    # The focus travels: candidate -> the task's provenance, which the pool's draw weighs (loop.signal_weights).
    assert {c.focus_tool for a in abstractions for c in a.candidates} == {"cat"}
    assert {t.provenance.focus_tool for t in accepted} == {"cat"}
    # Per episode and cat call, one solution stands: the shortest that passed.
    keys = [(v.candidate.episode_id, v.candidate.solution[-1]) for v in validated.items if v.verdict.accepted]
    assert len(keys) == len(set(keys))


def step(text):
    from coevolve.calls import parse_call

    return Step(0, 0, text, parse_call(text), "{}")


def test_focus_of_names_the_focus_only_when_the_solution_calls_it():
    episode = ExplorationEpisode("e", "c", "t", "rare", "offline", (), focus="cat")
    assert focus_of(episode, ["cd(folder='d')", "cat(file_name='a')"]) == "cat"
    assert focus_of(episode, ["ls()", "  cat (file_name='a')"]) == "cat"
    assert focus_of(episode, ["ls()", "concat(x=1)"]) is None
    assert focus_of(ExplorationEpisode("e", "c", "t", "rare", "offline", ()), ["cat(file_name='a')"]) is None


def test_focus_solutions_by_hand():
    steps = [step("ls()"), step("cd(folder='a')"), step("cat(file_name='x')"), step("mkdir(dir_name='n')"),
             step("cat(file_name='y')")]
    texts = [[s.action for s in solution] for solution in focus_solutions(steps, "cat", 2)]
    assert texts == [
        ["cat(file_name='x')"], ["cat(file_name='y')"],  # one call, earlier focus call first
        ["cd(folder='a')", "cat(file_name='x')"], ["ls()", "cat(file_name='x')"],  # nearest earlier call first
        ["mkdir(dir_name='n')", "cat(file_name='y')"], ["cat(file_name='x')", "cat(file_name='y')"],
        ["cd(folder='a')", "cat(file_name='y')"], ["ls()", "cat(file_name='y')"]]
    assert focus_solutions(steps, "rm", 3) == []
    assert len(focus_solutions(steps, "cat", 1)) == 2
    # An order: the solutions end in its calls, in turn (cd, then cat), nearest earlier call first.
    assert [[s.action for s in solution] for solution in focus_solutions(steps, "cd > cat", 3)] == [
        ["cd(folder='a')", "cat(file_name='x')"], ["cd(folder='a')", "cat(file_name='y')"],
        ["ls()", "cd(folder='a')", "cat(file_name='x')"], ["ls()", "cd(folder='a')", "cat(file_name='y')"]]
    assert focus_solutions(steps, "cd > cat", 1) == []  # an order does not fit in one call
    order = ExplorationEpisode("e", "c", "t", "rare", "offline", (), focus="cd > cat")
    assert focus_of(order, ["cd(folder='d')", "cat(file_name='a')"]) == "cd > cat"
    assert focus_of(order, ["cat(file_name='a')", "cd(folder='d')"]) is None


def test_validation_skips_longer_alternatives_once_a_shorter_one_passed():
    env, task = lite()
    files = [name for name in env.reset(task).act(["ls()"])[0].observation.split('"') if "." in name]
    name = files[0]

    def candidate(solution):
        return Candidate.create(task.env, "show a file", f"Show me {name}", solution, task.initial_state, task.meta,
                                task.id, "rare", "episode-1", "template")

    one, two = candidate([f"cat(file_name='{name}')"]), candidate(["ls()", f"cat(file_name='{name}')"])
    focused = Abstraction("episode-1", (one, two), shortest_only=True)
    stage = validate([focused], Validator(env, known=env.tasks()), 1)
    assert [v.candidate.id for v in stage.items] == [one.id] and stage.skipped == {"shorter_solution_accepted": 1}
    plain = Abstraction("episode-1", (one, two))
    assert len(validate([plain], Validator(env, known=env.tasks()), 1).items) == 2
    assert ExplorationEpisode.from_dict({**ExplorationEpisode("e", "c", "t", "rare", "offline", (), focus="cat")
                                         .to_dict()}).focus == "cat"


def test_new_tool_tasks_counts_what_d0_never_calls(tmp_path):
    from dataclasses import replace

    from coevolve.pool import TaskPool
    from coevolve.records import Provenance, Task
    from coevolve.run_setup import new_tool_tasks

    def task(name, calls, source="seed"):
        made = Task.create("bfcl-lite", name, [[{"role": "user", "content": name}]], {}, [calls])
        return replace(made, provenance=Provenance(source=source))

    with TaskPool(tmp_path / "pool.sqlite") as pool:
        pool.add_tasks([task("a", ["ls()"]), task("b", ["mkdir(dir_name='x')"])], 0)
        pool.start_iteration(1)
        pool.add_tasks([task("c", ["cat(file_name='f')"], "synthetic"),
                        task("d", ["cd(folder='p')", "cat(file_name='g')"], "synthetic"),
                        task("e", ["ls(a=True)"], "synthetic")], 1)
        assert new_tool_tasks(pool, 1, {"ls", "mkdir"}) == {"admitted": 2, "one_call": 1}
        assert new_tool_tasks(pool, 0, {"ls", "mkdir"}) == {"admitted": 0, "one_call": 0}


def test_the_loop_draws_tasks_made_for_an_unexplored_tool_by_loop_signal_weights(tmp_path):
    from types import SimpleNamespace

    from coevolve.config import load_config
    from coevolve.loop import sample_tasks
    from coevolve.pool import TaskPool
    from coevolve.records import Provenance, Task

    def task(index, provenance=None):
        return Task.create("bfcl-lite", f"t{index}", [[{"role": "user", "content": f"Do thing {index}."}]], {"i": 0},
                           [[f"ls(a={index})"]], provenance=provenance)

    seeds = [task(i) for i in range(6)]
    made = [task(10 + i, Provenance("synthetic", seeds[0].id, "rare", f"e{i}", 1, "accepted",
                                    "cat" if i < 2 else None)) for i in range(8)]
    with TaskPool(tmp_path / "pool.sqlite") as pool:
        pool.add_tasks(seeds, 0)
        pool.add_tasks(made, 1)
        focus = {t.id for t in made[:2]}
        for weights, expected in (("{unexplored: 1.0e+9}", True), ("{unexplored: 0}", False)):
            config = load_config("configs/lite-tools.yaml", ["loop.recur_fraction=0", "loop.synthetic_fraction=0.5",
                                                              f"loop.signal_weights={weights}"])
            for seed in range(4):
                run = SimpleNamespace(config=replace_seed(config, seed), pool=pool, slots=4)
                drawn = {t.id for t in sample_tasks(run, 2)}
                assert (focus <= drawn) if expected else not (focus & drawn), (weights, seed)


def replace_seed(config, seed):
    from dataclasses import replace

    return replace(config, run=replace(config.run, seed=seed))
