"""CoEvolve's own figures in the trackers a researcher watches: every per-iteration number of metrics.jsonl goes to
each tracker in `run.report_to` (TensorBoard, trackio, W&B), beside TRL's per-step metrics.

TRL's `report_to` passes the trainer's step metrics (loss, reward, KL, ...) to the trackers; what makes a CoEvolve
run what it is — signals fired, contexts explored, candidates admitted and rejected by reason, the pool by source,
the draw's composition, guided rollouts, held-out success by part, the feedback share — was only in metrics.jsonl
and the HTML report, so on a dashboard the run looked like plain GRPO. `iteration_figures` flattens one
metrics.jsonl line into stable names (`coevolve/signals/boundary`, `coevolve/pool/synthetic`,
`coevolve/heldout_by_calls/2-call`, `coevolve/synthesis/rejected_by_reason/redundant`, ...: `coevolve/`, the
field, then its keys, joined with `/`); `report_iteration` writes them at the iteration's last global step (the
x axis TRL's own metrics use), through the trackers the trainer's callbacks hold open, from the main process only.

Where the trackers write: TensorBoard under `DIR/tensorboard` (`prepare_trackers`; transformers' default is a new
timestamped folder per process, so a resumed run would show as a second run), trackio and W&B under the run
directory's name (TrainingArguments' `run_name`; without one, trackio made a new run at every iteration's
`train()` call, since its callback finishes the run at each one's end).

Names are written as they are, not under transformers' `train/` prefix (`rewrite_logs`), so that they group as
CoEvolve's own panel. A resumed run continues the same curves with no point twice: an iteration is sent right after
its metrics.jsonl line (its commit point), and `DIR/trackers-sent.json` keeps the last iteration sent. A resume redoes
iterations that have no line, and one more under `run.async_save`: a kill while the checkpoint of a committed
iteration was still being written drops that line and redoes the iteration, with the same values (exact resume),
so its figures are not sent again. A kill between the line and the send leaves that one iteration off the trackers
(it stays in metrics.jsonl and the report).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Mapping

from coevolve.jsonl import atomic_write_text

PREFIX = "coevolve"
SKIPPED = ("iteration", "steps")
"""Fields that are the x axis itself, not figures."""
MAX_DEPTH = 4


def iteration_figures(record: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of one metrics.jsonl line under stable tracker names (see the module docstring); booleans as 0/1,
    None, text and lists left out, nested mappings joined with `/`."""
    figures: dict[str, float] = {}

    def walk(prefix: str, value: Any, depth: int) -> None:
        if isinstance(value, bool):
            figures[prefix] = float(value)
        elif isinstance(value, (int, float)):
            number = float(value)
            if math.isfinite(number):
                figures[prefix] = number
        elif isinstance(value, Mapping) and depth < MAX_DEPTH:
            for key, item in value.items():
                walk(f"{prefix}/{str(key).replace(' ', '_')}", item, depth + 1)

    for field, value in record.items():
        if field not in SKIPPED:
            walk(f"{PREFIX}/{field}", value, 1)
    return figures


TENSORBOARD_DIR = "tensorboard"


def prepare_trackers(trainer: Any, directory: Any) -> None:
    """TensorBoard's folder fixed to `DIR/tensorboard` (unless TENSORBOARD_LOGGING_DIR says otherwise): one run's
    curves in one place, continued by a resume."""
    for callback in trainer.callback_handler.callbacks:
        if type(callback).__name__ == "TensorBoardCallback" and not os.getenv("TENSORBOARD_LOGGING_DIR"):
            callback.logging_dir = os.path.join(str(directory), TENSORBOARD_DIR)


SENT_FILE = "trackers-sent.json"


def last_sent(directory: Path | None) -> int:
    """The last iteration whose figures reached the trackers in this run directory (-1: none yet)."""
    path = Path(directory) / SENT_FILE if directory is not None else None
    if path is None or not path.exists():
        return -1
    try:
        return int(json.loads(path.read_text())["iteration"])
    except (ValueError, KeyError, TypeError):  # unreadable: send again rather than lose a point
        return -1


def report_iteration(trainer: Any, record: Mapping[str, Any], directory: Path | None = None) -> list[str]:
    """Send one iteration's figures to every tracker the trainer reports to, at its current global step; returns the
    trackers written (none without a trainer, on another process than the main one, or for an iteration already
    sent from `directory`, which then records this one as sent)."""
    if trainer is None or not trainer.state.is_world_process_zero:
        return []
    iteration = int(record.get("iteration", -1))
    if directory is not None and iteration <= last_sent(directory):
        return []  # redone after a kill mid-write (module docstring): the same values are on the curves already
    figures = iteration_figures(record)
    step = int(trainer.state.global_step)
    written = []
    for callback in trainer.callback_handler.callbacks:
        kind = type(callback).__name__
        if kind == "TensorBoardCallback":
            written += _tensorboard(callback, trainer, figures, step)
        elif kind == "TrackioCallback":
            written += _trackio(callback, trainer, figures, step)
        elif kind == "WandbCallback":
            written += _wandb(callback, trainer, figures, step)
    if written and directory is not None:
        atomic_write_text(Path(directory) / SENT_FILE, json.dumps({"iteration": iteration}) + "\n")
    return written


def _tensorboard(callback: Any, trainer: Any, figures: Mapping[str, float], step: int) -> list[str]:
    from transformers.integrations.integration_utils import default_logdir

    if callback.tb_writer is None:  # closed at the end of the last `train()` call, or not opened yet
        if callback.logging_dir is None:
            callback.logging_dir = os.path.join(trainer.args.output_dir, default_logdir())
        callback._init_summary_writer(trainer.args)
    if callback.tb_writer is None:
        return []
    for name, value in figures.items():
        callback.tb_writer.add_scalar(name, value, step)
    callback.tb_writer.flush()
    return ["tensorboard"]


def _trackio(callback: Any, trainer: Any, figures: Mapping[str, float], step: int) -> list[str]:
    if not callback._initialized:  # iteration 0 comes before TRL's first log, which would set it up
        callback.setup(trainer.args, trainer.state, trainer.model)
    callback._trackio.log({**figures, "train/global_step": step})
    return ["trackio"]


def _wandb(callback: Any, trainer: Any, figures: Mapping[str, float], step: int) -> list[str]:
    if not callback._initialized:
        callback.setup(trainer.args, trainer.state, trainer.model)
    if callback._wandb is None or callback._wandb.run is None:
        return []
    callback._wandb.log({**figures, "train/global_step": step})
    return ["wandb"]
