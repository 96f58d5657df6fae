"""The step clock: a GRPO step's seconds split into rollout, loss, optimizer, logging, save and resume."""

from __future__ import annotations

from coevolve.train import calls as train_calls
from coevolve.train.calls import TRAIN_PARTS, StepClock


def test_parts_follow_the_trainer_events(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(train_calls.time, "perf_counter", lambda: now[0])
    clock = StepClock(lambda: 3.0)  # the step's rollout function ran 3 s
    events = clock.callback()
    clock.started()
    now[0] = 101.5  # 1.5 s of resume before the first step
    for step, saves in ((1, False), (2, True)):
        events.on_step_begin(None, None, None)
        now[0] += 5.0  # rollouts (3 s) + loss (2 s)
        events.on_pre_optimizer_step(None, None, None)
        now[0] += 0.25
        events.on_optimizer_step(None, None, None)
        now[0] += 0.05
        events.on_step_end(None, None, None)
        now[0] += 0.1
        events.on_log(None, None, None, logs={"loss": 0.0})
        if saves:
            now[0] += 2.0
            events.on_save(None, None, None)
    taken = clock.take()
    assert set(taken) == set(TRAIN_PARTS)
    assert taken == {"rollout": 6.0, "loss": 4.0, "optimizer": 0.5, "logging": 0.2, "save": 2.0, "resume": 1.5}
    assert clock.take() == dict.fromkeys(TRAIN_PARTS, 0.0)  # taken once


def test_a_save_without_a_log_line_counts_from_the_step_end(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(train_calls.time, "perf_counter", lambda: now[0])
    clock = StepClock(lambda: 0.0)
    events = clock.callback()
    events.on_step_begin(None, None, None)
    events.on_pre_optimizer_step(None, None, None)
    events.on_optimizer_step(None, None, None)
    events.on_step_end(None, None, None)
    now[0] = 4.0
    events.on_save(None, None, None)
    assert clock.take()["save"] == 4.0
