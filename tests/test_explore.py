"""Exploration: contexts carry the right evidence per signal; the offline explorer is seeded, keeps its budget,
follows the context's focus and starts from the flagged task's state; the LLM explorer runs through the rollout
engine with a prompt that states the signal."""

from __future__ import annotations

from collections import Counter

import pytest

from coevolve.envs.bfcl_lite import BFCLLiteEnv
from coevolve.explore import (ExploreConfig, LLMExplorer, OfflineExplorer, build_context, describe,
                              observation_values, random_contexts, state_values, unstable_step)
from coevolve.policy.chat import ChatRenderer
from coevolve.records import ExplorationContext, ExplorationEpisode, SignalEvent, Step, ToolCall, Trajectory


def _step(text, observation="{}", error=None):
    name = text.split("(")[0]
    return Step(0, 0, text, ToolCall(name, {"folder": text.split("'")[1]} if "'" in text else {}), observation, error)


def _trajectory(tid, calls, score, reasons=()):
    return Trajectory(tid, "t", 1, 0, tuple(_step(c) for c in calls), score, tuple(reasons))


@pytest.fixture(scope="module")
def env_and_task():
    env = BFCLLiteEnv("train")
    return env, env.tasks()[0]


def test_unstable_step_is_where_a_failure_leaves_the_closest_success():
    good = _trajectory("g", ["cd(folder='a')", "ls()"], 1.0)
    good2 = _trajectory("g2", ["ls()"], 1.0)
    bad = _trajectory("b", ["cd(folder='a')", "cat()"], 0.0)
    split = unstable_step([good2, good], [bad])
    assert split["step_index"] == 1 and split["success_call"] == "ls()" and split["failure_call"] == "cat()"
    assert split["success_id"] == "g" and split["failure_id"] == "b"
    assert unstable_step([], [bad]) is None


def test_contexts_keep_the_evidence_of_each_signal(env_and_task):
    _, task = env_and_task
    truth_tool = task.ground_truth[0][0].split("(")[0]
    failed = _trajectory("f1", ["cd(folder='photos')", "mkdir(folder='x')"], 0.0, ["turn 0: state differs"])
    failed = Trajectory(failed.id, task.id, 2, 0, failed.steps[:1] + (
        Step(0, 1, "mkdir(folder='x')", ToolCall("mkdir", {"folder": "x"}), "Error during execution: bad arg",
             "mkdir got an unexpected keyword argument 'folder'"),), 0.0, failed.reasons)
    ok = Trajectory("s1", task.id, 2, 1, (_step("cd(folder='photos')"), _step("ls()")), 1.0)
    trajectories = {t.id: t for t in (failed, ok)}

    forgetting = build_context(SignalEvent("forgetting", task.id, 2, ("f1",), {"history_window": [1.0], "now": 0.0}),
                               task, trajectories)
    assert forgetting.signal == "forgetting" and forgetting.evidence["history"] == [1.0]
    assert [s["action"] for s in forgetting.evidence["failed_steps"]] == ["cd(folder='photos')", "mkdir(folder='x')"]
    assert "unexpected keyword" in forgetting.evidence["failed_steps"][1]["reason"]
    assert forgetting.evidence["failure_reasons"] == ["turn 0: state differs"]
    assert forgetting.focus_tools[0] == truth_tool and {"cd", "mkdir"} <= set(forgetting.focus_tools)
    assert "photos" in forgetting.focus_values and "x" in forgetting.focus_values

    boundary = build_context(SignalEvent("boundary", task.id, 2, ("f1", "s1"), {"scores": [0.0, 1.0]}), task,
                             trajectories)
    assert boundary.evidence["unstable_step"]["step_index"] == 1
    assert boundary.evidence["unstable_step"]["success_call"] == "ls()"
    assert {"ls", "mkdir"} <= set(boundary.focus_tools)

    rare = build_context(SignalEvent("rare", task.id, 2, ("s1",), {"frequencies": {"cd > ls": 0.004}}), task,
                         trajectories)
    assert rare.evidence == {"patterns": {"cd > ls": 0.004}} and set(rare.focus_tools) == {"cd", "ls"}
    assert len({forgetting.id, boundary.id, rare.id}) == 3
    assert ExplorationContext.from_json(rare.to_json()) == rare

    prompt = describe(boundary, task, step_budget=5)
    assert "only sometimes" in prompt and "ls()" in prompt and "about 5 calls" in prompt
    assert "rarely" in describe(rare, task, 5) and "cd > ls" in describe(rare, task, 5)


def test_random_contexts_have_no_signal_and_cover_tasks_evenly():
    tasks = BFCLLiteEnv("train").tasks()[:5]
    contexts = random_contexts(tasks, 7, iteration=3, seed=1)
    assert len(contexts) == 7 and len({c.id for c in contexts}) == 7
    assert all(c.signal is None and not c.focus_tools and not c.evidence for c in contexts)
    counts = Counter(c.task_id for c in contexts)
    assert len(counts) == 5 and max(counts.values()) == 2  # without replacement until every task was drawn once
    assert random_contexts(tasks, 7, 3, 1) == contexts and random_contexts(tasks, 7, 3, 2) != contexts


