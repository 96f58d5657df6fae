"""`coevolve report DIR`: one self-contained HTML page from a run directory (no network, no plotting library).

What it shows, from the files the loop writes (coevolve.loop): the run's summary and resolved config; success per
iteration (train rollouts, held-out); signal counts per iteration, stacked by kind; the pool's size per iteration
by source; rollouts that failed outside the agent (backend, environment); wall time per iteration, stacked by
phase, with the feedback share; and a table of every candidate
synthesis validated, with its lineage — signal -> flagged trajectories -> exploration episode ->
candidate (query, solution) -> verdict -> task — filterable to the accepted ones. Plots are inline SVG drawn
here; everything is escaped (queries and solutions are model output).
"""

from __future__ import annotations

import html
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from coevolve.jsonl import atomic_write_text, jsonl_rows
from coevolve.signals import PATTERN_SEPARATOR

COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860")
WIDTH, HEIGHT, PAD = 560, 240, 40


def _scale(values: Sequence[float], top: float | None = None) -> float:
    highest = max([top or 0.0, *values])
    return highest if highest > 0 else 1.0  # all zero: an axis from 0 to 1, not to 1e-09


def _frame(title: str, x_labels: Sequence[Any], top: float, body: str, legend: Sequence[tuple[str, str]],
           kind: str) -> str:
    ticks = "".join(
        f'<text x="{PAD - 6}" y="{HEIGHT - PAD - (HEIGHT - 2 * PAD) * f:.1f}" text-anchor="end" font-size="10">'
        f"{top * f:.3g}</text>" for f in (0, 0.5, 1))
    step = (WIDTH - 2 * PAD) / max(1, len(x_labels))
    labels = "".join(f'<text x="{PAD + step * (i + 0.5):.1f}" y="{HEIGHT - PAD + 14}" text-anchor="middle" '
                     f'font-size="10">{html.escape(shown(label))}</text>' for i, label in enumerate(x_labels))
    keys = "".join(f'<tspan fill="{colour}">&#9632; {html.escape(name)}</tspan> ' for name, colour in legend)
    return (f'<figure class="plot" data-kind="{kind}"><figcaption>{html.escape(title)}</figcaption>'
            f'<svg width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{html.escape(title)}">'
            f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" stroke="#888"/>'
            f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{HEIGHT - PAD}" stroke="#888"/>{ticks}{labels}{body}'
            f'<text x="{PAD}" y="{PAD - 12}" font-size="11">{keys}</text>'
            f'<text x="{WIDTH / 2}" y="{HEIGHT - 6}" text-anchor="middle" font-size="10">iteration</text></svg>'
            f"</figure>")


def line_plot(title: str, x_labels: Sequence[Any], series: Mapping[str, Sequence[float | None]],
              top: float | None = None) -> str:
    """Lines over iterations; a None has no point (e.g. no held-out evaluation that iteration) and the line joins
    the points on either side of it."""
    top = _scale([v for values in series.values() for v in values if v is not None], top)
    step = (WIDTH - 2 * PAD) / max(1, len(x_labels))
    body, legend = "", []
    for (name, values), colour in zip(series.items(), COLOURS):
        points = [(PAD + step * (i + 0.5), HEIGHT - PAD - (HEIGHT - 2 * PAD) * v / top)
                  for i, v in enumerate(values) if v is not None]
        if len(points) > 1:
            body += (f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="'
                     + " ".join(f"{x:.1f},{y:.1f}" for x, y in points) + '"/>')
        body += "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"/>' for x, y in points)
        legend.append((name, colour))
    return _frame(title, x_labels, top, body, legend, "line")


