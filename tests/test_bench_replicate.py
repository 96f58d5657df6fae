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
    assert load_config(str(replicate.CONFIG), replicate.ARMS["coevolve w/o forgetting"]).loop.signals == (
        "boundary", "rare")