def test_argument_values_come_from_the_state_and_observations(env_and_task):
    _, task = env_and_task
    values = state_values(task.initial_state)
    assert "budget.csv" in values and "archive" in values
    assert not {"type", "contents", "content", "GorillaFileSystem"} & set(values)  # structure, not content
    assert observation_values('{"current_directory_content": ["a.txt", "docs"]}') == ["a.txt", "docs"]
    assert observation_values("not json") == [] and observation_values('{"p": "/abs/path"}') == []


def test_offline_explorer_is_seeded_keeps_its_budget_and_follows_the_focus(env_and_task):
    env, task = env_and_task
    tasks = {task.id: task}
    explorer = OfflineExplorer(ExploreConfig(step_budget=5, episodes_per_context=3, focus_weight=0.9))
    focused = ExplorationContext("ctx", task.id, "rare", 1, focus_tools=("mkdir",), focus_values=("zeta",))
    episodes = explorer.explore(env, [focused], tasks, seed=7)
    assert len(episodes) == 3 and len({e.id for e in episodes}) == 3
    assert all(len(e.steps) == 5 and e.signal == "rare" and e.explorer == "offline" for e in episodes)
    assert [e.steps for e in explorer.explore(env, [focused], tasks, seed=7)] == [e.steps for e in episodes]
    assert [e.steps for e in explorer.explore(env, [focused], tasks, seed=8)] != [e.steps for e in episodes]
    exposed = {doc["name"] for doc in env.reset(task).tools()}
    names = [step.call.name for e in episodes for step in e.steps]
    assert set(names) <= exposed  # only tools the task exposes
    assert names.count("mkdir") >= 10  # ~0.9 + 0.1/6 of 15 steps; uniform would give ~2.5
    unfocused = explorer.explore(env, [ExplorationContext("r", task.id, None, 1)], tasks, seed=7)
    assert sum(step.call.name == "mkdir" for e in unfocused for step in e.steps) < 10
    # It explores the task's own state: a listing of the root shows the task's files.
    listings = [s.observation for e in episodes + unfocused for s in e.steps if s.action == "ls()"]
    root_files = [n for n in next(iter(task.initial_state["GorillaFileSystem"]["root"].values()))["contents"]]
    assert any(all(name in listing for name in root_files if not name.startswith(".")) for listing in listings)
    assert ExplorationEpisode.from_json(episodes[0].to_json()) == episodes[0]


def test_llm_explorer_plays_through_the_rollout_engine(env_and_task, tokenizer, scripted):
    env, task = env_and_task
    prompts = []

    def reply_for(context):
        prompts.append(context)
        replies = context.count("<|im_start|>assistant") - 1
        return ["[ls()]", "[cd(folder='photos')]", "[mkdir(dir_name='new')]", "[ls()]", "[ls()]", "[ls()]"][replies]

    explorer = LLMExplorer(scripted(tokenizer, reply_for), ChatRenderer(tokenizer, "python"),
                           ExploreConfig(step_budget=3, episodes_per_context=2))
    context = ExplorationContext("ctx-b", task.id, "boundary", 4, focus_tools=("cd",),
                                 evidence={"unstable_step": {"step_index": 0, "success_call": "cd(folder='photos')",
                                                             "failure_call": "ls()"}})
    episodes = explorer.explore(env, [context], {task.id: task}, seed=0)
    assert len(episodes) == 2 and all(e.explorer == "llm" and e.context_id == "ctx-b" for e in episodes)
    assert [s.action for s in episodes[0].steps] == ["ls()", "cd(folder='photos')", "mkdir(dir_name='new')"]
    assert "only sometimes" in prompts[0] and "cd(folder='photos') (worked)" in prompts[0]
    assert "budget.csv" in episodes[0].steps[0].observation  # explored from the flagged task's state


def test_llm_explorer_over_an_openai_endpoint_and_when_it_fails(env_and_task, tokenizer, scripted):
    from coevolve.policy.openai_backend import OpenAIBackend
    from coevolve.policy.serve import ChatServer

    env, task = env_and_task
    context = ExplorationContext("ctx-r", task.id, "rare", 2, focus_tools=("cat",),
                                 evidence={"patterns": {"cat": 0.001}})

    def reply_for(context_text):
        return "Done." if "<|im_start|>tool" in context_text[-600:] else "<tool_call>\n" \
            '{"name": "cat", "arguments": {"file_name": "budget.csv"}}\n</tool_call>'

    with ChatServer(scripted(tokenizer, reply_for), model_name="explorer") as server:
        client = OpenAIBackend("explorer", base_url=server.base_url, backoff_seconds=0.01, max_retries=1)
        [episode] = LLMExplorer(client, ChatRenderer(None, "hermes"), ExploreConfig(step_budget=4)).explore(
            env, [context], {task.id: task})
    assert episode.error is None and [s.call.name for s in episode.steps] == ["cat"]
    assert "Error at line 7." in episode.steps[0].observation  # budget.csv's content in this task's state

    failing = lambda path, body: (503, {"error": {"message": "down"}})
    with ChatServer(scripted(tokenizer, reply_for), model_name="explorer", before_request=failing) as server:
        client = OpenAIBackend("explorer", base_url=server.base_url, backoff_seconds=0.01, max_retries=1)
        [episode] = LLMExplorer(client, ChatRenderer(None, "hermes")).explore(env, [context], {task.id: task})
    assert episode.steps == () and "backend failed" in episode.error and "503" in episode.error
