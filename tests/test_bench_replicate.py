"""The replication driver's statistics (bench/replicate.py), checked against hand-computed intervals."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location(
    "replicate", Path(__file__).resolve().parent.parent / "bench" / "replicate.py")
replicate = importlib.util.module_from_spec(SPEC)
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


def test_every_arm_is_a_valid_config():
    from coevolve.config import load_config

    for arm, overrides in replicate.ARMS.items():
        config = load_config(str(replicate.CONFIG), [*overrides, "run.max_steps=8"])
        assert config.run.mode == arm.split(" ")[0], arm
    assert load_config(str(replicate.CONFIG), replicate.ARMS["coevolve w/o forgetting"]).signals.enabled == (
        "boundary", "rare")


def _finished_run(folder: Path, before: float, after: float, added: int) -> None:
    import json

    folder.mkdir(parents=True)
    lines = [{"heldout_success": before, "signals": {"forgetting": 0, "boundary": 0, "rare": 0}},
             {"heldout_success": after, "signals": {"forgetting": 2, "boundary": 1, "rare": 0}}]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (folder / "summary.json").write_text(json.dumps({"tasks_added": added, "feedback_share": 0.05}))
    (folder / "bench-seconds.txt").write_text("10.0\n")
    (folder / "checkpoints" / "checkpoint-6").mkdir(parents=True)


def test_finished_runs_are_read_back_and_paired_against_static(tmp_path, monkeypatch, capsys):
    # Every run folder is finished, so no training starts (a subprocess would fail: no such config run here).
    afters = {"static": [0.300, 0.250], "coevolve": [0.350, 0.325]}
    for arm, values in afters.items():
        for seed, after in enumerate(values):
            _finished_run(tmp_path / f"{replicate.slug(arm)}-seed{seed}", 0.275, after, 3 if arm == "coevolve" else 0)
    monkeypatch.setattr("sys.argv", ["replicate.py", "--seeds", "0", "1", "--arms", "static", "coevolve",
                                     "--out", str(tmp_path), "--no-write"])
    replicate.main()
    table = {line.split(" | ")[0].lstrip("| "): line for line in capsys.readouterr().out.splitlines()
             if line.startswith("| static") or line.startswith("| coevolve")}
    # coevolve - static, paired by seed: (0.350 - 0.300 + 0.325 - 0.250) / 2 = +0.0625 -> "+0.062" or "+0.063"
    assert " | +0.06" in table["coevolve"] and "0.350, 0.325" in table["coevolve"]
    # two seeds: t(0.975, 1) = 12.706; sd of (0.300, 0.250) = 0.035355 -> half-width 12.706 x 0.035355 / sqrt 2
    assert "0.275 +- 0.318" in table["static"] and "| - |" in table["static"]  # no delta of static against itself
    assert "| 4 / 2 / 0 |" in table["coevolve"] and "| 3.0 |" in table["coevolve"] and "| 0.0 |" in table["static"]
    assert not any(tmp_path.glob("*/checkpoints"))  # optimizer states go once a run is finished (disk space)


def test_max_minutes_starts_no_new_run(tmp_path, monkeypatch, capsys):
    _finished_run(tmp_path / "static-seed0", 0.275, 0.300, 0)
    monkeypatch.setattr("sys.argv", ["replicate.py", "--seeds", "0", "--arms", "static", "coevolve", "--out",
                                     str(tmp_path), "--no-write", "--max-minutes", "1e-9"])
    replicate.main()  # the coevolve run would start a training subprocess; over budget, it is left for the next call
    out = capsys.readouterr().out
    assert "| static | 1 |" in out and "| coevolve" not in out
    assert not (tmp_path / "coevolve-seed0").exists()


def test_a_run_folder_from_other_settings_is_refused_not_read_back(tmp_path, monkeypatch):
    from coevolve.config import load_config, write_config

    folder = tmp_path / "static-seed0"
    _finished_run(folder, 0.275, 0.300, 0)
    same = ["run.seed=0", "run.max_steps=6", "loop.eval_limit=40", "loop.steps_per_iteration=3", "run.mode=static"]
    write_config(load_config(str(replicate.CONFIG), same), folder / "config.yaml")
    assert replicate.run_arm("static", 0, 6, 40, tmp_path, 3)["after"] == 0.300  # same settings: read back
    write_config(load_config(str(replicate.CONFIG), [*same, "grpo.reward=graded"]), folder / "config.yaml")
    with pytest.raises(SystemExit, match="grpo.reward"):
        replicate.run_arm("static", 0, 6, 40, tmp_path, 3)
    with pytest.raises(SystemExit, match="run.max_steps"):
        replicate.run_arm("static", 0, 8, 40, tmp_path, 3)


def test_the_section_names_the_runs_left_and_their_time(tmp_path, monkeypatch, capsys):
    written = {}
    _finished_run(tmp_path / "static-seed0", 0.275, 0.300, 0)
    monkeypatch.setattr(replicate, "write_section", lambda name, text: written.update({name: text}))
    monkeypatch.setattr("sys.argv", ["replicate.py", "--seeds", "0", "--arms", "static", "coevolve", "--out",
                                     str(tmp_path), "--max-minutes", "1e-9"])
    replicate.main()
    text = written["replicate"]
    assert "Runs not yet done: 1" in text and "10 s per\ntraining run" in text
    assert "| static | 1 | 0.300 (one seed: no interval) |" in text
