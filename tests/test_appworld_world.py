"""AppWorld end to end on tasks built offline with AppWorld's own code (tests/appworld_offline.py): episodes in
their own processes, AppWorld's evaluator as the score, timeouts, crash and hang recovery, the CLI's TGC/SGC, and
a synthesized task explored, abstracted and validated by executing it in a fresh world.

Needs `.venv-appworld` (`make test` builds it). Nothing here needs `appworld download data`: the tasks, their
databases and their evaluation tests are built in a temporary APPWORLD_ROOT."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from coevolve.envs.appworld import AppWorldEnv, as_call, code_of, is_appworld_task
from coevolve.evaluate import oracle_script, run_script
from coevolve.records import Candidate
from coevolve.validate import ValidationConfig, Validator

ROOT = Path(__file__).resolve().parent.parent
APPWORLD_PYTHON = ROOT / ".venv-appworld" / "bin" / "python"
pytestmark = pytest.mark.usefixtures("appworld_venv")  # fails, naming `make appworld-venv`, without it

LOGIN = ("password = [p for p in apis.supervisor.show_account_passwords() "
         "if p['account_name'] == 'simple_note'][0]['password']\n"
         "token = apis.simple_note.login(username=apis.supervisor.show_profile()['email'], "
         "password=password)['access_token']")


@pytest.fixture(scope="module")
def appworld_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("appworld")
    subprocess.run([str(APPWORLD_PYTHON), "-I", str(ROOT / "tests" / "appworld_offline.py")], check=True,
                   env={**os.environ, "APPWORLD_ROOT": str(root)}, cwd=root, capture_output=True, timeout=600)
    return root


@pytest.fixture(scope="module")
def env(appworld_root):
    environment = AppWorldEnv(split="train", python=str(APPWORLD_PYTHON), root=str(appworld_root), step_timeout_s=3,
                              grace_s=5.0)
    yield environment
    environment.close()


def test_tasks_carry_the_instruction_supervisor_and_solution(env):
    tasks = env.tasks()
    assert [task.name for task in tasks] == ["0ff11ne_1", "0ff11ne_2"]
    task = tasks[0]
    assert "Joyce Weaver" in task.turns[0][0]["content"] and "Grocery List" in task.turns[0][0]["content"]
    assert task.initial_state == {"appworld_task": "0ff11ne_1"} and task.meta["scenario"] == "0ff11ne"
    [[call]] = task.ground_truth
    assert "create_note(title='Grocery List'" in code_of(call)
    assert is_appworld_task(task)


def test_appworld_evaluator_scores_solution_noop_and_partial(env, appworld_root):
    task = env.tasks()[0]
    solved = run_script(env, task, oracle_script(task))
    assert solved.value == 1.0 and len(solved.checks) == 4 and all(check.passed for check in solved.checks)

    episode = env.reset(task)
    assert episode.act(["print(apis.supervisor.show_profile())"])[0].error is None
    noop = episode.score()
    assert noop.value == 0.0 and not any(check.passed for check in noop.checks)
    assert any("'<<not_given>>' == '3'" in reason for reason in noop.reasons)  # AppWorld's own failure text

    # the note made, the wrong answer given: 3 of 4 tests pass; binary 0, dense 0.75
    partial = [LOGIN + "\napis.simple_note.create_note(title='Grocery List', content='eggs, milk, bread', "
               "access_token=token)\napis.supervisor.complete_task(answer=2)"]
    assert run_script(env, task, [[partial]]).value == 0.0
    dense = AppWorldEnv(split="train", python=str(APPWORLD_PYTHON), root=str(appworld_root), dense_reward=True)
    try:
        assert run_script(dense, task, [[partial]]).value == pytest.approx(0.75)
    finally:
        dense.close()


def test_episodes_of_one_task_are_isolated(env):
    task = env.tasks()[0]
    first, second = env.reset(task), env.reset(task)  # open at once: each in its own AppWorld process
    start = second.state()
    [step] = first.act([LOGIN + "\nprint(apis.simple_note.create_note(title='x', content='y', access_token=token))"])
    assert step.error is None, step.observation
    assert first.state() != start and second.state() == start
    first.close(), second.close()


def test_errors_timeouts_and_output_caps_are_observations(env, appworld_root):
    episode = env.reset(env.tasks()[1])
    [failed] = episode.act(["apis.simple_note.login(username='nobody', password='x')"])
    assert failed.error is not None and "Execution failed" in failed.observation
    [slow] = episode.act(["while True:\n    pass"])  # AppWorld's own per-cell timeout (3 s here)
    assert slow.error is not None and "timed out" in slow.observation
    [refused] = episode.act(["import os\nos.system('echo hacked')"])  # AppWorld's safety guard, in its process
    assert refused.error is not None
    [wrong_tool] = episode.act([{"name": "cd", "arguments": {"folder": "x"}}])
    assert wrong_tool.call is None and "one tool" in wrong_tool.error
    [loud] = episode.act(["print('x' * 50000)"])
    assert loud.error is None and len(loud.observation) < 4200 and "more characters cut" in loud.observation
    assert not episode.done  # all of that is data; the episode goes on
    [works] = episode.act(["print(1 + 1)"])
    assert works.observation.strip() == "2"
    episode.close()


def test_a_hung_or_crashed_process_scores_zero_and_is_replaced(env):
    task = env.tasks()[0]
    hung = env.reset(task)
    hung_process = hung._worker.process
    os.kill(hung_process.pid, signal.SIGSTOP)  # stops answering: the client's deadline (3 + 5 s) kills it
    [step] = hung.act(["print(1)"])
    assert "did not answer `execute` within 8 s" in step.error and hung.done
    assert hung_process.poll() is not None
    score = hung.score()
    assert score.value == 0.0 and "did not answer" in score.reasons[0]

    crashed = env.reset(task)
    crashed._worker.process.kill()
    [step] = crashed.act(["print(1)"])
    assert "AppWorld process" in step.error and crashed.score().value == 0.0

    assert run_script(env, task, oracle_script(task)).value == 1.0  # the next episode gets a fresh process


def test_an_unknown_world_scores_zero_with_the_reason(env):
    from dataclasses import replace

    task = replace(env.tasks()[0], initial_state={"appworld_task": "nowhere_1"})
    episode = env.reset(task)  # a bad start is the episode's failure, not the run's
    assert episode.done and episode.act(["print(1)"])[0].error is not None
    score = episode.score()
    assert score.value == 0.0 and "could not open world 'nowhere_1'" in score.reasons[0]


def test_cli_eval_reports_tgc_and_sgc(appworld_root):
    result = subprocess.run([sys.executable, "-m", "coevolve.cli", "eval", "--env", "appworld", "--split", "train",
                             "--policy", "oracle", "--json"], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "APPWORLD_ROOT": str(appworld_root),
                                 "COEVOLVE_APPWORLD_PYTHON": str(APPWORLD_PYTHON)})
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["accuracy"] == 1.0 and report["n"] == 2
    assert (report["tgc"], report["sgc"], report["scenarios"]) == (1.0, 1.0, 1)


def test_a_synthesized_task_is_validated_in_a_fresh_world(env):
    seed = env.tasks()[0]
    validator = Validator(env, ValidationConfig(max_call_chars=4000), known=env.tasks())
    make = lambda query, code: Candidate.create(env.name, "make a note", query, [as_call(code)],  # noqa: E731
                                                seed.initial_state, seed.meta, seed.id, "boundary")
    create = LOGIN + "\napis.simple_note.create_note(title='Ideas', content='solar kettle', access_token=token)"
    outcome = validator.validate(make("Add a Simple Note titled 'Ideas' that says 'solar kettle'.", create))
    assert outcome.verdict.accepted, outcome.verdict.reasons
    task = outcome.task
    assert not is_appworld_task(task) and task.provenance.source == "synthetic"

    # Its episodes are scored against the state its solution leaves in a fresh world.
    assert run_script(env, task, oracle_script(task)).value == 1.0
    other = LOGIN + "\napis.simple_note.create_note(title='Ideas', content='other', access_token=token)"
    assert run_script(env, task, [[[as_call(other)]]]).value == 0.0

    rejected = {
        "bad password": LOGIN.replace("password=password", "password='wrong'"),
        "imports": "import os\nprint(os.listdir('/'))",
        "dunder": "print(apis.__class__)",
        "reads only nothing": "x = 1",
    }
    codes = {name: validator.validate(make(f"Do {name}.", code)).verdict.codes for name, code in rejected.items()}
    assert codes == {"bad password": ("execution_error",), "imports": ("unsafe_argument",),
                     "dunder": ("private_function",), "reads only nothing": ("no_effect",)}
    again = validator.validate(make("Add a Simple Note titled 'Ideas' that says 'solar kettle'.", create))
    assert again.verdict.codes == ("duplicate",)


def test_explore_abstract_validate_on_appworld(env, tokenizer, scripted):
    """Synthesis's three steps through their usual interfaces: an LLM explorer (scripted replies in the
    `code` format: fenced cells, AppWorld's way of acting) acts in the flagged task's world, the template abstractor turns its successful cells into
    candidates, and the validator executes them in fresh worlds."""
    from coevolve.abstract import TemplateAbstractor
    from coevolve.explore import ExploreConfig, LLMExplorer
    from coevolve.policy.chat import ChatRenderer
    from coevolve.records import ExplorationContext

    seed = env.tasks()[0]
    cells = [LOGIN + "\nprint(apis.simple_note.create_note(title='Trip', content='pack boots', access_token=token))",
             "print([note['title'] for note in apis.simple_note.search_notes(access_token=token)])"]

    def reply_for(context_text):
        replies = context_text.count("<|im_start|>assistant") - 1
        return f"Next:\n```python\n{cells[replies]}\n```" if replies < len(cells) else "Done."

    context = ExplorationContext("ctx-aw", seed.id, "boundary", 1)
    [episode] = LLMExplorer(scripted(tokenizer, reply_for), ChatRenderer(tokenizer, "code"),
                            ExploreConfig(step_budget=3), max_new_tokens=400,
                            max_episode_tokens=8000).explore(env, [context], {seed.id: seed})
    assert [step.error for step in episode.steps] == [None, None], [s.observation for s in episode.steps]
    assert "Trip" in episode.steps[1].observation  # the second cell saw the first one's note: one world

    [abstraction] = TemplateAbstractor(max_solution_calls=2).abstract(env, [episode], {seed.id: seed})
    assert abstraction.candidates and all(c.initial_state == seed.initial_state for c in abstraction.candidates)
    validator = Validator(env, ValidationConfig(max_call_chars=4000, max_solution_calls=2), known=[seed])
    verdicts = {candidate.solution: validator.validate(candidate, iteration=1) for candidate in abstraction.candidates}
    accepted = [outcome.task for outcome in verdicts.values() if outcome.verdict.accepted]
    assert any("create_note(title='Trip'" in code_of(call) for task in accepted for call in task.ground_truth[0])
    for task in accepted:
        assert task.provenance.signal == "boundary" and task.provenance.episode_id == episode.id


def test_the_loop_trains_on_appworld(appworld_root, tmp_path, tiny_dir):
    """`coevolve train` on AppWorld: rollouts through the worker processes inside TRL's rollout_func, AppWorld's
    evaluator as the reward, held-out evaluation, synthesis — one iteration with a tiny random model."""
    from coevolve.loop import run

    out = tmp_path / "run"
    settings = [f"model.name={tiny_dir}", "model.demos=0", "model.device=cpu", "env.name=appworld",
                "env.split=train", f"env.options.root={appworld_root}", f"env.options.python={APPWORLD_PYTHON}",
                "rollout.group_size=2", "rollout.max_new_tokens=8", "rollout.max_replies_per_turn=1",
                "rollout.max_episode_tokens=64", "grpo.prompts_per_step=1", "run.max_steps=1", "run.save_steps=10",
                "loop.steps_per_iteration=1", "loop.eval_split=train", "loop.eval_limit=1", "run.mode=coevolve",
                # The offline world has the train split only: held out on purpose (the check would refuse it).
                "loop.allow_heldout_overlap=true",
                "synthesis.max_call_chars=4000"]
    result = run(None, settings, str(out), say=lambda text: None)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert result.final_step == 1 and [m["iteration"] for m in metrics] == [0, 1]
    assert metrics[0]["heldout_success"] == 0.0 and metrics[1]["train_success"] == 0.0  # random replies
    assert (out / "report.html").exists()


def test_the_shipped_appworld_config_runs_one_iteration_on_the_cpu(appworld_root, tmp_path, tokenizer):
    """configs/appworld-qwen3-4b.yaml rehearsed as the BFCL configs are (test_gpu_configs.py): a tiny random Qwen3
    with Qwen3's template, vLLM off, CPU sizes; AppWorld's offline-built data (train split only, so held-out is
    evaluated on train here)."""
    import copy

    from coevolve.loop import run
    from coevolve.policy.models import build_tiny_model
    from conftest import trl_template
    from support import save_model
    from test_gpu_configs import CPU_SIZES

    qwen3 = copy.deepcopy(tokenizer)
    qwen3.chat_template = trl_template("qwen3")
    model_dir = save_model(build_tiny_model(qwen3, family="qwen3"), qwen3, tmp_path / "qwen3")
    out = tmp_path / "run"
    run(str(ROOT / "configs" / "appworld-qwen3-4b.yaml"),
        [f"model.name={model_dir}", *CPU_SIZES, "rollout.group_size=2", "grpo.micro_batch_size=2",
         f"env.options.root={appworld_root}", f"env.options.python={APPWORLD_PYTHON}", "loop.eval_split=train",
         "loop.eval_limit=1", "loop.allow_heldout_overlap=true"], str(out), say=lambda text: None)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in metrics] == [0, 1] and (out / "final").exists()