def stacked_bars(title: str, x_labels: Sequence[Any], series: Mapping[str, Sequence[float]]) -> str:
    totals = [sum(values[i] for values in series.values()) for i in range(len(x_labels))]
    top = _scale(totals)
    step = (WIDTH - 2 * PAD) / max(1, len(x_labels))
    body, legend = "", []
    bottoms = [0.0] * len(x_labels)
    for (name, values), colour in zip(series.items(), COLOURS):
        for i, value in enumerate(values):
            if value <= 0:
                continue
            height = (HEIGHT - 2 * PAD) * value / top
            y = HEIGHT - PAD - (HEIGHT - 2 * PAD) * bottoms[i] / top - height
            body += (f'<rect x="{PAD + step * i + step * 0.15:.1f}" y="{y:.1f}" width="{step * 0.7:.1f}" '
                     f'height="{height:.1f}" fill="{colour}"><title>{html.escape(name)}: {value:.4g}</title></rect>')
            bottoms[i] += value
        legend.append((name, colour))
    return _frame(title, x_labels, top, body, legend, "bars")


def shown(value: Any) -> str:
    """`str(value)`, safe for anything a run file may hold (a 5,000-digit integer cannot be `str`-ed)."""
    try:
        return str(value)
    except ValueError:
        return f"({type(value).__name__} too large to show)"


def _cell(value: Any) -> str:
    return f"<td>{html.escape('' if value is None else shown(value))}</td>"


def lineage_table(rows: Sequence[Mapping[str, Any]]) -> str:
    head = ("iteration", "signal", "parent task", "flagged trajectories", "episode", "query", "solution", "verdict",
            "task")
    lines = []
    for row in rows:
        verdict = "accepted" if row.get("accepted") else "; ".join(row.get("reasons", []))
        cells = (row.get("iteration"), row.get("signal"), row.get("parent_task_id"),
                 ", ".join(row.get("trajectory_ids", [])[:4]), row.get("episode_id"), row.get("query"),
                 "\n".join(row.get("solution", [])), verdict, row.get("task_id") or "")
        status = "accepted" if row.get("accepted") else "rejected"
        texts = [_cell(cell) for cell in cells]
        if row.get("parent_task_id"):  # to the parent's rollouts, further down
            parent = html.escape(shown(row["parent_task_id"]))
            texts[2] = f'<td><a href="#task-{parent}">{parent}</a></td>'
        lines.append(f'<tr class="{status}">' + "".join(texts) + "</tr>")
    return ('<label><input type="checkbox" id="only-accepted"> accepted only</label>'
            f' <span id="shown">{len(rows)}</span> of {len(rows)} candidates'
            '<table id="lineage"><thead><tr>' + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"
            + "".join(lines) + "</tbody></table>")


_SCRIPT = """
document.getElementById('only-accepted').addEventListener('change', function (event) {
  var shown = 0;
  document.querySelectorAll('#lineage tbody tr').forEach(function (row) {
    var visible = !event.target.checked || row.classList.contains('accepted');
    row.style.display = visible ? '' : 'none';
    if (visible) { shown += 1; }
  });
  document.getElementById('shown').textContent = shown;
});
"""
_STYLE = """
body { font-family: sans-serif; margin: 24px; color: #222; }
.plots { display: flex; flex-wrap: wrap; gap: 12px; }
figure { margin: 0; border: 1px solid #ddd; padding: 6px; }
figcaption { font-weight: bold; font-size: 13px; }
table { border-collapse: collapse; font-size: 12px; margin-top: 8px; }
td, th { border: 1px solid #ccc; padding: 3px 6px; vertical-align: top; white-space: pre-wrap; max-width: 360px; }
tr.rejected td { color: #777; }
p.warning { color: #a33; }
pre { background: #f6f6f6; padding: 8px; font-size: 12px; max-height: 320px; overflow: auto; }
"""


NUMBER = (int, float)
METRIC_FIELDS: dict[str, tuple[type, ...]] = {
    "train_success": (*NUMBER, type(None)), "heldout_success": (*NUMBER, type(None)), "feedback_share": NUMBER,
    "guided": NUMBER, "signals": (dict,), "pool": (dict,), "failures": (dict,), "seconds": (dict,),
    "synthesis": (dict,), "heldout_by_calls": (dict,), "heldout_by_tools": (dict,), "patterns": (dict,),
    "new_tool_tasks": (dict,)}
