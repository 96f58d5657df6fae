"""The CoEvolve loop on two processes (`torchrun --nproc_per_node 2`, gloo on the CPU, a tiny model): every process
trains on the same sample of D_t, the signals see every process's rollouts, synthesis runs once, held-out
evaluation is split and gathered, and a SIGKILL of the whole job in iteration 2's synthesis followed by --resume
loses and doubles nothing."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from coevolve.jsonl import read_jsonl
from support import ls_tasks, run_record, write_tasks

REPO = Path(__file__).resolve().parent.parent

KILL_IN_SYNTHESIS = """
import os, signal, sys
import coevolve.loop as loop
from coevolve.cli import main
original = loop.admit
def dying(run, t, *stages):
    result = original(run, t, *stages)  # admitted into D_t and logged...
    if t == 2 and result is not None and result.admitted:
        print("killed in iteration", t, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # ...and the main process killed before the metrics line
    return result
loop.admit = dying
sys.exit(main(sys.argv[1:]))
"""


def settings(model_dir: Path, tasks_file: Path, mode: str = "coevolve", *extra: str) -> list[str]:
    """Two iterations of one step: 4 `ls()` tasks, 2 per step, K=4 (a micro-batch of 4 per process), 4 held-out
    tasks (2 per process)."""
    return [f"model.name={model_dir}", "model.demos=0", "model.device=cpu", f"env.tasks_file={tasks_file}",
            "rollout.group_size=4", "rollout.max_new_tokens=12", "rollout.max_replies_per_turn=1",
            "rollout.max_episode_tokens=64", "rollout.temperature=1.0", "grpo.prompts_per_step=2",
            "grpo.micro_batch_size=4", "grpo.learning_rate=1e-3", "run.seed=0", "run.max_steps=2",
            "run.save_steps=10", "loop.steps_per_iteration=1", "loop.eval_limit=4", "loop.synthetic_contexts=3",
            f"run.mode={mode}", "synthesis.focus_weight=0.3", "synthesis.episodes_per_context=2", *extra]


def torchrun(*args: str, script: str | None = None) -> subprocess.CompletedProcess:
    """`torchrun --nproc_per_node 2` of `coevolve train` (or of `script`, which runs the CLI itself)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    if script:  # torchrun runs a file or a module, not `-c`
        import tempfile

        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as handle:
            handle.write(script)
    program = [handle.name] if script else ["-m", "coevolve.cli"]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
               "127.0.0.1", "--master_port", str(port), *program, *args]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{REPO}:{REPO / 'tests'}"}
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900, env=environment)


@pytest.fixture()
def tasks_file(tmp_path) -> Path:
    return write_tasks(ls_tasks(4), tmp_path / "tasks.jsonl")


@pytest.fixture()
def config(tmp_path) -> str:
    """A config file that leaves everything to the defaults (the settings come as overrides)."""
    path = tmp_path / "config.yaml"
    path.write_text("run:\n  mode: coevolve\n")
    return str(path)


