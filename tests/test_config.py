"""Run configs: the shipped files load, overrides apply, mistakes fail with the key named, the resolved file
round-trips."""

from __future__ import annotations

from pathlib import Path

import pytest

from coevolve.config import Config, ConfigError, load_config, write_config

CONFIGS = sorted((Path(__file__).resolve().parent.parent / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_configs_load(path):
    config = load_config(path)
    assert config.run.mode in ("static", "coevolve") and config.rollout.group_size >= 2
    assert config.run.max_steps % config.loop.steps_per_iteration == 0 or config.run.mode == "static"


def test_overrides_apply_with_types(tmp_path):
    lite = next(p for p in CONFIGS if p.name == "lite-static.yaml")
    config = load_config(lite, ["grpo.learning_rate=1e-5", "rollout.group_size=6", "lora.enabled=true",
                                      "run.report_to=[tensorboard]", "env.limit=null", "grpo.prompts_per_step=3"])
    assert config.grpo.learning_rate == 1e-5 and isinstance(config.grpo.learning_rate, float)
    assert config.rollout.group_size == 6 and config.lora.enabled and config.run.report_to == ("tensorboard",)
    write_config(config, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == config


@pytest.mark.parametrize("override, key", [
    ("grpo.learnig_rate=1e-5", "learnig_rate"),          # a typo is not silently a default
    ("rollout.group_size=four", "rollout.group_size"),
    ("rollout.group_size=1", "rollout.group_size"),        # GRPO needs K >= 2
    ("grpo.loss_normalisation=mean", "grpo.loss_normalisation"),
    ("run.mode=magic", "run.mode"),
    ("model.demo_choice=best", "model.demo_choice"),
    ("grpo.micro_batch_size=3", "grpo.micro_batch_size"),  # must divide prompts_per_step x group_size
    ("trainer.steps=3", "trainer"),
    ("learning_rate=3", "section.key=value"),
    ("env.options=[1, 2]", "env.options"),                # a mapping field takes a mapping
    ("env.split.x=1", "env.split"),                      # only a mapping field takes a third level
])
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, [override])


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="top level"):
        load_config(tmp_path / "list.yaml")
    (tmp_path / "bad.yaml").write_text("run: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "bad.yaml")


def test_defaults_are_a_valid_config():
    assert load_config(None) == Config()


def test_env_options_reach_the_env(tmp_path):
    """`env.options` (a mapping: one more override level) and the split go to envs that take them; AppWorld's
    config is checked when the env is built, before anything runs."""
    from coevolve.envs.appworld import AppWorldEnv
    from coevolve.loop import build_env

    config = load_config(CONFIGS[0].parent / "appworld-qwen3-4b.yaml",
                         [f"env.options.root={tmp_path}", "env.options.step_timeout_s=7", "env.split=dev"])
    assert config.env.options["root"] == str(tmp_path) and config.env.options["max_workers"] == 64
    write_config(config, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == config
    env = build_env(config)
    assert isinstance(env, AppWorldEnv) and env.config.split == "dev" and env.config.step_timeout_s == 7
    assert env.config.data_root() == tmp_path.resolve()
    with pytest.raises(ConfigError, match="step_timeout"):
        build_env(load_config(None, ["env.name=appworld", "env.options.step_timeout_s=0"]))


BOMB = """env:
  options:
    a: &a [x, x, x, x, x, x, x, x, x]
    b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
    c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
    d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
    e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
    f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
    g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
    h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
"""


@pytest.mark.parametrize("text, said", [
    (BOMB, "expands to more than 100000 values"),
    ("env:\n  options:\n    deep: " + "[" * 200 + "]" * 200 + "\n", "nested deeper than 64 levels"),
    ("run: 3\n", "config section 'run' must be a mapping"),
    ("run:\n  - a\n  - b\n", "config section 'run' must be a mapping"),
    ("run: [unclosed\n", "is not valid YAML"),
])
def test_a_config_that_cannot_be_one_is_refused_in_one_line_at_once(tmp_path, text, said):
    import time

    path = tmp_path / "config.yaml"
    path.write_text(text)
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=said) as refused:
        load_config(path)
    assert time.perf_counter() - started < 5 and "\n" not in str(refused.value)


def test_non_utf8_and_huge_configs_and_bombs_in_overrides_are_refused(tmp_path):
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("run:\n  output_dir: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(latin)
    huge = tmp_path / "huge.yaml"
    huge.write_text("# " + "x" * (2 << 20) + "\n")
    with pytest.raises(ConfigError, match="larger than"):
        load_config(huge)
    with pytest.raises(ConfigError, match="nested deeper"):
        load_config(None, ["env.options=" + "[" * 100 + "]" * 100])
    anchors = "{a: &a [1, 2], b: [*a, *a]}"  # a few aliases are fine
    assert load_config(None, [f"env.options={anchors}"]).env.options["b"] == [[1, 2], [1, 2]]


def test_yaml_nested_past_the_parser_is_one_line(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text("run:\n  x: " + "[" * 10_000 + "]" * 10_000 + "\n")
    with pytest.raises(ConfigError, match="nested deeper than 64 levels"):
        load_config(path)


def test_every_steering_switch_defaults_to_the_papers_value_and_paper_overrides_undo_the_shipped_ones():
    """coevolve.config.STEERING is the one list of switches the shipped coevolve configs set away from the paper:
    each section's default is the paper's value, and `paper_overrides` brings a steered config back to it."""
    from coevolve.config import STEERING, paper_overrides, shipped_overrides, steering_of

    defaults = Config()
    for key, value in steering_of(defaults).items():
        assert value == STEERING[key][0] != STEERING[key][1], key
    steered = shipped_overrides()
    assert load_config(None, steered) != defaults
    assert steering_of(load_config(None, steered)) == {key: shipped for key, (_, shipped) in STEERING.items()}
    assert load_config(None, [*steered, *paper_overrides()]) == defaults


SHIPPED_COEVOLVE = [p for p in CONFIGS if not p.name.startswith("lite-") and load_config(p).run.mode == "coevolve"]


@pytest.mark.parametrize("path", SHIPPED_COEVOLVE, ids=[p.name for p in SHIPPED_COEVOLVE])
def test_the_shipped_coevolve_configs_turn_on_what_the_replication_supports(path):
    """The quickstart and the GPU coevolve configs set every STEERING switch to its shipped value; guidance only
    where each micro-batch holds whole groups (on several processes a split group is refused: run_setup). The
    replication's settings (lite-*.yaml) stay the paper's: bench/replicate.py's arms set the switches."""
    from coevolve.config import STEERING, steering_of

    config = load_config(path)
    whole_groups = (config.grpo.micro_batch_size or config.rollout.group_size) % config.rollout.group_size == 0
    for key, value in steering_of(config).items():
        paper, shipped = STEERING[key]
        assert value == (shipped if key != "grpo.guidance" or whole_groups else paper), key
    assert any(p.name == "quickstart.yaml" for p in SHIPPED_COEVOLVE)


def test_train_paper_sets_every_switch_back_and_a_later_override_still_wins(tmp_path, capsys):
    import yaml

    from coevolve.cli import main
    from coevolve.config import STEERING, from_dict, steering_of

    quickstart = str(CONFIGS[0].parent / "quickstart.yaml")
    resolved = {}
    for name, extra in (("shipped", []), ("paper", ["--paper"]), ("paper+", ["--paper", "signals.unexplored=true"])):
        assert main(["train", "--config", quickstart, "--dry-run", "--output-dir", str(tmp_path / name), *extra]) == 0
        resolved[name] = from_dict(yaml.safe_load(capsys.readouterr().out))
    assert steering_of(resolved["shipped"]) == {key: shipped for key, (_, shipped) in STEERING.items()}
    assert steering_of(resolved["paper"]) == {key: paper for key, (paper, _) in STEERING.items()}
    assert resolved["paper+"].signals.unexplored and not resolved["paper+"].signals.unexplored_states
    assert not (tmp_path / "paper").exists()
