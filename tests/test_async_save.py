"""`run.async_save`: checkpoints written by a background thread from a copy in memory (coevolve.train.checkpoints).

What must hold: the files are those a synchronous save writes (same values), the copy is taken when the save is
asked for (a later in-place update cannot reach it), a failed write raises at the next wait with the step named and
leaves no checkpoint that resume would take, the next `train()` call resumes from the checkpoint in flight without
waiting and trains what it would have trained after a synchronous save, and a kill after an iteration's commit but
before its checkpoint is complete redoes that iteration on resume, ending as an uninterrupted run ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from coevolve.config import load_config
from coevolve.loop import run
from coevolve.train.calls import last_checkpoint
from coevolve.train.checkpoints import WRITING, CheckpointWriter, clone_tensors, settle_checkpoint
from support import ls_tasks, run_record, write_tasks
from test_loop import settings
from test_train import overrides

REPO = Path(__file__).resolve().parent.parent


def test_clone_tensors_copies_every_tensor_once_and_keeps_ties():
    embed = torch.arange(6.0).reshape(2, 3)
    state = {"embed.weight": embed, "head.weight": embed, "bias": torch.ones(2),
             "optimizer": {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.zeros(2)}},
                           "param_groups": [{"lr": 1e-3, "params": [0, 1]}]}}
    copied = clone_tensors(state)
    embed.add_(100.0)  # the training step after the save: in place, as AdamW writes
    state["optimizer"]["state"][0]["exp_avg"].fill_(7.0)
    state["optimizer"]["param_groups"][0]["params"].append(2)
    assert copied["embed.weight"].tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert copied["head.weight"] is copied["embed.weight"]  # tied in, tied out: save_pretrained sees the tie
    assert copied["optimizer"]["state"][0]["exp_avg"].tolist() == [0.0, 0.0]
    assert copied["optimizer"]["param_groups"][0]["params"] == [0, 1]
    assert copied["optimizer"]["state"][0]["step"].item() == 3.0


class _Model(torch.nn.Module):
    """A model whose save_pretrained can be held at its start (to update the weights mid-write) or made to fail."""

    def __init__(self, hold: threading.Event | None = None, fail: bool = False) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 2, bias=False)
        torch.nn.init.ones_(self.layer.weight)
        self.hold, self.fail, self.started = hold, fail, threading.Event()

    def save_pretrained(self, folder: str, state_dict: dict, is_main_process: bool) -> None:
        from safetensors.torch import save_file

        self.started.set()
        if self.hold is not None:
            self.hold.wait(timeout=30)
        if self.fail:
            raise OSError("No space left on device")
        save_file(state_dict, str(Path(folder) / "model.safetensors"))


def _fake_trainer(tmp_path: Path, model: _Model) -> SimpleNamespace:
    """The parts of a transformers Trainer the writer reads, around a real AdamW and scheduler."""
    from transformers import TrainerControl, TrainerState

    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model.layer.weight.grad = torch.ones(2, 2)
    optimizer.step()
    trainer = SimpleNamespace(
        args=SimpleNamespace(output_dir=str(tmp_path / "checkpoints"), save_only_model=False, save_total_limit=2),
        state=TrainerState(global_step=4), model=model, optimizer=optimizer,
        lr_scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0),
        callback_handler=SimpleNamespace(callbacks=[]), control=TrainerControl(), processing_class=None,
        store_flos=lambda: None)
    trainer._save_rng_state = lambda folder: torch.save({"cpu": torch.random.get_rng_state()},
                                                        Path(folder) / "rng_state.pth")
    return trainer


def test_the_write_holds_the_weights_of_the_step_it_was_asked_at(tmp_path):
    from safetensors.torch import load_file

    hold = threading.Event()
    model = _Model(hold=hold)
    trainer = _fake_trainer(tmp_path, model)
    writer = CheckpointWriter()
    expected = model.layer.weight.detach().clone()
    moments = trainer.optimizer.state_dict()["state"][0]["exp_avg"].clone()
    folder = writer.save(trainer)
    assert model.started.wait(timeout=30) and writer.writing_step == 4
    assert (folder / WRITING).exists()  # in flight: not a checkpoint resume would take
    assert last_checkpoint(tmp_path) is None
    with torch.no_grad():  # the next step, while the write is in flight
        model.layer.weight.mul_(-3.0)
    trainer.optimizer.state[model.layer.weight]["exp_avg"].add_(5.0)
    hold.set()
    settle_checkpoint(SimpleNamespace(coevolve_writer=writer))
    assert writer.writing_step is None
    assert torch.equal(load_file(str(folder / "model.safetensors"))["layer.weight"], expected)
    saved = torch.load(folder / "optimizer.pt", weights_only=True)
    assert torch.equal(saved["state"][0]["exp_avg"], moments)
    assert json.loads((folder / "trainer_state.json").read_text())["global_step"] == 4
    assert last_checkpoint(tmp_path) == folder and not (folder / WRITING).exists()


def test_a_failed_write_raises_at_the_next_wait_and_leaves_no_checkpoint(tmp_path):
    from coevolve.train import TrainingError

    trainer = _fake_trainer(tmp_path, _Model(fail=True))
    writer = CheckpointWriter()
    folder = writer.save(trainer)
    with pytest.raises(TrainingError, match=r"checkpoint of step 4 failed .*No space left"):
        writer.settle()
    assert (folder / WRITING).exists() and last_checkpoint(tmp_path) is None
    writer.settle()  # said once; the writer is usable again
    trainer.model.fail = False
    writer.save(trainer)
    writer.settle()
    assert last_checkpoint(tmp_path) == folder


def _tensors_equal(left, right) -> bool:
    if isinstance(left, torch.Tensor):
        return isinstance(right, torch.Tensor) and left.dtype == right.dtype and torch.equal(left, right)
    if isinstance(left, dict):
        return left.keys() == right.keys() and all(_tensors_equal(left[k], right[k]) for k in left)
    if isinstance(left, (list, tuple)):
        return len(left) == len(right) and all(_tensors_equal(a, b) for a, b in zip(left, right))
    if isinstance(left, np.ndarray):  # numpy's RNG state
        return np.array_equal(left, right)
    return left == right


def _state(folder: Path) -> dict:
    """trainer_state.json without its wall-clock figures (step_time, train_runtime, samples per second)."""
    state = json.loads((folder / "trainer_state.json").read_text())
    state["log_history"] = [{k: v for k, v in row.items() if "time" not in k and "per_second" not in k}
                            for row in state["log_history"]]
    return state


def test_async_save_writes_what_a_synchronous_save_writes(tmp_path, ls_policy_dir, tokenizer, monkeypatch):
    """Two `train()` calls of one step each (the loop's shape: the second resumes from the first's checkpoint),
    once with transformers' save and once with the background writer, whose write of checkpoint 1 is held until the
    second call's step has begun (so that call resumed from the checkpoint in flight): the same rollouts, and
    checkpoints 1 and 2 with the same files holding the same values."""
    from safetensors.torch import load_file
    from transformers import PreTrainedModel, TrainerCallback

    from coevolve.envs.bfcl_lite import BFCLLiteEnv
    from coevolve.policy.chat import ChatRenderer
    from coevolve.train import EnvRollouts, build_trainer
    from coevolve.train.calls import train_steps

    tasks, second_step, in_flight = ls_tasks(4), threading.Event(), []
    original_save = PreTrainedModel.save_pretrained

    def held_save(model, folder, *args, **kwargs):
        if threading.current_thread().name == "coevolve-checkpoint-1":
            assert second_step.wait(timeout=120), "the second train() call waited for checkpoint 1"
        return original_save(model, folder, *args, **kwargs)

    class _SecondStep(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 1:  # the second call's step, from checkpoint 1
                in_flight.append((Path(args.output_dir) / "checkpoint-1" / WRITING).exists())
                second_step.set()

    def trained(directory: Path, *extra: str):
        config = load_config(None, overrides(ls_policy_dir, tmp_path / "unused.jsonl", "run.max_steps=2",
                                             "run.save_steps=100", "run.save_total_limit=2", *extra))
        seen = []
        rollouts = EnvRollouts(BFCLLiteEnv("train"), tasks, ChatRenderer(tokenizer, "python"),
                               config.rollout.engine(), seed=0,
                               on_step=lambda record: seen.append([(t.id, t.score) for t in record.trajectories]))
        trainer = build_trainer(config, directory, str(ls_policy_dir), tokenizer, rollouts, tasks,
                                callbacks=[_SecondStep()])
        assert (trainer.coevolve_writer is not None) == ("run.async_save=true" in extra)
        for stop in (1, 2):
            assert train_steps(trainer, directory, stop) == stop
        settle_checkpoint(trainer)
        return seen

    sync_rollouts = trained(tmp_path / "sync")
    monkeypatch.setattr(PreTrainedModel, "save_pretrained", held_save)
    async_rollouts = trained(tmp_path / "async", "run.async_save=true")
    assert in_flight == [False, True]  # sync: complete before the call; async: still being written
    assert sync_rollouts == async_rollouts and len(async_rollouts) == 2
    for step in (1, 2):
        sync, asynchronous = (tmp_path / name / "checkpoints" / f"checkpoint-{step}" for name in ("sync", "async"))
        assert sorted(p.name for p in sync.iterdir()) == sorted(p.name for p in asynchronous.iterdir())
        assert _tensors_equal(load_file(str(sync / "model.safetensors")),
                              load_file(str(asynchronous / "model.safetensors")))
        for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
            assert _tensors_equal(torch.load(sync / name, weights_only=False),
                                  torch.load(asynchronous / name, weights_only=False)), name
        assert _state(sync) == _state(asynchronous)


KILL_MID_WRITE = """
import json, os, signal, sys, threading, time
from pathlib import Path
from transformers import PreTrainedModel
import coevolve.loop as loop
out, original = Path(sys.argv[1]), PreTrainedModel.save_pretrained
def committed(iteration):
    path = out / "metrics.jsonl"
    return path.exists() and any(json.loads(line)["iteration"] == iteration for line in path.read_text().splitlines())
