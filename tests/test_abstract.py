"""Abstraction: the template abstractor's windows and queries; the LLM abstractor end to end over real HTTP
against the local OpenAI-compatible server (good replies, malformed replies retried with the reason, a server
that fails or hangs, a spent time budget), its candidates going on to validation."""

from __future__ import annotations

import json
import time

import pytest

from coevolve.abstract import LLMAbstractor, TemplateAbstractor, parse_reply, template_query, tool_phrase
from coevolve.envs.bfcl_lite import BFCLLiteEnv
from coevolve.synthesis import synthesis_phase
from coevolve.policy.openai_backend import OpenAIBackend
from coevolve.policy.serve import ChatServer
from coevolve.records import ExplorationContext, ExplorationEpisode
from coevolve.validate import Validator

CALLS = ["ls()", "cd(folder='photos')", "cat(file_name='missing.txt')", "ls()"]


@pytest.fixture(scope="module")
def lite():
    env = BFCLLiteEnv("train")
    task = env.tasks()[0]  # its root holds a `photos` folder
    episode = env.reset(task)
    steps = tuple(step for call in CALLS for step in episode.act([call]))
    explored = ExplorationEpisode("ep-1", "ctx-1", task.id, "boundary", "offline", steps)
    return env, task, explored


def test_tool_phrase_takes_the_tools_own_description():
    doc = {"name": "cd", "description": "This tool belongs to X. Tool description: Change the directory. More."}
    assert tool_phrase(doc, "cd") == "Change the directory"
    assert tool_phrase({"description": "Sort a file by line."}, "sort") == "Sort a file by line"
    assert tool_phrase(None, "mystery") == "Call mystery"


def test_template_abstractor_windows_successful_calls_shortest_first(lite):
    env, task, explored = lite
    [abstraction] = TemplateAbstractor(max_solution_calls=2).abstract(env, [explored], {task.id: task})
    solutions = [c.solution for c in abstraction.candidates]
    # The failed cat is left out; ls(), cd, ls() remain: windows of 1 (ls twice is one candidate), then of 2.
    assert solutions == [("ls()",), ("cd(folder='photos')",), ("ls()", "cd(folder='photos')"),
                         ("cd(folder='photos')", "ls()")]
    candidate = abstraction.candidates[3]
    assert candidate.query == ("First, change the current working directory to the specified folder, with folder "
                               "'photos'. Finally, list the contents of the current directory.")
    assert candidate.initial_state == task.initial_state and candidate.parent_task_id == task.id
    assert candidate.signal == "boundary" and candidate.episode_id == "ep-1" and candidate.abstractor == "template"
    assert candidate.meta["num_calls"] == 2 and candidate.meta["excluded_function"] == task.meta["excluded_function"]
    verdicts = [Validator(env).validate(c).verdict for c in abstraction.candidates]
    assert [v.accepted for v in verdicts] == [True, True, True, True], [v.reasons for v in verdicts]


def test_parse_reply_checks_the_schema():
    good = {"tasks": [{"intent": "look", "query": "What is here?", "solution": ["ls()"]}]}
    assert parse_reply(json.dumps(good), 3, 3) == good["tasks"]
    assert parse_reply("Sure!\n```json\n" + json.dumps(good) + "\n```", 3, 3) == good["tasks"]
    assert parse_reply("Here you go: " + json.dumps(good) + " Enjoy.", 3, 3) == good["tasks"]
    assert "not JSON" in parse_reply("I cannot do that.", 3, 3)
    assert '"tasks" list' in parse_reply("[1, 2]", 3, 3)
    assert "empty" in parse_reply('{"tasks": []}', 3, 3)
    assert "at most 1" in parse_reply(json.dumps({"tasks": good["tasks"] * 2}), 1, 3)
    assert "lacks solution" in parse_reply('{"tasks": [{"intent": "a", "query": "b"}]}', 3, 3)
    assert "non-empty list" in parse_reply('{"tasks": [{"intent": "a", "query": "b", "solution": "ls()"}]}', 3, 3)
    assert parse_reply('{"tasks": [{"intent": "a", "query": "b", "solution": ["a()", "b()"]}]}', 3, 1) == \
        'task 1: "solution" has 2 calls; at most 1'
    assert "not empty" in parse_reply('{"tasks": [{"intent": "a", "query": " ", "solution": ["a()"]}]}', 3, 3)


GOOD_REPLY = json.dumps({"tasks": [
    {"intent": "enter photos and look", "query": "Go into the photos folder and tell me what is in it.",
     "solution": ["cd(folder='photos')", "ls()"]},
    {"intent": "look around", "query": "What files are here?", "solution": ["ls()"]},
]})


def _server(tokenizer, scripted, reply_for, **options):
    return ChatServer(scripted(tokenizer, reply_for), model_name="abstractor", **options)


def _client(server, **options):
    options = {"backoff_seconds": 0.01, "max_retries": 2, **options}
    return OpenAIBackend("abstractor", base_url=server.base_url, **options)