"""What the plots read from a metrics line; a field of another type is left out with a warning."""
MAX_NUMBER = 1e15
"""A plotted number larger than this is no figure of a run (a 5,000-digit integer): left out with a warning."""
MAX_ROLLOUT_BYTES = 1 << 30
"""What the report reads of all the rollout logs together (each file is bounded by MAX_RUN_FILE_BYTES too)."""


def is_number(value: Any) -> bool:
    """A finite int or float (not a bool) of a plottable size."""
    if isinstance(value, bool) or not isinstance(value, NUMBER):
        return False
    try:
        return abs(float(value)) <= MAX_NUMBER
    except OverflowError:
        return False
LIST_FIELDS = ("trajectory_ids", "solution", "reasons")


MAX_RUN_FILE_BYTES = 256 << 20


def readable(path: Path, warnings: list[str]) -> bool:
    """Whether `path` is a run file the report may read: a regular file (not a link, a FIFO, a device or a folder)
    of at most MAX_RUN_FILE_BYTES. Missing: False, silently; anything else refused: False, with a warning."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as error:
        warnings.append(f"{path.name}: cannot be read ({error.strerror}); left out")
        return False
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISREG(info.st_mode):
        kind = "a link" if stat.S_ISLNK(info.st_mode) else "not a regular file"
        warnings.append(f"{path.name}: {kind}; left out (the report reads the run's own files only)")
        return False
    if info.st_size > MAX_RUN_FILE_BYTES:
        warnings.append(f"{path.name}: {info.st_size} bytes, over {MAX_RUN_FILE_BYTES}; left out")
        return False
    return True


def _text(path: Path, warnings: list[str]) -> str:
    return path.read_text(encoding="utf-8", errors="replace") if readable(path, warnings) else ""


def _records(path: Path, warnings: list[str]) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for each line of a JSON-lines file; every other line is a warning, not a traceback."""
    if not readable(path, warnings):
        return []
    bad = lambda number, why: warnings.append(f"{path.name}:{number}: not a JSON object; left out")  # noqa: E731
    rows = []
    for number, value in jsonl_rows(path, strict=False, on_bad=bad):
        if isinstance(value, dict):
            rows.append((number, value))
        else:
            bad(number, "")
    return rows


def checked_metrics(path: Path, warnings: list[str]) -> list[dict[str, Any]]:
    metrics = []
    for number, row in _records(path, warnings):
        if not isinstance(row.get("iteration"), int) or not is_number(row.get("iteration")):
            warnings.append(f"{path.name}:{number}: no integer iteration; line left out")
            continue
        for field, kinds in METRIC_FIELDS.items():
            value = row.get(field)
            if field in row and (not isinstance(value, kinds) or isinstance(value, bool)
                                 or (isinstance(value, NUMBER) and not is_number(value))):
                warnings.append(f"{path.name}:{number}: {field} is {type(value).__name__}, not "
                                f"{'/'.join(kind.__name__ for kind in kinds)}; left out")
                del row[field]
            elif isinstance(value, dict) and field not in ("synthesis", "patterns"):
                bad = [key for key, item in value.items() if not is_number(item)]
                if bad:
                    warnings.append(f"{path.name}:{number}: {field} has values that are not numbers ({bad[0]}); "
                                    "left out")
                    row[field] = {key: item for key, item in value.items() if key not in bad}
        metrics.append(row)
    return metrics


def checked_lineage(path: Path, warnings: list[str]) -> list[dict[str, Any]]:
    rows = []
    for number, row in _records(path, warnings):
        for field in LIST_FIELDS:
            if field in row and not isinstance(row[field], list):
                warnings.append(f"{path.name}:{number}: {field} is {type(row[field]).__name__}, not a list")
                row[field] = [row[field]]
            if field in row:
                row[field] = [shown(item) for item in row[field]]
        rows.append(row)
    return rows


