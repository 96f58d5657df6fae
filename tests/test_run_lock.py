"""One writer per run directory (`coevolve.run_lock`): a second writer is refused at once with the holder named,
before it writes anything; a lock whose holder was killed with SIGKILL is taken over."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coevolve.run_lock import LOCK_FILE, RunDirectoryBusy, RunLock

REPO = Path(__file__).resolve().parent.parent
HOLD = "import sys, time; from coevolve.run_lock import RunLock\nwith RunLock(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(120)\n"


def holder(directory: Path) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(directory)], cwd=REPO, stdout=subprocess.PIPE,
                               text=True)
    assert process.stdout.readline().strip() == "held"
    return process


def test_a_second_writer_is_refused_and_the_lock_is_released_at_the_end(tmp_path):
    with RunLock(tmp_path) as first:
        assert first.previous is None
        with pytest.raises(RunDirectoryBusy, match=f"pid {os.getpid()} on"):
            with RunLock(tmp_path):
                pass
    with RunLock(tmp_path) as again:  # released: the next run takes it, and sees who wrote last
        assert again.previous["pid"] == os.getpid()
    with RunLock(tmp_path, enabled=False), RunLock(tmp_path):  # a non-main process holds nothing
        pass


def test_a_lock_whose_holder_was_killed_is_taken_over(tmp_path):
    process = holder(tmp_path)
    with pytest.raises(RunDirectoryBusy, match=f"pid {process.pid}"):
        RunLock(tmp_path).__enter__()
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    with RunLock(tmp_path) as lock:
        assert lock.previous["pid"] == process.pid  # the dead holder's line, replaced by ours
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()


def test_train_on_a_directory_being_written_is_refused_in_one_line_before_writing(tmp_path):
    run_dir = tmp_path / "run"
    process = holder(run_dir)
    try:
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "coevolve.cli", "train", "--config",
                               str(REPO / "configs" / "lite-static.yaml"), "--output-dir", str(run_dir)],
                              cwd=REPO, capture_output=True, text=True, timeout=300)
        assert done.returncode == 2 and "being written by another run" in done.stderr
        assert f"pid {process.pid}" in done.stderr and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
        assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_FILE]  # nothing written: no config.yaml, no log
        assert time.perf_counter() - started < 120  # refused at once, not after loading the model
    finally:
        process.kill()
        process.wait(timeout=30)


def test_an_output_dir_that_cannot_be_made_is_one_line(tmp_path):
    from coevolve.config import ConfigError

    with pytest.raises(ConfigError, match="cannot be written"):
        RunLock(Path("/proc/coevolve-run")).__enter__()