def test_llm_abstractor_over_http_gives_candidates_that_validate(lite, tokenizer, scripted):
    env, task, explored = lite
    seen = []
    with _server(tokenizer, scripted, lambda context: seen.append(context) or GOOD_REPLY) as server:
        [abstraction] = LLMAbstractor(_client(server)).abstract(env, [explored], {task.id: task})
    assert abstraction.failure is None and abstraction.attempts == 1
    assert [c.solution for c in abstraction.candidates] == [("cd(folder='photos')", "ls()"), ("ls()",)]
    assert abstraction.candidates[0].query == "Go into the photos folder and tell me what is in it."
    assert all(c.abstractor == "llm" and c.initial_state == task.initial_state for c in abstraction.candidates)
    # The prompt showed the log, failures marked, and the tools.
    assert "cat(file_name='missing.txt') -> FAILED" in seen[0] and "- mkdir(dir_name)" in seen[0]
    validator = Validator(env)
    assert all(validator.validate(c).verdict.accepted for c in abstraction.candidates)


def test_malformed_replies_are_sent_back_with_the_reason_then_given_up(lite, tokenizer, scripted):
    env, task, explored = lite
    second = ExplorationEpisode("ep-2", "ctx-1", task.id, None, "offline", explored.steps)

    def fixable(context):  # garbage first; after being told why, a good reply
        return GOOD_REPLY if "That reply cannot be used: the reply is not JSON" in context else "Here are some tasks!"

    with _server(tokenizer, scripted, fixable) as server:
        [fixed] = LLMAbstractor(_client(server)).abstract(env, [explored], {task.id: task})
    assert fixed.failure is None and fixed.attempts == 2 and len(fixed.candidates) == 2

    with _server(tokenizer, scripted, lambda context: '{"tasks": [{"query": "no solution"}]}') as server:
        client = _client(server)
        abstractions = LLMAbstractor(client, max_format_retries=2).abstract(env, [explored, second],
                                                                            {task.id: task})
    assert [a.failure_code for a in abstractions] == ["malformed_reply", "malformed_reply"]
    assert all(a.attempts == 3 and not a.candidates for a in abstractions)
    assert "lacks intent, solution" in abstractions[0].failure
    assert client.stats["requests"] == 6  # 2 episodes x (1 + 2 retries), batched per round


def _always(status):
    return lambda path, body: (status, {"error": {"message": f"injected {status}"}})


def test_a_failing_or_hanging_endpoint_is_retried_then_skipped_and_the_phase_goes_on(lite, tokenizer, scripted):
    env, task, explored = lite
    with _server(tokenizer, scripted, lambda c: GOOD_REPLY, before_request=_always(503)) as server:
        client = _client(server)
        [failed] = LLMAbstractor(client).abstract(env, [explored], {task.id: task})
    assert failed.failure_code == "endpoint_error" and "503" in failed.failure
    assert client.stats["attempts"] == 3 and client.stats["retries"] == 2 and client.stats["failures"] == 1

    def slow(path, body):
        time.sleep(1.0)
        return None

    with _server(tokenizer, scripted, lambda c: GOOD_REPLY, before_request=slow) as server:
        client = _client(server, timeout=0.2, max_retries=1)
        [timed_out] = LLMAbstractor(client).abstract(env, [explored], {task.id: task})
    assert timed_out.failure_code == "endpoint_error" and "Timeout" in timed_out.failure

    # Inside the synthesis phase: the episodes are skipped and counted, the phase returns normally.
    from coevolve.explore import OfflineExplorer

    contexts = [ExplorationContext(f"c{i}", task.id, "rare", 1, ("ls",)) for i in range(2)]
    with _server(tokenizer, scripted, lambda c: GOOD_REPLY, before_request=_always(500)) as server:
        result = synthesis_phase(env, contexts, {task.id: task}, OfflineExplorer(), LLMAbstractor(_client(server)),
                                Validator(env), iteration=1)
    assert result.skipped == {"endpoint_error": 2} and not result.validations and len(result.episodes) == 2


def test_a_spent_time_budget_skips_the_rest(lite, tokenizer, scripted):
    env, task, explored = lite
    with _server(tokenizer, scripted, lambda c: GOOD_REPLY) as server:
        [late] = LLMAbstractor(_client(server)).abstract(env, [explored], {task.id: task},
                                                         deadline=time.monotonic() - 1)
    assert late.failure_code == "time_budget" and late.attempts == 0


def test_template_query_reads_like_steps(lite):
    _, _, explored = lite
    docs = {"ls": {"description": "Tool description: List the contents."},
            "cd": {"description": "Tool description: Change the directory."}}
    steps = [explored.steps[0], explored.steps[1], explored.steps[3]]
    assert template_query(steps, docs) == ("First, list the contents. Then, change the directory, with folder "
                                           "'photos'. Finally, list the contents.")


def test_template_query_leaves_out_arguments_at_their_default():
    from coevolve.records import Step, ToolCall

    docs = {"ls": {"description": "Tool description: List the contents.",
                   "parameters": {"properties": {"a": {"type": "boolean", "default": False}}}}}
    at_default = Step(0, 0, "ls(a=False)", ToolCall("ls", {"a": False}), "{}")
    hidden = Step(0, 0, "ls(a=True)", ToolCall("ls", {"a": True}), "{}")
    assert template_query([at_default], docs) == "List the contents."
    assert template_query([hidden], docs) == "List the contents, with a set to true."