def checked_heldout(path: Path, warnings: list[str]) -> list[dict[str, Any]]:
    """heldout.jsonl's rows with an integer iteration and a text task id; lists where lists are read."""
    rows = []
    for number, row in _records(path, warnings):
        if not (isinstance(row.get("iteration"), int) and is_number(row["iteration"])
                and isinstance(row.get("task_id"), str)):
            warnings.append(f"{path.name}:{number}: no integer iteration or no task id; line left out")
            continue
        for field in ("calls", "truth_tools"):
            if field in row and not isinstance(row[field], list):
                warnings.append(f"{path.name}:{number}: {field} is {type(row[field]).__name__}, not a list")
                row[field] = [row[field]]
        rows.append(row)
    return rows


def heldout_changes(rows: Sequence[Mapping[str, Any]]) -> tuple[int | None, int | None, list, list]:
    """(first iteration, last iteration, tasks fixed, tasks broken) between the first and the last held-out
    evaluation of heldout.jsonl; each task as (before row, after row)."""
    by_iteration: dict[int, dict[str, Mapping[str, Any]]] = {}
    for row in rows:
        if isinstance(row.get("iteration"), int) and isinstance(row.get("task_id"), str):
            by_iteration.setdefault(row["iteration"], {})[row["task_id"]] = row
    if len(by_iteration) < 2:
        return None, None, [], []
    first, last = min(by_iteration), max(by_iteration)
    before, after = by_iteration[first], by_iteration[last]
    common = [task for task in before if task in after]
    solved = {task: (bool(before[task].get("success")), bool(after[task].get("success"))) for task in common}
    fixed = [(before[task], after[task]) for task in common if solved[task] == (False, True)]
    broken = [(before[task], after[task]) for task in common if solved[task] == (True, False)]
    return first, last, fixed, broken


def changes_table(rows: Sequence[Mapping[str, Any]]) -> str:
    first, last, fixed, broken = heldout_changes(rows)
    if first is None:
        return "<p>One held-out evaluation or none: nothing to compare.</p>"
    lines = []
    for kind, pairs in (("fixed", fixed), ("broke", broken)):
        for before, after in pairs:
            cells = (kind, before.get("name"), "\n".join(map(shown, before.get("calls") or [])) or "(no call)",
                     before.get("reason") or "", "\n".join(map(shown, after.get("calls") or [])) or "(no call)",
                     after.get("reason") or "")
            lines.append(f'<tr class="change-{kind}">' + "".join(map(_cell, cells)) + "</tr>")
    head = ("", "task", f"calls at iteration {first}", "why it failed", f"calls at iteration {last}", "why it failed")
    return (f"<p>From iteration {first} to {last}: {len(fixed)} held-out tasks fixed, {len(broken)} broken.</p>"
            '<table id="changes"><thead><tr>' + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"
            + "".join(lines) + "</tbody></table>")


def tool_sequence(calls: Sequence[Any]) -> str:
    """`cd > mkdir` for [cd(folder='a'), mkdir(dir_name='b')]: what a synthesized task and a held-out task share."""
    return PATTERN_SEPARATOR.join(shown(call).split("(", 1)[0].strip()[:60] for call in calls) or "(no call)"


def signals_table(metrics: Sequence[Mapping[str, Any]]) -> str:
    """Per iteration: the events of each kind, and per n-gram size the patterns seen (N), distinct, rare, and θ."""
    lines = []
    for m in metrics:
        if not m["iteration"]:
            continue
        patterns = m.get("patterns") if isinstance(m.get("patterns"), dict) else {}
        shown = "; ".join(
            f"{size}-grams: N {row.get('total')}, {row.get('distinct')} distinct, {row.get('rare')} rare at θ "
            f"{_number(row.get('theta_percent'))}%" for size, row in patterns.items() if isinstance(row, dict))
        lines.append("<tr>" + _cell(m["iteration"]) + "".join(
            _cell(m.get("signals", {}).get(kind, 0)) for kind in ("forgetting", "boundary", "rare"))
            + _cell(shown or "-") + "</tr>")
    head = ("iteration", "forgetting", "boundary", "rare", "action patterns (what decides rare)")
    return ('<table id="signals"><thead><tr>' + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"
            + "".join(lines) + "</tbody></table>")


