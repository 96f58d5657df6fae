"""Records: JSON round-trip, content-hash ids, validation of enumerations."""

from __future__ import annotations

import pytest

from coevolve.records import (Candidate, Check, ExplorationContext, ExplorationEpisode, Provenance, Score,
                              SignalEvent, Step, Task, ToolCall, Trajectory, Verdict, content_hash)


def _task(**overrides):
    fields = dict(env="bfcl", name="t0", turns=[[{"role": "user", "content": "list files"}]],
                  initial_state={"GorillaFileSystem": {"root": {}}}, ground_truth=[["ls()"]],
                  meta={"involved_classes": ["GorillaFileSystem"]})
    fields.update(overrides)
    return Task.create(**fields)


def test_task_id_is_a_content_hash_independent_of_name_and_provenance():
    task = _task()
    assert task.id == _task(name="other").id
    assert task.id == _task(provenance=Provenance("synthetic", parent_id="p", signal="boundary", iteration=3)).id
    assert task.id != _task(ground_truth=[["ls(a=True)"]]).id
    assert task.id != _task(initial_state={"GorillaFileSystem": {"root": {"x": {}}}}).id
    assert len(task.id) == 16 and task.id == content_hash({
        "env": "bfcl", "turns": task.turns, "initial_state": task.initial_state,
        "ground_truth": task.ground_truth, "meta": task.meta})


def test_every_record_round_trips_through_json():
    call = ToolCall("cd", {"folder": "x"}, ("pos",))
    step = Step(0, 0, "cd(folder='x')", call, '{"current_working_directory": "x"}')
    failed_step = Step(1, 1, "oops(", None, "Error during execution: syntax error", "syntax error")
    records = [
        _task(provenance=Provenance("synthetic", "p1", "forgetting", "e1", 2, "accepted")),
        call, step, failed_step,
        Score(0.0, (Check(0, "state", False, "differs"), Check(0, "response", True))),
        Trajectory("tr1", "t1", 2, 3, (step, failed_step), 0.0, ("differs",), True, (1, 2), (3, 4), (1, 0),
                   (-0.5, 0.0), 1.5),
        SignalEvent("boundary", "t1", 2, ("tr1", "tr2"), {"scores": [0.0, 1.0]}),
        Candidate("c1", "bfcl", "make a folder", "Please create x", ("mkdir(dir_name='x')",), {"A": {}},
                  {"involved_classes": ["GorillaFileSystem"]}, "t1", "rare", "e1"),
        Verdict("c1", False, ("no_effect: no-op solution",)),
        Candidate.create("bfcl", "look", "What is here?", ["ls()"], {"A": {}}, abstractor="llm"),
        Verdict("c2", True, (), "t9"),
        ExplorationContext("ctx", "t1", "boundary", 2, ("cd",), ("x",), {"unstable_step": {"step_index": 1}},
                           ("tr1",)),
        ExplorationContext("ctx-r", "t1", None, 2),
        ExplorationEpisode("ep", "ctx", "t1", "boundary", "offline", (step, failed_step), 0.25),
        ExplorationEpisode("ep2", "ctx", "t1", None, "llm", (), 1.0, "reply 1: backend failed (HTTP 503)"),
    ]
    for record in records:
        assert type(record).from_json(record.to_json()) == record


def test_candidate_ids_hash_what_the_candidate_asks_and_does():
    make = lambda **kw: Candidate.create(**{"env": "bfcl", "intent": "i", "query": "q", "solution": ["ls()"],
                                            "initial_state": {"A": {}}, **kw})
    assert make().id == make(intent="other", parent_task_id="p", signal="rare", abstractor="template").id
    assert len({make().id, make(query="q2").id, make(solution=["ls(a=True)"]).id,
                make(initial_state={"A": {"x": 1}}).id}) == 4
    assert Verdict("c", False, ("duplicate: same as t1", "too_large: 9 calls")).codes == ("duplicate", "too_large")


def test_score_summaries():
    score = Score(0.0, (Check(0, "state", True), Check(1, "response", False, "missing x")))
    assert not score.success and score.reasons == ("missing x",)
    assert Score(1.0).success


def test_signal_kind_is_validated():
    with pytest.raises(ValueError, match="unknown signal kind"):
        SignalEvent("surprise", "t", 0, ())


def test_records_are_frozen():
    with pytest.raises(AttributeError):
        _task().name = "changed"
