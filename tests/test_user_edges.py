"""The edges a new user hits first, as a user would hit them: a config mistake is one line naming the key and the
fix, exit 2, before anything slow starts and before anything is written; a resumed run keeps what gives its steps
their meaning."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coevolve.cli import main
from coevolve.config import RANGES, Config, load_config, write_config

REPO = Path(__file__).resolve().parent.parent
QUICKSTART = str(REPO / "configs" / "quickstart.yaml")


def dry_run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["train", "--dry-run", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip()


@pytest.mark.parametrize("override, key", [
    ("grpo.learning_rate=-1", "grpo.learning_rate"), ("rollout.temperature=-1", "rollout.temperature"),
    ("rollout.max_new_tokens=0", "rollout.max_new_tokens"), ("grpo.passes_per_batch=0", "grpo.passes_per_batch"),
    ("grpo.learning_rate=inf", "grpo.learning_rate"), ("grpo.learning_rate=.nan", "grpo.learning_rate"),
    ("loop.eval_limit=-2", "loop.eval_limit"), ("model.demos=-1", "model.demos"),
    ("loop.synthetic_fraction=2", "loop.synthetic_fraction"), ("synthesis.dedup_threshold=5", "synthesis.dedup_threshold"),
    ("synthesis.time_budget_seconds=-1", "synthesis.time_budget_seconds"), ("lora.r=0", "lora.r"),
    ("run.save_total_limit=-1", "run.save_total_limit"), ("rollout.max_replies_per_turn=0", "rollout.max_replies_per_turn"),
    ("rollout.max_episode_tokens=0", "rollout.max_episode_tokens"), ("run.output_dir=", "run.output_dir"),
    ("loop.signal_weights={rare: -1}", "loop: signal_weights['rare']"),
    ("loop.signal_weights={novelty: 2}", "loop: unknown signal 'novelty'"),
])
def test_a_value_out_of_range_is_one_line_naming_the_key_before_anything_is_written(override, key, capsys, tmp_path):
    code, out, err = dry_run(capsys, "--config", QUICKSTART, "--output-dir", str(tmp_path / "run"), override)
    assert code == 2 and key in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_every_numeric_key_has_a_range():
    numeric = set()
    for section in dataclasses.fields(Config):
        hints = typing.get_type_hints(section.default_factory)
        for name, hint in hints.items():
            kinds = set(typing.get_args(hint)) or {hint}
            if typing.get_origin(hint) in (tuple, dict):  # lists and mappings of numbers check their items
                continue                                  # (signals.ngram_sizes; loop.signal_weights in its section)
            if kinds & {int, float} and not name.startswith("_"):
                numeric.add(f"{section.name}.{name}")
    assert numeric - set(RANGES) == set(), "numeric keys without a range"
    assert set(RANGES) <= numeric


VALUES = st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                   st.none(), st.text(max_size=12), st.lists(st.integers(-3, 3), max_size=3),
                   st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))
KEYS = st.one_of(st.sampled_from(sorted(RANGES) + ["model.reply_format", "run.mode", "signals.enabled",
                                                   "env.options", "synthesis.explorer", "feedback.max_contexts",
                                                   "grpo.num_iterations"]),
                 st.from_regex(r"[a-z]{1,6}(\.[a-z_]{1,8}){0,3}", fullmatch=True))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=st.lists(KEYS, min_size=1, max_size=3), values=st.lists(VALUES, min_size=3, max_size=3))
def test_any_override_is_exit_0_or_one_line_and_exit_2_never_a_traceback(keys, values, capsys, tmp_path):
    import yaml

    overrides = [f"{key}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"
                 for key, value in zip(keys, values)]
    code, out, err = dry_run(capsys, "--config", QUICKSTART, "--output-dir", str(tmp_path / "fuzz"), *overrides)
    assert code in (0, 2)
    if code == 2:
        assert len(err.splitlines()) == 1 and err.startswith("coevolve train: error: "), err
    else:
        assert "run:" in out and "synthesis:" in out


@pytest.fixture()
def trained_dir(tmp_path) -> Path:
    """A run directory as a run leaves it: config.yaml, and a checkpoint with the config it was trained with."""
    directory = tmp_path / "run"
    config = load_config(QUICKSTART)
    write_config(config, directory / "config.yaml")
    write_config(config, directory / "checkpoints" / "checkpoint-4" / "coevolve-config.yaml")
    return directory


def test_resume_refuses_a_change_to_what_the_steps_meant_naming_both_values(trained_dir, capsys):
    code, _, err = dry_run(capsys, "--output-dir", str(trained_dir), "--resume", "rollout.group_size=2")
    assert code == 2 and "rollout.group_size is 2 here but" in err and "trained with 4" in err, err
    code, _, err = dry_run(capsys, "--output-dir", str(trained_dir), "--resume", "model.name=/elsewhere/model")
    assert code == 2 and "model.name is '/elsewhere/model' here" in err and "'smollm2'" in err
    # An edited config.yaml does not change what the checkpoint was trained with.
    text = (trained_dir / "config.yaml").read_text().replace("group_size: 4", "group_size: 2")
    (trained_dir / "config.yaml").write_text(text)
    code, _, err = dry_run(capsys, "--output-dir", str(trained_dir), "--resume")
    assert code == 2 and "rollout.group_size is 2 here but" in err


def test_resume_may_change_the_length_and_the_bookkeeping_and_records_the_real_directory(trained_dir, capsys):
    code, out, err = dry_run(capsys, "--output-dir", str(trained_dir), "--resume", "run.max_steps=32",
                             "loop.eval_every=2", "run.save_steps=8")
    assert code == 0, err
    assert "max_steps: 32" in out and f"output_dir: {trained_dir}" in out


@pytest.mark.parametrize("make", ["file", "under a file"])
def test_an_output_dir_that_cannot_be_a_folder_is_one_line(make, tmp_path, capsys):
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    target = blocker if make == "file" else blocker / "run"
    code, _, err = dry_run(capsys, "--config", QUICKSTART, "--output-dir", str(target))
    assert code == 2 and "name a folder" in err and len(err.splitlines()) == 1, err


def cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip()


def test_a_dead_endpoint_is_no_result_not_a_score_of_zero(capsys):
    code, out, err = cli(capsys, "eval", "--env", "bfcl-lite", "--split", "test", "--policy", "model:smollm2",
                         "--backend", "openai", "--base-url", "http://127.0.0.1:9/v1", "--limit", "2", "--json")
    assert code == 1 and out == "" and len(err.splitlines()) == 1, err
    assert "every episode (2) failed outside the model" in err and "APIConnectionError" in err and "no result" in err


@pytest.mark.parametrize("args, message", [
    (["--policy", "oracle", "--samples", "3"], "--samples is for model policies"),
    (["--policy", "model:smollm2", "--device", "nosuch"], "--device: device 'nosuch' is not one of"),
    (["--policy", "model:smollm2", "--max-replies-per-turn", "0"], "--max-replies-per-turn must be >= 1"),
    (["--policy", "model:/nonexistent/model"], "model '/nonexistent/model': no such folder"),
    (["--policy", "replay:"], "replay: needs a file"),
    (["--policy", f"replay:{REPO}"], "is a folder; name the JSON-lines file"),
])
def test_plain_mistakes_in_eval_are_one_line_and_exit_2(args, message, capsys):
    code, _, err = cli(capsys, "eval", "--env", "bfcl-lite", "--split", "test", "--limit", "1", *args)
    assert code == 2 and message in err and len(err.splitlines()) == 1, err


def test_an_empty_model_folder_says_it_holds_no_model(tmp_path, capsys):
    code, _, err = cli(capsys, "eval", "--env", "bfcl-lite", "--limit", "1", "--policy", f"model:{tmp_path}")
    assert code == 2 and "has no config.json, so it holds no saved model" in err and len(err.splitlines()) == 1


def test_serve_refuses_a_bad_port_or_one_in_use_before_loading_the_model(capsys):
    import socket

    code, _, err = cli(capsys, "serve", "--port", "99999")
    assert code == 2 and "--port 99999 is not a port" in err
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = str(taken.getsockname()[1])
        code, _, err = cli(capsys, "serve", "--port", port)
    assert code == 2 and f"cannot listen on 127.0.0.1:{port}" in err and len(err.splitlines()) == 1
    code, _, err = cli(capsys, "serve", "--device", "nosuch", "--port", "8123")
    assert code == 2 and "--device" in err


BAD_METRICS = [
    '{"iteration": "one", "train_success": 0.5}',                    # no integer iteration: the line goes
    '{"iteration": 1, "train_success": "high"}',                     # a wrong-typed field: the field goes
    '{"iteration": 2, "signals": [1, 2]}',
    '{"iteration": 3, "pool": {"seed": "ten"}}',
    '{"iteration": 4, "seconds": null, "feedback_share": "x"}',
    '{"iteration": 5, "failures": 7}',
    '{"iteration": 6, "heldout_success": true}',
    '{"iteration": 7, "train_sucThis line was torn in the middle',  # a torn line in the middle
    '[1, 2, 3]',
    '{"iteration": 8, "train_success": 0.25, "heldout_success": 0.5, "signals": {"boundary": 2}}',
]


def test_the_report_reads_bad_lines_defensively_and_names_them(tmp_path, capsys):
    from coevolve.report import write_report

    (tmp_path / "metrics.jsonl").write_text("\n".join(BAD_METRICS) + "\n")
    (tmp_path / "synthesis.jsonl").write_text('{"iteration": 1, "solution": "ls()", "reasons": 5}\nnot json\n')
    page = write_report(tmp_path).read_text()
    err = capsys.readouterr().err
    for line in (1, 2, 3, 4, 5, 6, 7, 8, 9):
        assert f"metrics.jsonl:{line}:" in err, line
    assert "synthesis.jsonl:2: not a JSON object" in err and "synthesis.jsonl:1: solution is str" in err
    assert page.count("class=warning") >= 10 and "metrics.jsonl:8: not a JSON object" in page
    assert "ls()" in page  # the rest renders: the lineage row, and iteration 8's values in the plots


def test_why_a_hostile_call_was_refused_reaches_evals_output(tmp_path, capsys):
    import json

    from coevolve.envs import make_env

    task = make_env("bfcl-lite", split="test").tasks()[0]
    replay = tmp_path / "replay.jsonl"
    replay.write_text(json.dumps({"id": task.name, "turns": [["__import__('os').system('id')"]]}) + "\n")
    code, out, _ = cli(capsys, "eval", "--env", "bfcl-lite", "--split", "test", "--limit", "1",
                       "--policy", f"replay:{replay}", "--json")
    failures = json.loads(out)["failures"][task.name]
    assert code == 0 and "refused" in failures[0] and "__import__" in failures[0], failures