def rollout_rows(directory: Path, task_ids: set[str], warnings: list[str]) -> dict[str, list[Mapping[str, Any]]]:
    """Task id -> its training rollouts (every process's log), for the tasks asked for, in iteration order."""
    found: dict[str, list[Mapping[str, Any]]] = {}
    budget = MAX_ROLLOUT_BYTES
    for path in sorted(directory.glob("rollouts*.jsonl")):
        size = path.stat().st_size if readable(path, warnings) else 0
        if size > budget:
            warnings.append(f"{path.name}: the rollout logs hold over {MAX_ROLLOUT_BYTES} bytes together; this one "
                            "and any after it left out")
            break
        budget -= size
        for _, row in _records(path, warnings):
            if isinstance(row.get("task_id"), str) and row["task_id"] in task_ids:
                found.setdefault(row["task_id"], []).append(row)
    order = lambda r: (r["iteration"] if is_number(r.get("iteration")) else 0, shown(r.get("id")))  # noqa: E731
    return {task: sorted(rows, key=order) for task, rows in found.items()}


def _steps_text(row: Mapping[str, Any]) -> str:
    steps = row.get("steps") if isinstance(row.get("steps"), list) else []
    return "\n".join(f"{shown(step.get('action', ''))[:120]} -> {shown(step.get('observation', ''))[:120]}"
                     for step in steps if isinstance(step, dict)) or "(no call)"


def parent_rollouts_table(lineage: Sequence[Mapping[str, Any]], rollouts: Mapping[str, Sequence[Mapping[str, Any]]],
                          limit: int = 40) -> str:
    """The rollouts of each task a signal flagged (the lineage's parents), every iteration: calls -> observations
    and score, so a candidate can be read beside what the agent did on its parent. The first `limit` parents."""
    parents = list(dict.fromkeys(shown(r.get("parent_task_id")) for r in lineage if r.get("parent_task_id")))
    lines = []
    for parent in parents[:limit]:
        for index, row in enumerate(rollouts.get(parent, [])):
            anchor = f' id="task-{html.escape(parent)}"' if index == 0 else ""
            rollout = f"{row.get('id')} (guided: the task's solution)" if row.get("guided") else row.get("id")
            lines.append(f"<tr{anchor}>" + _cell(parent) + _cell(row.get("iteration")) + _cell(rollout)
                         + _cell(row.get("score")) + _cell(_steps_text(row))
                         + _cell("; ".join(map(shown, row.get("reasons") or []))[:300]) + "</tr>")
    head = ("task", "iteration", "rollout", "score", "calls -> observations", "why it scored so")
    more = f"<p>The first {limit} of {len(parents)} flagged tasks.</p>" if len(parents) > limit else ""
    return (more + '<table id="parent-rollouts"><thead><tr>' + "".join(f"<th>{h}</th>" for h in head)
            + "</tr></thead><tbody>" + "".join(lines) + "</tbody></table>")


