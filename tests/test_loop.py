"""The CoEvolve loop: two iterations of every mode on a tiny model, the per-iteration metrics, cross-domain
evaluation, and a SIGKILL in the middle of synthesis followed by --resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from coevolve.loop import run
from coevolve.pool import TaskPool
from support import ls_tasks, run_record, write_tasks

REPO = Path(__file__).resolve().parent.parent
FIELDS = {"iteration", "steps", "train_success", "heldout_success", "signals", "synthesis", "pool", "failures",
          "seconds", "feedback_share", "heldout_by_calls", "heldout_by_tools",
          "patterns", "train_seconds", "guided", "new_tool_tasks", "draw", "state_tasks"}


def settings(model_dir: Path, tasks_file: Path, mode: str, *extra: str) -> list[str]:
    """Two iterations of one GRPO step each: 4 `ls()` tasks, 2 per step, K=4, short replies, 4 held-out tasks."""
    return [
        f"model.name={model_dir}", "model.demos=0", "model.device=cpu", f"env.tasks_file={tasks_file}",
        "rollout.group_size=4", "rollout.max_new_tokens=12", "rollout.max_replies_per_turn=1",
        "rollout.max_episode_tokens=64", "rollout.temperature=1.0", "grpo.prompts_per_step=2",
        "grpo.learning_rate=1e-3", "run.seed=0", "run.max_steps=2", "run.save_steps=10",
        "loop.steps_per_iteration=1", "loop.eval_limit=4", "loop.synthetic_contexts=3", f"run.mode={mode}",
        # The taught model only ever calls ls/pwd: explore wider than its focus, or every find repeats `ls()`.
        "synthesis.focus_weight=0.3", "synthesis.episodes_per_context=2", *extra,
    ]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture()
def tasks_file(tmp_path) -> Path:
    return write_tasks(ls_tasks(4), tmp_path / "tasks.jsonl")


@pytest.mark.parametrize("mode", ["zero-shot", "static", "synthetic", "random", "coevolve"])
def test_every_mode_runs_two_iterations_and_records_them(mode, tmp_path, ls_policy_dir, tasks_file):
    out = tmp_path / mode
    result = run(None, settings(ls_policy_dir, tasks_file, mode), str(out), say=lambda text: None)
    metrics = read_jsonl(out / "metrics.jsonl")
    assert all(set(m) == FIELDS for m in metrics)
    assert metrics[0]["iteration"] == 0 and metrics[0]["heldout_success"] is not None
    summary = json.loads((out / "summary.json").read_text())
    with TaskPool(out / "pool.sqlite") as pool:
        synthetic_at_0 = len(pool.tasks_at(0, source="synthetic"))
        latest = pool.latest_iteration()
        synthetic = len(pool.tasks_at(latest, source="synthetic"))
    heldout = read_jsonl(out / "heldout.jsonl")  # per task, per evaluated iteration
    assert all(sum(r["iteration"] == m["iteration"] for r in heldout) == 4 for m in metrics)
    assert all(sum(r["success"] for r in heldout if r["iteration"] == m["iteration"]) / 4 == m["heldout_success"]
               for m in metrics)
    if mode == "zero-shot":
        assert len(metrics) == 1 and result.final_step == 0 and not (out / "checkpoints").exists()
        return
    assert [m["iteration"] for m in metrics] == [0, 1, 2] and result.final_step == 2
    assert [m["steps"] for m in metrics[1:]] == [[1, 1], [2, 2]]
    assert all(m["heldout_success"] is not None for m in metrics)  # eval_every = 1
    assert all(0.0 <= m["train_success"] <= 1.0 and m["seconds"]["train"] > 0 for m in metrics[1:])
    assert all(set(m["seconds"]) == {"train", "signals", "synthesis", "eval"} for m in metrics)
    from coevolve.train.calls import TRAIN_PARTS

    trained = [m for m in metrics[1:] if m["train_seconds"]]
    assert all(set(m["train_seconds"]) == set(TRAIN_PARTS) for m in trained)
    assert all(m["train_seconds"]["rollout"] > 0 and m["train_seconds"]["save"] > 0 for m in trained)
    assert all(sum(m["train_seconds"].values()) <= m["seconds"]["train"] + 1e-3 for m in trained)
    assert bool(trained) == (mode != "zero-shot")
    assert all(0.0 <= m["feedback_share"] < 1.0 for m in metrics)
    assert all(set(m["signals"]) == {"forgetting", "boundary", "rare"} for m in metrics)
    assert sum(m["signals"]["boundary"] for m in metrics) > 0  # the taught model's ls/pwd groups are mixed
    assert metrics[-1]["pool"]["total"] == metrics[-1]["pool"]["seed"] + metrics[-1]["pool"]["synthetic"]
    assert summary["mode"] == mode and summary["steps"] == 2 and summary["tasks_added"] == synthetic
    rollouts = read_jsonl(out / "rollouts.jsonl")
    assert {r["iteration"] for r in rollouts} == {1, 2} and len(rollouts) == 2 * 2 * 4
    lineage = read_jsonl(out / "synthesis.jsonl") if (out / "synthesis.jsonl").exists() else []
    if mode in ("static",):
        assert synthetic == 0 and all(m["synthesis"] == {} for m in metrics) and not lineage
    if mode == "synthetic":
        assert synthetic_at_0 > 0 and synthetic == synthetic_at_0  # once, before training, then static
        assert {row["iteration"] for row in lineage} == {0} and all(m["synthesis"] == {} for m in metrics)
    if mode in ("random", "coevolve"):
        fed = [m["synthesis"] for m in metrics[1:] if m["synthesis"]]
        assert fed and all(f["candidates"] == f["accepted"] + f["rejected"] for f in fed)
        signal = "random" if mode == "random" else "boundary"
        assert all(set(f["contexts_by_signal"]) <= {signal, "forgetting", "rare"} for f in fed)
        assert all(row["signal"] == "random" for row in lineage) == (mode == "random")
        assert synthetic == sum(f["accepted"] for f in fed) > 0
        # The next iteration trains on the evolved pool: synthetic tasks appear among iteration 2's rollouts.
        with TaskPool(out / "pool.sqlite") as pool:
            added = {task.id for task in pool.tasks_at(1, source="synthetic")}
        assert added & {r["task_id"] for r in rollouts if r["iteration"] == 2}


EXECUTION_CODES = {"execution_error", "no_effect", "redundant", "not_reproducible", "unsolvable"}


def test_signal_switches_and_validation_off(tmp_path, ls_policy_dir, tasks_file):
    out = tmp_path / "no-boundary"
    run(None, settings(ls_policy_dir, tasks_file, "coevolve", "signals.enabled=[forgetting, rare]"), str(out),
        say=lambda text: None)
    assert all(m["signals"]["boundary"] == 0 for m in read_jsonl(out / "metrics.jsonl"))  # off: never mined

    def rejected(directory):
        codes = set()
        for m in read_jsonl(directory / "metrics.jsonl"):
            codes |= set(m["synthesis"].get("rejected_by_code", {}))
        return codes

    checked, unchecked = tmp_path / "checked", tmp_path / "unchecked"
    run(None, settings(ls_policy_dir, tasks_file, "coevolve"), str(checked), say=lambda text: None)
    run(None, settings(ls_policy_dir, tasks_file, "coevolve", "synthesis.check_execution=false"), str(unchecked),
        say=lambda text: None)
    assert rejected(checked) & EXECUTION_CODES  # executing the candidates finds some wanting...
    assert not rejected(unchecked) & EXECUTION_CODES  # ...which the no-validation ablation admits


def test_cross_domain_evaluation_on_another_env(tmp_path, ls_policy_dir, tasks_file):
    out = tmp_path / "cross"
    run(None, settings(ls_policy_dir, tasks_file, "zero-shot", "loop.eval_env=bfcl", "loop.eval_split=null",
                       "loop.eval_category=multi_turn_base", "loop.eval_limit=2", "rollout.max_turns=1"),
        str(out), say=lambda text: None)
    [baseline] = read_jsonl(out / "metrics.jsonl")
    assert baseline["heldout_success"] == 0.0  # a model that says ls()/pwd() solves no BFCL-V3 entry


KILL_IN_FEEDBACK = """
import os, signal, sys
import coevolve.loop as loop
original = loop.admit
def dying(run, t, *stages):
    result = original(run, t, *stages)  # explored, validated, admitted into D_t, logged...
    if result is not None and result.admitted:
        print("killed in iteration", t, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # ...and killed before the iteration's metrics line
    return result
loop.admit = dying
loop.run(None, sys.argv[2:], sys.argv[1], say=lambda text: None)
"""


def test_sigkill_in_synthesis_then_resume_loses_and_doubles_nothing(tmp_path, ls_policy_dir, tasks_file):
    # The whole method: guidance and the unexplored rare on (a redo reads guided rollouts back from the log too).
    options = settings(ls_policy_dir, tasks_file, "coevolve", "run.max_steps=3", "grpo.guidance=solution",
                       "signals.unexplored=true")
    reference = tmp_path / "reference"
    run(None, options, str(reference), say=lambda text: None)

    killed = tmp_path / "killed"
    died = subprocess.run([sys.executable, "-c", KILL_IN_FEEDBACK, str(killed), *options], cwd=REPO,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO / "tests")})
    assert died.returncode == -9, died.stderr[-2000:]
    killed_in = int(died.stdout.split("killed in iteration")[1].split()[0])
    recorded = [m["iteration"] for m in read_jsonl(killed / "metrics.jsonl")]
    assert recorded == list(range(killed_in))  # the iteration killed in its synthesis never committed
    with TaskPool(killed / "pool.sqlite") as pool:
        assert pool.tasks_at(killed_in, source="synthetic")  # its tasks were admitted before the kill

    resumed = subprocess.run([sys.executable, "-m", "coevolve.cli", "train", "--output-dir", str(killed),
                              "--resume"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]

    got, want = run_record(killed), run_record(reference)
    assert got["steps"] == want["steps"] == [1, 2, 3]
    assert got["metrics"] == want["metrics"]
    assert got["versions"] == want["versions"] and got["history"] == want["history"]
    assert got["lineage"] == want["lineage"]  # the redone iteration replaced its lines, no duplicates
    assert got["rollouts"] == want["rollouts"]


KILL_AFTER_PREPASS = """
import os, signal, sys
import coevolve.loop as loop
def dying(run):
    print("killed after the pre-pass", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # the held-out evaluation after mode synthetic's pass never ends
loop.evaluate_before_training = dying
loop.run(None, sys.argv[2:], sys.argv[1], say=lambda text: None)
"""


def test_sigkill_after_the_synthetic_pre_pass_then_resume_admits_nothing_twice(tmp_path, ls_policy_dir, tasks_file):
    options = settings(ls_policy_dir, tasks_file, "synthetic", "run.max_steps=1")
    reference = tmp_path / "reference"
    run(None, options, str(reference), say=lambda text: None)

    killed = tmp_path / "killed"
    died = subprocess.run([sys.executable, "-c", KILL_AFTER_PREPASS, str(killed), *options], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert died.returncode == -9 and "killed after the pre-pass" in died.stdout, died.stderr[-2000:]
    with TaskPool(killed / "pool.sqlite") as pool:
        admitted = len(pool.tasks_at(0, source="synthetic"))
    assert admitted > 0
    resumed = subprocess.run([sys.executable, "-m", "coevolve.cli", "train", "--output-dir", str(killed),
                              "--resume"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    got, want = run_record(killed), run_record(reference)
    assert got["versions"] == want["versions"] and len(got["versions"][0]) == len(want["versions"][0])
    assert got["lineage"] == want["lineage"] and got["metrics"] == want["metrics"]


class DeadEndpoint:
    """A chat backend whose every request failed after its retries (what `OpenAIBackend` returns then)."""

    def chat(self, conversations, tools, sampling):
        from coevolve.policy.backends import Generation

        return [Generation("", error="gave up after 4 attempts: APIConnectionError") for _ in conversations]


def test_rollouts_failing_outside_the_agent_stop_the_run_with_the_cause_and_are_counted(tmp_path, ls_policy_dir,
                                                                                        tasks_file):
    """A dead endpoint would otherwise train on zeros for the whole run: after `rollout.max_consecutive_failures`
    failed rollouts in a row the run stops naming the cause, and what failed is in the run's logs."""
    from coevolve.rollout import FailureStreak, RolloutFailures

    out = tmp_path / "dead"
    with pytest.raises(RolloutFailures, match=r"8 rollouts in a row failed outside the agent, the last with backend: "
                                            r"gave up after 4 attempts: APIConnectionError"):
        run(None, settings(ls_policy_dir, tasks_file, "static", "rollout.max_consecutive_failures=8",
                           "loop.eval_limit=1"), str(out), backend=DeadEndpoint(), say=lambda text: None)
    logged = read_jsonl(out / "rollouts.jsonl")
    assert len(logged) == 8 and all(r["failure"].startswith("backend: gave up") and r["score"] == 0 for r in logged)

    streak = FailureStreak(limit=3)  # a success in between starts the count again
    ok, failed = (type("T", (), {"failure": value}) for value in (None, "environment: worker crashed"))
    streak.observe([failed, failed, ok, failed, failed])
    with pytest.raises(RolloutFailures, match="3 rollouts in a row .* environment: worker crashed"):
        streak.observe([failed])


def test_the_console_shows_progress_and_the_loops_lines_not_the_libraries_chatter(tmp_path, ls_policy_dir,
                                                                                     tasks_file, capfd):
    import warnings

    out = tmp_path / "quiet"
    run(None, settings(ls_policy_dir, tasks_file, "static"), str(out))
    printed = capfd.readouterr()
    console = printed.out + printed.err
    assert "iteration 1:" in console and "held-out success before" in console and "GRPO steps" in console
    assert "{'loss'" not in console and "train_runtime" not in console and "missing keys" not in console
    # transformers' deprecation warning goes to run.log (the checkpoint's weights are no longer read back between
    # iterations, so its "missing keys" record of that load is gone too)
    assert "FutureWarning" in (out / "run.log").read_text() and "FutureWarning" not in console
    with warnings.catch_warnings(record=True) as caught:  # the hooks are put back after the run
        warnings.simplefilter("always")
        warnings.warn("after the run", UserWarning)
    assert caught and caught[0].message.args == ("after the run",)


def test_recurring_tasks_auto_theta_and_no_baseline_eval(tmp_path, ls_policy_dir):
    """loop.recur_fraction = 1: iteration 2's sample is made of tasks solved in iteration 1 (of 8, drawn 2 at a
    time, so chance alone would rarely give that); θ auto is recorded per n-gram size; eval_before_training off
    leaves iteration 0 without a held-out figure and the summary without a `before`."""
    tasks_file = write_tasks(ls_tasks(8), tmp_path / "tasks.jsonl")
    out = tmp_path / "recur"
    run(None, settings(ls_policy_dir, tasks_file, "static", "loop.recur_fraction=1.0", "signals.theta_percent=auto",
                       "signals.threshold=0.25", "loop.eval_before_training=false"), str(out), say=lambda text: None)
    metrics = read_jsonl(out / "metrics.jsonl")
    samples = {row["iteration"]: row["task_ids"] for row in read_jsonl(out / "samples.jsonl")}
    with TaskPool(out / "pool.sqlite") as pool:
        solved = {task_id for task_id in samples[1] if pool.history(task_id)[0] >= 0.25}  # 1 of K=4 at temperature 1
    assert solved, "the ls policy solved none of iteration 1's ls tasks"
    # 2 slots: both go to solved tasks when there are two, else the one solved task recurs beside a drawn one
    assert set(samples[2]) <= solved if len(solved) >= 2 else solved <= set(samples[2])
    assert metrics[0]["heldout_success"] is None and metrics[-1]["heldout_success"] is not None
    assert json.loads((out / "summary.json").read_text())["heldout_before"] is None
    unigrams = metrics[1]["patterns"]["1"]
    assert unigrams["theta_percent"] == pytest.approx(100 * 3 / unigrams["total"])
    rows = [r for r in read_jsonl(out / "heldout.jsonl") if r["iteration"] == metrics[-1]["iteration"]]
    groups = {str(calls): [r["success"] for r in rows if r["truth_calls"] == calls] for calls in {r["truth_calls"] for r in rows}}
    assert metrics[-1]["heldout_by_calls"] == {calls: sum(found) / len(found) for calls, found in groups.items()}
    assert len(groups) == 2  # BFCL-lite's first 4 held-out tasks hold one- and two-call tasks
    # D_0 calls only `ls`: held-out tasks calling nothing else are `seen`, the others `unseen`
    parts = {"seen": [r["success"] for r in rows if set(r["truth_tools"]) <= {"ls"}],
             "unseen": [r["success"] for r in rows if not set(r["truth_tools"]) <= {"ls"}]}
    assert parts["unseen"] and metrics[-1]["heldout_by_tools"] == {
        part: sum(found) / len(found) for part, found in parts.items() if found}


def test_heldout_parts_by_hand():
    from coevolve.loop import IterationMetrics, heldout_text, success_by

    rows = [{"calls": "10", "success": True}, {"calls": "2", "success": False}, {"calls": "2", "success": True}]
    assert list(success_by(rows, lambda row: row["calls"]).items()) == [("2", 0.5), ("10", 1.0)]
    metrics = IterationMetrics(1, (1, 2), 0.5, 0.4375, {}, {}, {}, {}, {}, 0.0, heldout_by_calls={"1": 0.4375},
                               heldout_by_tools={"seen": 0.663, "unseen": 0.0})
    assert heldout_text(metrics) == "0.438 (seen tools 0.663, unseen tools 0.000)"  # one part by calls: not shown
    assert heldout_text(replace(metrics, heldout_success=None)) == "-"


def test_the_history_sampler_and_the_state_rare_steer_a_run_and_say_what_the_draw_held(tmp_path, ls_policy_dir):
    """loop.sampler: history with signals.unexplored_states: D_0's tasks all list the start, so every `@folder`
    state is missing and raises rare events whose explorations admit tasks acting in a folder; metrics.jsonl's
    `draw` counts each sample by standing and the rollouts the tasks admitted after the last iteration got, and
    those counts agree with samples.jsonl, rollouts.jsonl and the pool."""
    tasks_file = write_tasks(ls_tasks(8), tmp_path / "tasks.jsonl")
    out = tmp_path / "steered"
    run(None, settings(ls_policy_dir, tasks_file, "coevolve", "run.max_steps=3", "loop.sampler=history",
                       "signals.unexplored_states=true", "loop.eval_before_training=false", "loop.eval_every=0"),
        str(out), say=lambda text: None)
    metrics = read_jsonl(out / "metrics.jsonl")[1:]
    samples = {row["iteration"]: row["task_ids"] for row in read_jsonl(out / "samples.jsonl")}
    rollouts = read_jsonl(out / "rollouts.jsonl")
    assert [m["iteration"] for m in metrics] == [1, 2, 3]
    first = metrics[0]["draw"]
    assert first["tasks"] == 2 and first["never_tried"] == 2 and first["admitted_last_pool"] == 0
    for m in metrics:
        draw = m["draw"]
        assert draw["tasks"] == len(samples[m["iteration"]]) == 2
        assert sum(draw[kind] for kind in ("never_tried", "learnable", "mastered", "failing")) == draw["tasks"]
    lineage = read_jsonl(out / "synthesis.jsonl")
    steered = [row for row in lineage if str(row.get("context_id") or "").startswith("rare-state-")]
    assert steered, "no exploration was sent to a missing state"
    with TaskPool(out / "pool.sqlite") as pool:
        admitted = pool.admissions(2, source="synthetic")
        fresh = {task_id for task_id, first_at in admitted.items() if first_at == 2}
        in_folder = [t for t in pool.tasks_at(3, "synthetic") if (t.provenance.focus_tool or "").endswith("@folder")]
    assert in_folder and all(t.truth_tools[0] == "cd" for t in in_folder)  # they act in a folder they enter
    third = metrics[2]["draw"]
    own = [r for r in rollouts if r["iteration"] == 3 and not r.get("guided")]
    assert third["admitted_last_pool"] == len(fresh)
    assert third["admitted_last_rollouts"] == sum(1 for r in own if r["task_id"] in fresh)
    assert third["admitted_last"] == sum(1 for task_id in samples[3] if task_id in fresh)
    assert metrics[-1]["state_tasks"]["admitted"] >= len(in_folder) and metrics[-1]["state_tasks"]["steered"] > 0


def test_a_rollout_log_that_does_not_hold_steps_x_prompts_x_k_stops_the_redo_with_the_reason(tmp_path, ls_policy_dir,
                                                                                              tasks_file):
    """The phase boundary: an iteration's rollouts are steps x prompts_per_step x K. A redo of iteration 2 from its
    logs (its metrics line gone, as after a kill in its feedback) with one rollout row missing is refused."""
    from coevolve.train import TrainingError

    out = tmp_path / "short"
    options = settings(ls_policy_dir, tasks_file, "static")
    run(None, options, str(out), say=lambda text: None)
    metrics = (out / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text("\n".join(metrics[:-1]) + "\n")  # iteration 2 not committed
    rows = (out / "rollouts.jsonl").read_text().splitlines()
    dropped = next(i for i, line in enumerate(rows) if json.loads(line)["iteration"] == 2)
    (out / "rollouts.jsonl").write_text("\n".join(rows[:dropped] + rows[dropped + 1:]) + "\n")
    with pytest.raises(TrainingError, match=r"iteration 2: the logs hold 7 rollouts, not .* = 8"):
        run(None, [], str(out), resume=True, say=lambda text: None)


def tensorboard_scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar under `directory` as TensorBoard itself reads it (its EventAccumulator), tag -> [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars: dict[str, list[tuple[int, float]]] = {}
    for events in sorted(directory.rglob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            scalars.setdefault(tag, []).extend((event.step, event.value) for event in accumulator.Scalars(tag))
    return scalars


def test_coevolves_figures_reach_tensorboard_at_each_iterations_last_step_and_a_resume_adds_no_duplicate(
        tmp_path, ls_policy_dir, tasks_file):
    out = tmp_path / "run"
    options = settings(ls_policy_dir, tasks_file, "coevolve", "run.report_to=[tensorboard]")
    run(None, options, str(out), say=lambda text: None)
    scalars = tensorboard_scalars(out / "tensorboard")
    metrics = read_jsonl(out / "metrics.jsonl")
    assert scalars["coevolve/signals/boundary"] == [(m["steps"][1] if m["steps"] else 0,
                                                      float(m["signals"]["boundary"])) for m in metrics]
    assert [value for _, value in scalars["coevolve/pool/synthetic"]] == [m["pool"]["synthetic"] for m in metrics]
    assert [value for _, value in scalars["coevolve/heldout_success"]] == pytest.approx(
        [m["heldout_success"] for m in metrics])
    assert "coevolve/synthesis/accepted" in scalars and "coevolve/seconds/train" in scalars
    assert any(tag.startswith("train/") for tag in scalars)  # TRL's own step metrics beside them
    run(None, [*options, "run.max_steps=3"], str(out), resume=True, say=lambda text: None)
    resumed = tensorboard_scalars(out / "tensorboard")
    for tag in ("coevolve/signals/boundary", "coevolve/pool/total", "coevolve/feedback_share"):
        steps = [step for step, _ in resumed[tag]]
        assert steps == sorted(set(steps)) == [0, 1, 2, 3], tag  # the same curve, continued, no point twice


def test_an_iteration_redone_after_a_kill_mid_write_is_not_sent_to_the_trackers_twice(tmp_path, ls_policy_dir,
                                                                                        tasks_file):
    """run.async_save's kill case, made by hand: iteration 2 committed (its line, its figures sent) while its
    checkpoint was still being written. The resume drops the line and redoes the iteration, with the same values;
    its figures are on the curves once."""
    from coevolve.train.checkpoints import WRITING
    from coevolve.train.trackers import SENT_FILE

    out = tmp_path / "run"
    run(None, settings(ls_policy_dir, tasks_file, "static", "run.report_to=[tensorboard]"), str(out),
        say=lambda text: None)
    assert json.loads((out / SENT_FILE).read_text()) == {"iteration": 2}
    before = read_jsonl(out / "metrics.jsonl")
    last = max((out / "checkpoints").glob("checkpoint-*"), key=lambda folder: int(folder.name.split("-")[1]))
    (last / WRITING).write_text("in flight when the run was killed\n")
    run(None, [], str(out), resume=True, say=lambda text: None)
    after = read_jsonl(out / "metrics.jsonl")
    assert [m["iteration"] for m in after] == [0, 1, 2]  # iteration 2 was dropped and done again
    assert after[2]["train_success"] == before[2]["train_success"]
    scalars = tensorboard_scalars(out / "tensorboard")
    for tag in ("coevolve/pool/total", "coevolve/train_success", "coevolve/seconds/train"):
        steps = [step for step, _ in scalars[tag]]
        assert steps == sorted(set(steps)), tag  # without the sent record, iteration 2's step came twice


def test_iteration_figures_flatten_a_metrics_line_by_hand():
    from coevolve.train.trackers import iteration_figures

    record = {"iteration": 2, "steps": [3, 4], "train_success": 0.25, "heldout_success": None,
              "signals": {"boundary": 3, "rare": 0}, "synthesis": {"rejected_by_reason": {"redundant": 2},
                                                                    "contexts_by_signal": {"boundary": 1}},
              "heldout_by_calls": {"2-call": 0.5}, "guided": 1, "draw": {"never tried": 4, "ok": True},
              "feedback_share": float("nan"), "patterns": {"1": {"theta_percent": 5.0, "rare_names": ["ls"]}}}
    assert iteration_figures(record) == {
        "coevolve/train_success": 0.25, "coevolve/signals/boundary": 3.0, "coevolve/signals/rare": 0.0,
        "coevolve/synthesis/rejected_by_reason/redundant": 2.0, "coevolve/synthesis/contexts_by_signal/boundary": 1.0,
        "coevolve/heldout_by_calls/2-call": 0.5, "coevolve/guided": 1.0, "coevolve/draw/never_tried": 4.0,
        "coevolve/draw/ok": 1.0, "coevolve/patterns/1/theta_percent": 5.0}


TRACKIO_RUN = """
import json, sys
sys.path.insert(0, {tests!r})
from coevolve.loop import run
run(None, json.loads(sys.argv[1]), sys.argv[2], say=lambda text: None)
"""
TRACKIO_READ = """
import json, sys
from trackio.sqlite_storage import SQLiteStorage
runs = [(project, name) for project in SQLiteStorage.get_projects() for name in SQLiteStorage.get_runs(project)]
assert len(runs) == 1, runs  # one CoEvolve run is one trackio run, every iteration's train() call in it
print(json.dumps(SQLiteStorage.get_logs(*runs[0]), default=str))
"""


def test_coevolves_figures_reach_trackio_offline(tmp_path, ls_policy_dir, tasks_file):
    """trackio with no account and no network: its local store holds the figures at the iterations' steps."""
    environment = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "HF_HUB_OFFLINE": "1",
                   "TRACKIO_SHOW_UI": "0"}
    options = settings(ls_policy_dir, tasks_file, "static", "run.report_to=[trackio]")
    script = TRACKIO_RUN.format(tests=str(REPO / "tests"))
    done = subprocess.run([sys.executable, "-c", script, json.dumps(options), str(tmp_path / "run")], cwd=REPO,
                          env=environment, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    read = subprocess.run([sys.executable, "-c", TRACKIO_READ], env=environment, capture_output=True, text=True,
                          timeout=120)
    assert read.returncode == 0, read.stderr[-2000:]
    logs = json.loads(read.stdout)
    ours = [row for row in logs if "coevolve/pool/seed" in row]
    assert [row["train/global_step"] for row in ours] == [0, 1, 2]
    assert any("train/loss" in row or "train/reward" in row for row in logs)  # TRL's own metrics, in the same run
    assert all(row["coevolve/pool/seed"] == 4 for row in ours)


def test_a_weight_with_nothing_to_weigh_is_said_once_on_the_console_and_in_run_log(tmp_path, ls_policy_dir,
                                                                                  tasks_file):
    said: list[str] = []
    out = tmp_path / "run"
    run(None, settings(ls_policy_dir, tasks_file, "static", "loop.signal_weights={unexplored: 10}"), str(out),
        say=said.append)
    notes = [line for line in said if "loop.signal_weights.unexplored = 10" in line]
    assert len(notes) == 1 and "weighed nothing in iteration 1's draw" in notes[0]  # two iterations, said once
    assert (out / "run.log").read_text().count("loop.signal_weights.unexplored = 10") == 1


def test_idle_weights_by_hand():
    from coevolve.pool import BatchMix, idle_weights

    rows = [("a", "seed", None, None, None), ("b", "synthetic", "a", "boundary", None),
            ("c", "synthetic", "a", "rare", "cat")]
    weighed = BatchMix(signal_weights={"boundary": 2.0, "forgetting": 3.0, "rare": 1.0, "unexplored": 5.0})
    assert idle_weights(rows, weighed) == ["forgetting"]  # rare's weight is 1: nothing to say; c is unexplored
    assert idle_weights(rows[:1], weighed) == ["boundary", "forgetting", "unexplored"]


def test_guidance_that_guided_groups_is_not_said_to_have_changed_nothing(tmp_path, ls_policy_dir, tasks_file):
    """The run's end notes a guidance that guided no group; here it guided some (metrics.jsonl): no such note."""
    said: list[str] = []
    out = tmp_path / "run"
    run(None, settings(ls_policy_dir, tasks_file, "static", "grpo.guidance=solution"), str(out), say=said.append)
    guided = sum(row.get("guided", 0) for row in read_jsonl(out / "metrics.jsonl"))
    notes = [line for line in said if line.startswith("note: grpo.guidance")]
    assert guided > 0 and not notes