def dying(model, folder, *args, **kwargs):
    if threading.current_thread().name == "coevolve-checkpoint-2":  # iteration 2's checkpoint, in the background
        while not committed(2):  # ...until iteration 2 has committed without it
            time.sleep(0.05)
        print("killed mid-write", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    return original(model, folder, *args, **kwargs)
PreTrainedModel.save_pretrained = dying
loop.run(None, sys.argv[2:], str(out), say=lambda text: None)
"""


def test_a_kill_after_the_commit_but_before_its_checkpoint_is_written_redoes_that_iteration(tmp_path, ls_policy_dir):
    """Three iterations of one step under `run.async_save`, killed while iteration 2's checkpoint is written and after
    its metrics line: resume drops that line, trains iteration 2 again from checkpoint 1, and the run ends with the
    records of an uninterrupted run with transformers' own saves."""
    tasks_file = write_tasks(ls_tasks(4), tmp_path / "tasks.jsonl")
    options = settings(ls_policy_dir, tasks_file, "coevolve", "run.max_steps=3")
    reference = tmp_path / "reference"
    run(None, options, str(reference), say=lambda text: None)
    killed = tmp_path / "killed"
    died = subprocess.run([sys.executable, "-c", KILL_MID_WRITE, str(killed), *options, "run.async_save=true"],
                          cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO / "tests")})
    assert died.returncode == -9 and "killed mid-write" in died.stdout, died.stderr[-2000:]
    assert [row["iteration"] for row in map(json.loads, (killed / "metrics.jsonl").read_text().splitlines())] == \
        [0, 1, 2]  # iteration 2 committed...
    assert (killed / "checkpoints" / "checkpoint-2" / WRITING).exists()  # ...its checkpoint not complete
    assert last_checkpoint(killed) == killed / "checkpoints" / "checkpoint-1"

    resumed = subprocess.run([sys.executable, "-m", "coevolve.cli", "train", "--output-dir", str(killed),
                              "--resume"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    got, want = run_record(killed), run_record(reference)
    assert got["steps"] == want["steps"] == [1, 2, 3]
    assert got["metrics"] == want["metrics"]  # iteration 2 once, as the uninterrupted run recorded it
    assert got["versions"] == want["versions"] and got["history"] == want["history"]
    assert got["lineage"] == want["lineage"] and got["rollouts"] == want["rollouts"]
    assert last_checkpoint(killed) == killed / "checkpoints" / "checkpoint-3"
    assert not list((killed / "checkpoints").glob(f"*/{WRITING}"))  # the run's end waited for its last write


def test_a_trainer_that_saves_collectively_keeps_transformers_save_and_says_so():
    from coevolve.train.checkpoints import writer_for

    def trainer(processes: int, metric: str | None = None) -> SimpleNamespace:
        return SimpleNamespace(accelerator=SimpleNamespace(num_processes=processes), is_deepspeed_enabled=False,
                               is_fsdp_enabled=False, hp_search_backend=None,
                               args=SimpleNamespace(metric_for_best_model=metric, should_save=True, push_to_hub=False))

    assert isinstance(writer_for(trainer(1)), CheckpointWriter)
    for refused in (trainer(2), trainer(1, "eval_loss")):
        with pytest.warns(RuntimeWarning, match="written as transformers writes them"):
            assert writer_for(refused) is None
