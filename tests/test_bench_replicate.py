"""The replication driver (bench/replicate.py): its statistics against hand-computed intervals, its run order,
its configs, and how it reads finished runs back without training."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location(
    "replicate", Path(__file__).resolve().parent.parent / "bench" / "replicate.py")
replicate = importlib.util.module_from_spec(SPEC)
sys.modules["replicate"] = replicate  # dataclasses look their module up there
SPEC.loader.exec_module(replicate)


def test_t_interval_over_three_seeds():
    # mean 0.3, sample sd 0.05 -> half-width 4.303 x 0.05 / sqrt(3) = 0.12422
    mean, half = replicate.t_interval([0.25, 0.30, 0.35])
    assert mean == pytest.approx(0.3) and half == pytest.approx(0.124217, abs=1e-6)
    assert replicate.t_interval([0.4])[1] != replicate.t_interval([0.4])[1]  # one seed: no interval (NaN)


def test_wilson_interval_by_hand():
    # 11 of 40: p = 0.275, z = 1.96 -> [0.1611, 0.4284] (Wilson score interval)
    low, high = replicate.wilson(11, 40)
    assert low == pytest.approx(0.1611, abs=1e-4) and high == pytest.approx(0.4284, abs=1e-4)
    assert replicate.wilson(0, 0) == (0.0, 0.0)


def test_every_arm_of_every_setting_is_a_valid_config():
    from coevolve.config import load_config

    for setting in replicate.SETTINGS:
        for arm in replicate.ARMS:
            if not replicate.runs_in(arm, setting):
                continue
            run = replicate.Planned(setting, arm, 3)
            config = load_config(str(replicate.SETTINGS[setting].config), run.overrides())
            mode = next(o for o in replicate.ARMS[arm] if o.startswith("run.mode=")).split("=")[1]
            assert config.run.mode == mode and config.run.seed == 3, arm
            assert config.loop.eval_before_training == (arm == "zero-shot")  # zero-shot is the "before" figure
    shift = load_config(str(replicate.CONFIG), replicate.Planned("shift", "coevolve w/o forgetting", 0).overrides())
    iid = load_config(str(replicate.CONFIG), replicate.Planned("iid", "static", 0).overrides())
    assert shift.signals.enabled == ("boundary", "rare") and shift.env.options["train_max_calls"] == 1
    assert "train_max_calls" not in iid.env.options and iid.env.options["num_tasks"] == shift.env.options["num_tasks"]
    tools = load_config(str(replicate.TOOLS_CONFIG), replicate.Planned("tools", "coevolve", 0).overrides())
    assert tuple(tools.env.options["train_without_tools"]) == replicate.LEFT_OUT_TOOLS
    assert tools.grpo.guidance == "solution" and tools.signals.unexplored  # the full method
    assert (tools.rollout.group_size, tools.run.max_steps) == (8, 24)  # the paper's K, at least 24 steps
    for arm, guided, unexplored in (("coevolve w/o guidance", "off", True), ("coevolve w/o unexplored", "solution",
                                                                             False), ("static", "off", False)):
        config = load_config(str(replicate.TOOLS_CONFIG), replicate.Planned("tools", arm, 0).overrides())
        assert (config.grpo.guidance, config.signals.unexplored) == (guided, unexplored), arm
    weighted = load_config(str(replicate.TOOLS_CONFIG),
                           replicate.Planned("tools", "coevolve + unexplored weight", 0).overrides())
    assert weighted.loop.signal_weights == {"unexplored": 10} and tools.loop.signal_weights == {}
    assert (weighted.grpo.guidance, weighted.signals.unexplored) == ("solution", True)
    oracle = load_config(str(replicate.TOOLS_CONFIG), replicate.Planned("tools", "oracle data", 0).overrides())
    assert oracle.env.options["train_without_tools"] == [] and oracle.model.demo_without_tools == ("cat", "cd")
    assert oracle.run.mode == "static" and oracle.grpo.guidance == "off"
    shift_oracle = load_config(str(replicate.CONFIG), replicate.Planned("shift", "oracle data", 0).overrides())
    assert shift_oracle.env.options["train_max_calls"] == 2 and shift_oracle.model.demo_max_calls == 1
    assert not replicate.runs_in("oracle data", "iid")  # D_0 of the i.i.d. setting holds everything already


def test_the_oracle_arm_sees_the_shifted_tasks_and_the_same_prompt():
    """D_0 of `oracle data` holds the cat/cd tasks in their natural share; its worked examples are those of the
    arms whose D_0 lacks them (so the prompt is the same)."""
    from coevolve.config import load_config
    from coevolve.run_setup import build_env, build_renderer, load_tasks

    def prompt_and_tasks(arm):
        config = load_config(str(replicate.TOOLS_CONFIG), replicate.Planned("tools", arm, 0).overrides())
        env = build_env(config)
        _, renderer, tasks = build_renderer(config, env, load_tasks(config, env))
        return renderer.demonstrations, tasks

    static_demos, static_tasks = prompt_and_tasks("static")
    oracle_demos, oracle_tasks = prompt_and_tasks("oracle data")
    assert oracle_demos == static_demos
    shifted = [t for t in oracle_tasks if set(t.truth_tools) & set(replicate.LEFT_OUT_TOOLS)]
    assert not [t for t in static_tasks if set(t.truth_tools) & set(replicate.LEFT_OUT_TOOLS)]
    assert 0.2 < len(shifted) / len(oracle_tasks) < 0.5 and len(oracle_tasks) == len(static_tasks) + len(shifted)


def test_each_setting_names_its_shifted_part():
    shift, tools = replicate.SETTINGS["shift"], replicate.SETTINGS["tools"]
    assert shift.part_of(2, ["cd", "ls"]) == "2-call" and shift.part_of(1, ["cd"]) == "1-call"
    assert tools.part_of(1, ["cd"]) == tools.part_of(1, ["cat"]) == "cat or cd"
    assert tools.part_of(1, ["ls"]) == "seen tools" and tools.part_of(2, ["mkdir", "touch"]) == "seen tools"


def test_the_plan_puts_the_headline_comparison_first():
    runs = replicate.plan(["tools", "shift"], ["zero-shot", "static", "coevolve", "oracle data", "random",
                                               "coevolve w/o unexplored"], [0, 1], [0])
    names = [run.name for run in runs]
    assert names[:7] == ["tools/zero-shot-seed0", "tools/static-seed0", "tools/coevolve-seed0",
                         "tools/oracle-data-seed0", "tools/random-seed0", "tools/coevolve-wo-unexplored-seed0",
                         "tools/static-seed1"]  # whole seeds of every arm, the ablations on their seeds
    assert names[7:10] == ["tools/coevolve-seed1", "tools/oracle-data-seed1", "tools/random-seed1"]
    assert names[10] == "shift/zero-shot-seed0" and "shift/oracle-data-seed0" in names
    assert len(names) == len(set(names)) == 2 * 10
    wide = replicate.plan(["shift", "iid", "tools"], ["static", "coevolve wide"], [0], [0])
    assert [run.name for run in wide] == ["shift/static-seed0", "shift/coevolve-wide-seed0", "iid/static-seed0",
                                          "tools/static-seed0"]  # a diagnosis arm runs where it diagnoses


def test_the_goal_lines_by_hand():
    def result(arm, seed, shifted):
        return {"arm": arm, "seed": seed, "after": 0.5, "after_by_part": {"seen tools": 0.5, "cat or cd": shifted}}

    rows = {"static": [result("static", 0, 0.1), result("static", 1, 0.2)],
            "coevolve": [result("coevolve", 0, 0.2), result("coevolve", 1, 0.4)],
            "random": [result("random", 0, 0.2), result("random", 1, 0.2)],
            "oracle data": [result("oracle data", 0, 0.5), result("oracle data", 1, 0.6)],
            "coevolve + unexplored weight": [result("coevolve + unexplored weight", 1, 0.6)]}
    lines = replicate.goal_lines(rows, replicate.SETTINGS["tools"]).splitlines()
    # coevolve - static: (0.1, 0.2) -> +0.150, sd 0.0707, t(1) 12.706 -> +- 0.635; vs random: (0.0, 0.2) -> +0.100
    # +- 1.271; oracle gain over static 0.55 - 0.15 = 0.40, coevolve's 0.30 - 0.15 = 0.15: 38%
    assert lines == ["- coevolve - static on cat or cd: +0.150 +- 0.635 (2 seeds)",
                     "- coevolve - random on cat or cd: +0.100 +- 1.271 (2 seeds)",
                     # the weighted arm ran seed 1 only: +0.4 vs static, +0.4 vs random; its bound on seed 1: 0.4
                     "- coevolve + unexplored weight - static on cat or cd: +0.400 (one seed) (1 seeds)",
                     "- coevolve + unexplored weight - random on cat or cd: +0.400 (one seed) (1 seeds)",
                     "- oracle data - static on cat or cd: +0.400 (2 seeds), coevolve reaches 38% of it; "
                     "+0.400 (1 seeds), coevolve + unexplored weight reaches 100% of it"]
    # The bound with guidance (coevolve's own learner), where it shows no gain: one line, said once.
    rows["oracle data + guidance"] = [result("oracle data + guidance", seed, shifted)
                                      for seed, shifted in ((0, 0.1), (1, 0.2))]
    rows["coevolve + unexplored weight"].append(result("coevolve + unexplored weight", 0, 0.1))
    assert replicate.goal_lines(rows, replicate.SETTINGS["tools"]).splitlines()[-1] == (
        "- oracle data + guidance - static on cat or cd: +0.000 (2 seeds): the bound itself shows no gain")
    # Both arms now ran seeds 0 and 1: one gain, what each reaches (the weighted arm: (0.1, 0.6) -> 0.35 - 0.15).
    assert replicate.goal_lines(rows, replicate.SETTINGS["tools"]).splitlines()[-2] == (
        "- oracle data - static on cat or cd: +0.400 (2 seeds), coevolve reaches 38% of it, coevolve + unexplored "
        "weight reaches 50% of it")
    # An ablation, last: coevolve - the arm without the switch, paired, on the shifted part and on the rest.
    rows["coevolve w/o guidance"] = [result("coevolve w/o guidance", 0, 0.1), result("coevolve w/o guidance", 1, 0.1)]
    for row, rest in zip(rows["coevolve w/o guidance"], (0.3, 0.5)):
        row["after_by_part"]["seen tools"] = rest
    # shifted: (0.2 - 0.1, 0.4 - 0.1) = (0.1, 0.3) -> +0.200, sd 0.1414, t(1) 12.706 -> +- 1.271; the rest: coevolve
    # 0.5 both seeds, so (0.2, 0.0) -> +0.100 +- 1.271
    assert replicate.goal_lines(rows, replicate.SETTINGS["tools"]).splitlines()[-1] == (
        "- coevolve - coevolve w/o guidance on cat or cd: +0.200 +- 1.271 (2 seeds); on seen tools: +0.100 +- 1.271")


def _finished_run(folder: Path, after: float, heldout: list[tuple[int, bool]], added_by_calls: dict,
                  seconds: float = 10.0) -> None:
    """A run folder as `coevolve train` leaves it, minus the weights: metrics, summary, held-out rows (ground-truth
    calls, success), a pool."""
    from coevolve.pool import TaskPool
    from coevolve.records import Task

    folder.mkdir(parents=True)
    lines = [{"iteration": 0, "heldout_success": None, "signals": {"forgetting": 0, "boundary": 0, "rare": 0}},
             {"iteration": 1, "heldout_success": after, "signals": {"forgetting": 2, "boundary": 1, "rare": 3}}]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (folder / "summary.json").write_text(json.dumps({"tasks_added": sum(added_by_calls.values()),
                                                     "feedback_share": 0.05}))
    rows = [{"iteration": 0, "task_id": "h0", "truth_calls": 2, "truth_tools": ["cd", "ls"], "success": True}]
    rows += [{"iteration": 1, "task_id": f"h{i}", "truth_calls": calls, "truth_tools": ["cd", "ls"][2 - calls:],
              "success": success, "calls": []} for i, (calls, success) in enumerate(heldout)]
    (folder / "heldout.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (folder / "bench-seconds.txt").write_text(f"{seconds}\n")
    (folder / "checkpoints" / "checkpoint-6").mkdir(parents=True)
    tasks = [Task.create("bfcl-lite", f"s{calls}-{i}", [[{"role": "user", "content": f"q{calls}-{i}"}]], {},
                         [["ls()"] * int(calls)]) for calls, count in added_by_calls.items() for i in range(count)]
    with TaskPool(folder / "pool.sqlite") as pool:
        pool.add_tasks([Task.create("bfcl-lite", "seed", [[{"role": "user", "content": "q"}]], {}, [["ls()"]])], 0)
        pool.start_iteration(1)
        from dataclasses import replace

        from coevolve.records import Provenance

        pool.add_tasks([replace(t, provenance=Provenance(source="synthetic")) for t in tasks], 1)


def test_finished_runs_are_read_back_and_paired_against_static(tmp_path, monkeypatch, capsys):
    # Every run folder is finished, so no training starts (a subprocess would fail here). Held-out: four one-call
    # and four two-call tasks; the parts come from heldout.jsonl's last iteration (iteration 0's row is ignored).
    one_call = [(1, True), (1, True), (1, False), (1, False)]  # 0.5 in every run
    afters = {"static": [(0.300, one_call + [(2, False)] * 4), (0.250, one_call + [(2, False)] * 4)],
              "coevolve": [(0.350, one_call + [(2, True)] + [(2, False)] * 3),
                           (0.325, one_call + [(2, True)] + [(2, False)] * 3)]}
    for arm, values in afters.items():
        for seed, (after, heldout) in enumerate(values):
            _finished_run(tmp_path / "shift" / f"{replicate.slug(arm)}-seed{seed}", after, heldout,
                          {"1": 1, "2": 2} if arm == "coevolve" else {})
    records = tmp_path / "records"
    argv = ["replicate.py", "--settings", "shift", "--seeds", "0", "1", "--arms", "static", "coevolve", "--out",
            str(tmp_path), "--results", str(records), "--no-write"]
    monkeypatch.setattr("sys.argv", argv)
    replicate.main()
    out = capsys.readouterr().out
    assert sorted(path.name for path in (records / "shift").iterdir()) == [
        "coevolve-seed0.json", "coevolve-seed1.json", "static-seed0.json", "static-seed1.json"]
    table: dict[str, str] = {}
    for line in out.splitlines():  # the first table is the setting's; the multi-call table follows it
        if line.startswith(("| static", "| coevolve")):
            table.setdefault(line.split(" | ")[0].lstrip("| "), line)
    cells = table["coevolve"].split(" | ")
    # all: coevolve - static paired = (0.05, 0.075): mean +0.0625, sd 0.017678, t(1) 12.706 -> +- 0.159
    assert cells[3] == "+0.062 +- 0.159" or cells[3] == "+0.063 +- 0.159"
    assert cells[4] == "0.500 +- 0.000" and cells[5] == "+0.000 +- 0.000"  # 1-call: 2 of 4 in every run
    assert cells[6] == "0.250 +- 0.000" and cells[7] == "+0.250 +- 0.000"  # 2-call: 1 of 4 against 0 of 4
    assert cells[2] == "0.338 +- 0.159" and "| - |" in table["static"]  # no delta of static against itself
    assert cells[8] == "3.0 (2.0; 0.0)"  # tasks added (2-call; of those one call: none can be)
    assert cells[9] == "0 / 0" and cells[10] == "0.0 (0.0)"  # no rollout log here; no guided rollout
    assert cells[11].startswith("4 / 2 / 6")  # signals summed over the two runs
    assert "1-call: mean" in out and "2-call: delta vs static" in out
    assert not any(tmp_path.glob("*/*/checkpoints"))  # optimizer states go once a run is finished (disk space)

    # The folders go (a new machine): the records alone give the same tables, and nothing is trained again (a
    # training subprocess would fail here).
    for folder in (tmp_path / "shift").iterdir():
        shutil.rmtree(folder)
    replicate.main()
    assert capsys.readouterr().out.split("\n\n", 1)[1] == out.split("\n\n", 1)[1]
    # Written, a setting's block replaces that block only: another setting's figures stay as they are.
    from bench._report import write_section

    benchmarks = tmp_path / "BENCHMARKS.md"
    benchmarks.write_text("<!-- bench:replicate-teach-tools -->\ntools figures\n<!-- /bench:replicate-teach-tools -->\n")
    monkeypatch.setattr(replicate, "write_section", lambda name, text: write_section(name, text, benchmarks))
    monkeypatch.setattr("sys.argv", [arg for arg in argv if arg != "--no-write"])
    replicate.main()
    written = benchmarks.read_text()
    assert "tools figures" in written and "<!-- bench:replicate-teach -->" in written
    assert written.index("<!-- bench:replicate-teach-shift -->") < written.index("| coevolve | 2 |")
    monkeypatch.setattr("sys.argv", argv)
    # A record made with other settings is refused, not mixed in.
    record = json.loads((records / "shift" / "static-seed1.json").read_text())
    record["config"]["grpo"]["learning_rate"] = 1.0
    (records / "shift" / "static-seed1.json").write_text(json.dumps(record))
    with pytest.raises(SystemExit, match="grpo.learning_rate"):
        replicate.main()


def test_config_differences_ignore_switches_added_since_the_run():
    have = {"run": {"seed": 0, "output_dir": "a"}, "env": {"options": {"num_tasks": 560}}}
    want = {"run": {"seed": 1, "output_dir": "b"}, "env": {"options": {"num_tasks": 560}},
            "signals": {"unexplored_orders": False}}
    assert replicate.config_differences(have, want) == ["run.seed"]  # output_dir and the new switch aside
    want["env"]["options"] = {"num_tasks": 280}
    assert replicate.config_differences(have, want) == ["env.options", "run.seed"]  # options compare whole


def test_max_minutes_starts_no_new_run(tmp_path, monkeypatch, capsys):
    _finished_run(tmp_path / "shift" / "static-seed0", 0.300, [(1, True), (1, False)], {})
    monkeypatch.setattr("sys.argv", ["replicate.py", "--settings", "shift", "--seeds", "0", "--arms", "static",
                                     "coevolve", "--out", str(tmp_path), "--results", str(tmp_path / "records"),
                                     "--no-write", "--max-minutes", "1e-9"])
    replicate.main()  # the coevolve run would start a training subprocess; over budget, it is left for the next call
    out = capsys.readouterr().out
    assert "| static | 1 |" in out and "| coevolve" not in out
    assert not (tmp_path / "shift" / "coevolve-seed0").exists()


def test_a_record_counts_the_orders_the_policy_practised(tmp_path):
    """Own training rollouts on tasks of two or more calls, by tool sequence: three on `ls > ls` (one solved), a
    guided one left out (the solution shown, not the policy's attempt), a one-call task's rollout left out."""
    from coevolve.pool import TaskPool

    folder = tmp_path / "shift" / "coevolve-seed1"
    _finished_run(folder, 0.5, [(1, True), (2, True)], {"1": 1, "2": 1})
    with TaskPool(folder / "pool.sqlite") as pool:
        tasks = {len(task.truth_tools): task.id for task in pool.tasks_at(1) if task.provenance.source == "synthetic"}
    rows = [{"task_id": tasks[2], "score": score, "steps": []} for score in (1.0, 0.0, 0.5)]
    rows += [{"task_id": tasks[2], "score": 1.0, "guided": True, "steps": []},
             {"task_id": tasks[1], "score": 1.0, "steps": []}]
    (folder / "rollouts.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    setting = replicate.SETTINGS["shift"]
    record = replicate.record_of(folder, "shift", "coevolve", 1, setting.part_of, setting.parts[1], {}, [])
    assert record["trained_by_sequence"] == {"ls > ls": [3, 1]}
    assert record["trained_shifted"] == [1, 3] and record["guided_shifted"] == 1
    assert "- seed 1 (2-call: 1.000): `ls > ls` 1 / 3" in replicate.diagnosis([record])