def coverage_table(lineage: Sequence[Mapping[str, Any]], heldout: Sequence[Mapping[str, Any]]) -> str:
    """Synthesized tasks beside the held-out tasks they could help: grouped by tool sequence (`cd > mkdir`), the
    accepted synthetic tasks (count, an example query) and the held-out tasks with that ground truth (count,
    solved at the first and at the last evaluation)."""
    iterations = sorted({r["iteration"] for r in heldout if isinstance(r.get("iteration"), int)})
    first, last = (iterations[0], iterations[-1]) if iterations else (None, None)
    groups: dict[str, dict[str, Any]] = {}
    for row in lineage:
        if row.get("accepted"):
            group = groups.setdefault(tool_sequence(row.get("solution") or []), {"synthetic": [], "heldout": {}})
            group["synthetic"].append(shown(row.get("query") or ""))
    for row in heldout:
        if isinstance(row.get("truth_tools"), list) and row.get("iteration") in (first, last):
            group = groups.setdefault(tool_sequence(row["truth_tools"]), {"synthetic": [], "heldout": {}})
            group["heldout"].setdefault(row.get("task_id"), {})[row["iteration"]] = bool(row.get("success"))
    lines = []
    for sequence, group in sorted(groups.items(), key=lambda item: (-len(item[1]["heldout"]), item[0])):
        tasks = group["heldout"].values()
        solved = lambda at: sum(1 for by in tasks if by.get(at)) if at is not None else 0  # noqa: E731
        lines.append("<tr>" + _cell(sequence) + _cell(len(group["synthetic"]))
                     + _cell(group["synthetic"][0][:200] if group["synthetic"] else "") + _cell(len(tasks))
                     + _cell(f"{solved(first)} -> {solved(last)}" if tasks else "") + "</tr>")
    head = ("tool sequence", "synthesized (accepted)", "example query", "held-out tasks",
            f"held-out solved, iteration {first} -> {last}")
    return ('<table id="coverage"><thead><tr>' + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"
            + "".join(lines) + "</tbody></table>")


def render(directory: str | Path, warnings: list[str] | None = None) -> str:
    """The page; what could not be read is listed at its top (and collected in `warnings`)."""
    directory = Path(directory)
    warnings = [] if warnings is None else warnings
    metrics = checked_metrics(directory / "metrics.jsonl", warnings)
    lineage = checked_lineage(directory / "synthesis.jsonl", warnings)
    heldout = checked_heldout(directory / "heldout.jsonl", warnings)
    try:
        summary = json.loads(_text(directory / "summary.json", warnings) or "{}")
    except ValueError:
        summary = {}
        warnings.append("summary.json: not JSON; left out")
    if not isinstance(summary, dict):
        summary = {}
        warnings.append("summary.json: not a JSON object; left out")
    config = _text(directory / "config.yaml", warnings)
    labels = [m["iteration"] for m in metrics]
    by_calls = sorted({calls for m in metrics if isinstance(m.get("heldout_by_calls"), dict)
                       for calls in m["heldout_by_calls"]}, key=lambda calls: (len(calls), calls))
    by_tools = sorted({part for m in metrics if isinstance(m.get("heldout_by_tools"), dict)
                       for part in m["heldout_by_tools"]}, key=lambda part: (len(part), part))
    kinds = ("forgetting", "boundary", "rare")
    parents = {shown(r.get("parent_task_id")) for r in lineage if r.get("parent_task_id")}
    phases = ("train", "signals", "synthesis", "eval")
    plots = [
        line_plot("Success rate", labels, {
            "train rollouts": [m.get("train_success") for m in metrics],
            "held-out": [m.get("heldout_success") for m in metrics]}, top=1.0),
        stacked_bars("Signals raised", labels, {k: [m.get("signals", {}).get(k, 0) for m in metrics] for k in kinds}),
        *([line_plot("Held-out success by ground-truth calls", labels, {
            f"{calls}-call": [m.get("heldout_by_calls", {}).get(calls) for m in metrics] for calls in by_calls},
            top=1.0)] if len(by_calls) > 1 else []),
        *([line_plot("Held-out success by tools seen in D_0", labels, {
            f"{part} tools": [m.get("heldout_by_tools", {}).get(part) for m in metrics] for part in by_tools},
            top=1.0)] if len(by_tools) > 1 else []),
        stacked_bars("Pool D_t by source", labels, {
            source: [m.get("pool", {}).get(source, 0) for m in metrics] for source in ("seed", "synthetic")}),
        *([stacked_bars("Guided rollouts (grpo.guidance)", labels, {
            "guided": [m.get("guided", 0) for m in metrics]})] if any(m.get("guided") for m in metrics) else []),
        *([stacked_bars("Synthesized tasks calling a tool D_0 never calls", labels, {
            "one call": [m.get("new_tool_tasks", {}).get("one_call", 0) for m in metrics],
            "longer": [m.get("new_tool_tasks", {}).get("admitted", 0) - m.get("new_tool_tasks", {}).get("one_call", 0)
                       for m in metrics]})] if any(m.get("new_tool_tasks", {}).get("admitted") for m in metrics)
          else []),
        stacked_bars("Rollouts failed outside the agent", labels, {
            cause: [m.get("failures", {}).get(cause, 0) for m in metrics] for cause in ("backend", "environment")}),
        stacked_bars("Wall seconds by phase", labels, {
            phase: [m.get("seconds", {}).get(phase, 0.0) for m in metrics] for phase in phases}),
    ]
    shares = ", ".join(f"{m['iteration']}: {m.get('feedback_share', 0):.1%}" for m in metrics if m["iteration"])
    # Only dicts of numbers reach here (checked_metrics): a malformed field was left out with its warning.
    facts = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(_fact(k, v))}</td></tr>"
                    for k, v in summary.items())
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>coevolve run {html.escape(directory.name)}"
            f"</title><style>{_STYLE}</style></head><body>"
            f"<h1>coevolve run <code>{html.escape(str(directory))}</code></h1>"
            f"{''.join(f'<p class=warning>warning: {html.escape(w)}</p>' for w in warnings)}"
            f"<table class='summary'>{facts}</table>"
            f"<h2>Iterations</h2><div class='plots'>{''.join(plots)}</div>"
            f"<p>Feedback share of wall time per iteration: {html.escape(shares) or '-'}</p>"
            f"<h2>Signals and action patterns per iteration</h2>{signals_table(metrics)}"
            f"<h2>Held-out tasks training fixed and broke</h2>{changes_table(heldout)}"
            f"<h2>Synthesized tasks beside the held-out tasks</h2>{coverage_table(lineage, heldout)}"
            f"<h2>Synthesized tasks and their lineage</h2>{lineage_table(lineage)}"
            f"<h2>The flagged tasks' rollouts, per iteration</h2>"
            f"{parent_rollouts_table(lineage, rollout_rows(directory, parents, warnings))}"
            f"<h2>Resolved config</h2><pre>{html.escape(config)}</pre>"
            f"<script>{_SCRIPT}</script></body></html>")