def test_two_processes_run_coevolve_on_one_sample_and_resume_after_a_kill_exactly(tmp_path, ls_policy_dir, tasks_file,
                                                                                   config):
    options = settings(ls_policy_dir, tasks_file)
    reference = tmp_path / "reference"
    done = torchrun("train", "--config", config, "--output-dir", str(reference), *options)
    assert done.returncode == 0, done.stderr[-3000:]
    want = run_record(reference)
    assert [m["iteration"] for m in want["metrics"]] == [0, 1, 2] and want["steps"] == [1, 2]
    assert all(m["heldout_success"] is not None for m in want["metrics"])  # split over both processes, gathered
    heldout = read_jsonl(reference / "heldout.jsonl")
    assert sorted(r["iteration"] for r in heldout) == [0] * 4 + [1] * 4 + [2] * 4  # both shares, written once
    # Every process trained on the same sample of D_{t-1} at every iteration...
    samples = list(want["samples"].values())
    assert len(samples) == 2 and samples[0] == samples[1] and [s["iteration"] for s in samples[0]] == [1, 2]
    # ...each rolled out its share of every step, and the step's K rollouts of each task came from the sample.
    shares = list(want["rollouts"].values())
    assert len(shares) == 2 and all(shares) and len(shares[0]) + len(shares[1]) == 2 * 2 * 4
    rows = read_jsonl(reference / "rollouts.jsonl") + read_jsonl(reference / "rollouts.p1.jsonl")
    samples = {s["iteration"]: set(s["task_ids"]) for s in samples[0]}
    for step in (1, 2):
        counts = Counter(r["task_id"] for r in rows if r["step"] == step)
        assert set(counts) <= samples[step] and set(counts.values()) == {4}
    # Synthesis ran once (the main process): the pool holds exactly what the metrics say was accepted.
    accepted = sum(m["synthesis"].get("accepted", 0) for m in want["metrics"])
    assert accepted > 0 and len(want["versions"][2]) == len(want["versions"][0]) + accepted
    # The signals and the train success read both processes' rollouts, not the main process's share alone.
    for metrics in want["metrics"][1:]:
        mine = [r["score"] for r in rows if r["iteration"] == metrics["iteration"]]
        assert len(mine) == 8 and metrics["train_success"] == sum(score >= 1.0 for score in mine) / 8
    assert sum(m["signals"]["boundary"] for m in want["metrics"]) > 0

    killed = tmp_path / "killed"
    died = torchrun("train", "--config", config, "--output-dir", str(killed), *options, script=KILL_IN_SYNTHESIS)
    assert died.returncode != 0 and "killed in iteration 2" in died.stdout, died.stderr[-3000:]
    assert [m["iteration"] for m in read_jsonl(killed / "metrics.jsonl")] == [0, 1]
    resumed = torchrun("train", "--output-dir", str(killed), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert run_record(killed) == want


@pytest.mark.parametrize("mode", ["zero-shot", "static", "synthetic", "random"])
def test_every_other_mode_runs_on_two_processes(mode, tmp_path, ls_policy_dir, tasks_file, config):
    out = tmp_path / mode
    done = torchrun("train", "--config", config, "--output-dir", str(out), *settings(ls_policy_dir, tasks_file, mode))
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["iteration"] for m in metrics] == ([0] if mode == "zero-shot" else [0, 1, 2])
    assert all(m["heldout_success"] is not None for m in metrics)
    if mode != "zero-shot":
        samples = [read_jsonl(out / name) for name in ("samples.jsonl", "samples.p1.jsonl")]
        assert samples[0] == samples[1] and len(samples[0]) == 2


def test_a_batch_that_does_not_split_over_the_processes_exits_2_before_loading_anything(tmp_path, ls_policy_dir,
                                                                                         tasks_file, config):
    done = torchrun("train", "--config", config, "--output-dir", str(tmp_path / "odd"),
                    *settings(ls_policy_dir, tasks_file, "static", "grpo.prompts_per_step=1"))
    assert done.returncode != 0
    assert "do not split into micro-batches of 4 (grpo.micro_batch_size) on 2 processes" in done.stderr
    assert "Loading weights" not in done.stderr  # refused before any process loaded the model
    assert 'File "/' + str(REPO / "coevolve") not in done.stderr  # one line from us (torchrun reports its children)


def test_guidance_on_two_processes_guides_whole_groups_on_each_and_a_split_group_is_refused(tmp_path, ls_policy_dir,
                                                                                             config):
    """K = 4 with micro-batches of 4: each process rolls out one whole group a step. On `cat` tasks the ls policy
    fails every rollout, so every group is all-failure and guidance replaces one rollout of each, on both processes
    (never silently nothing). Micro-batches of 2 would split a group across the processes: refused up front."""
    from coevolve.envs.bfcl_lite import BFCLLiteEnv

    cats = [t for t in BFCLLiteEnv("train").tasks() if t.truth_tools == ("cat",)][:4]
    tasks_file = write_tasks(cats, tmp_path / "cats.jsonl")
    out = tmp_path / "guided"
    done = torchrun("train", "--config", config, "--output-dir", str(out),
                    *settings(ls_policy_dir, tasks_file, "static", "grpo.guidance=solution", "loop.eval_limit=2"))
    assert done.returncode == 0, done.stderr[-3000:]
    logs = [read_jsonl(out / name) for name in ("rollouts.jsonl", "rollouts.p1.jsonl")]
    for rows in logs:  # per process and step: one group of 4, its last rollout guided
        assert len(rows) == 2 * 4 and sum(bool(row.get("guided")) for row in rows) == 2, rows
        assert all(not row.get("guided") or row["score"] == 1.0 for row in rows)
    assert [m["guided"] for m in read_jsonl(out / "metrics.jsonl")] == [0, 2, 2]
    split = torchrun("train", "--config", config, "--output-dir", str(tmp_path / "split"),
                     *settings(ls_policy_dir, tasks_file, "static", "grpo.guidance=solution", "grpo.micro_batch_size=2"))
    assert split.returncode != 0
    assert "grpo.guidance needs whole GRPO groups on each process" in split.stderr
    assert "Loading weights" not in split.stderr