def _number(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def _fact(key: str, value: Any) -> str:
    """A summary value as a reader wants it: text as itself, shares as percentages, mappings as `key: value`."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float):
        return f"{value:.1%}" if key.endswith("share") else f"{value:.4g}"
    if isinstance(value, int) and not is_number(value):
        return shown(value)
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_fact(str(k), v)}" for k, v in value.items()) or "-"
    if isinstance(value, list):
        return ", ".join(_fact(key, v) for v in value) or "-"
    return shown(value)


def write_report(directory: str | Path) -> Path:
    """Write DIR/report.html (atomically) and return its path."""
    directory = Path(directory)
    if not (directory / "metrics.jsonl").exists():
        raise FileNotFoundError(f"{directory} has no metrics.jsonl: not a coevolve run directory")
    if not readable(directory / "metrics.jsonl", []):
        raise FileNotFoundError(f"{directory}/metrics.jsonl is not a regular file: not a coevolve run directory")
    target = directory / "report.html"
    if target.is_symlink() or (target.exists() and not target.is_file()):
        raise FileNotFoundError(f"{target} is not a regular file; move it away and run the report again")
    warnings: list[str] = []
    try:
        atomic_write_text(target, render(directory, warnings))
    except OSError as error:
        raise FileNotFoundError(f"cannot write {target}: {error.strerror or error}") from None
    for warning in warnings:
        print(f"coevolve report: warning: {warning}", file=sys.stderr)
    return target
