"""`coevolve report DIR`: the page is self-contained, escapes model output, and, rendered in headless Chromium
(Debian's `chromium`), shows the four plots and the lineage table, whose filter works."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from coevolve.report import line_plot, render, stacked_bars, write_report

REPO = Path(__file__).resolve().parent.parent


def _metric(iteration, train, heldout, boundary, synthetic, feedback_seconds):
    return {"iteration": iteration, "steps": None if iteration == 0 else [iteration, iteration],
            "train_success": train, "heldout_success": heldout,
            "signals": {"forgetting": 1, "boundary": boundary, "rare": 0},
            "synthesis": {"accepted": synthetic} if iteration else {}, "pool": {"seed": 10, "synthetic": synthetic,
                                                                               "total": 10 + synthetic},
            "failures": {"backend": 0, "environment": iteration},
            "seconds": {"train": 5.0, "signals": 0.1, "synthesis": feedback_seconds, "eval": 1.0},
            "feedback_share": feedback_seconds / (6.1 + feedback_seconds)}


@pytest.fixture()
def run_dir(tmp_path) -> Path:
    directory = tmp_path / "run"
    directory.mkdir()
    metrics = [_metric(0, None, 0.2, 0, 0, 0.0), _metric(1, 0.25, None, 3, 2, 0.4), _metric(2, 0.5, 0.3, 2, 5, 0.3)]
    (directory / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    lineage = [
        {"iteration": 1, "signal": "boundary", "parent_task_id": "p1", "trajectory_ids": ["p1-i1-s1-k0"],
         "episode_id": "e1", "query": "Show <script>alert('x')</script> please", "solution": ["cat(file_name='a')"],
         "accepted": True, "reasons": [], "task_id": "t1"},
        {"iteration": 2, "signal": "forgetting", "parent_task_id": "p2", "trajectory_ids": ["p2-i2-s2-k1"],
         "episode_id": "e2", "query": "List twice", "solution": ["ls()", "ls()"], "accepted": False,
         "reasons": ["redundant: call 2 changes nothing and repeats the answer of call 1"], "task_id": None},
    ]
    (directory / "synthesis.jsonl").write_text("".join(json.dumps(row) + "\n" for row in lineage))
    (directory / "summary.json").write_text(json.dumps({"mode": "coevolve", "steps": 2}))
    (directory / "config.yaml").write_text("run:\n  mode: coevolve\n")
    return directory


def test_the_page_is_self_contained_and_escapes_model_output(run_dir):
    page = render(run_dir)
    assert page.count('<figure class="plot"') == 5 and "Rollouts failed outside the agent" in page
    assert "<script>alert" not in page and "&lt;script&gt;alert" in page
    assert not re.search(r"(src|href)=['\"]?https?:", page)  # nothing fetched from anywhere
    assert page.count('<tr class="accepted">') == 1 and page.count('<tr class="rejected">') == 1
    assert "redundant: call 2" in page and "1: 6.2%, 2: 4.7%" in page


def test_plots_scale_to_their_data():
    bars = stacked_bars("t", [0, 1], {"a": [1.0, 2.0], "b": [1.0, 2.0]})
    heights = [float(h) for h in re.findall(r'height="([0-9.]+)" fill="[^"]+"><title>', bars)]
    assert heights[1] == pytest.approx(2 * heights[0])  # value 2 is twice as tall as value 1
    assert ">4<" in bars  # the axis top is the largest stack
    line = line_plot("t", [0, 1, 2], {"held-out": [0.5, None, 1.0]}, top=1.0)
    assert line.count("<circle") == 2  # a missing evaluation is a gap, not a zero


def test_cli_writes_the_report_and_refuses_a_non_run(run_dir, tmp_path):
    done = subprocess.run([sys.executable, "-m", "coevolve.cli", "report", str(run_dir)], capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0 and (run_dir / "report.html").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    refused = subprocess.run([sys.executable, "-m", "coevolve.cli", "report", str(empty)], capture_output=True,
                             text=True, timeout=120, cwd=REPO)
    assert refused.returncode == 2 and "not a coevolve run directory" in refused.stderr


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (`make test` installs it as root)")
def test_headless_chromium_renders_the_plots_and_the_table(run_dir, tmp_path):
    report = write_report(run_dir)
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", f"--user-data-dir={tmp_path}"]
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", report.as_uri()], capture_output=True, text=True,
                         timeout=120).stdout
    assert dom.count("<svg") == 5 and dom.count("<polyline") == 2  # train and held-out lines...
    assert dom.count("<circle") == 4  # ...through 2 points each: iteration 0 has no train, 1 no held-out value
    # One bar per value > 0: signals 3 forgetting + 2 boundary, pool 3 seed + 2 synthetic, failures 2 (environment
    # in iterations 1 and 2), phases 3 + 3 + 2 + 3.
    assert dom.count("<rect") == 5 + 5 + 2 + 11
    assert dom.count("<tr class=") == 2 and "Synthesized tasks and their lineage" in dom
    # The filter works in the browser: click "accepted only", count the rows left visible.
    script = tmp_path / "click.html"
    script.write_text(report.read_text().replace(
        "</body>", "<script>var box = document.getElementById('only-accepted'); box.checked = true;"
                   "box.dispatchEvent(new Event('change'));</script></body>"))
    clicked = subprocess.run([CHROMIUM, *flags, "--dump-dom", script.as_uri()], capture_output=True, text=True,
                             timeout=120).stdout
    assert '<span id="shown">1</span>' in clicked and 'style="display: none;"' in clicked
    shot = tmp_path / "report.png"
    subprocess.run([CHROMIUM, *flags, "--window-size=1200,1400", f"--screenshot={shot}", report.as_uri()],
                   capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 10_000  # a real picture, not a blank page


def test_the_report_says_which_held_out_tasks_training_fixed_and_which_it_broke(run_dir):
    rows = [{"iteration": 0, "task_id": "a", "name": "task-a", "success": False, "reason": "state differs",
             "calls": ["rm(file_name='x')"]},
            {"iteration": 0, "task_id": "b", "name": "task-b", "success": True, "reason": "", "calls": ["ls()"]},
            {"iteration": 0, "task_id": "c", "name": "task-c", "success": True, "reason": "", "calls": ["pwd()"]},
            {"iteration": 2, "task_id": "a", "name": "task-a", "success": True, "reason": "", "calls": ["cd(folder='x')"]},
            {"iteration": 2, "task_id": "b", "name": "task-b", "success": False, "reason": "no call", "calls": []},
            {"iteration": 2, "task_id": "c", "name": "task-c", "success": True, "reason": "", "calls": ["pwd()"]}]
    (run_dir / "heldout.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    page = render(run_dir)
    assert "From iteration 0 to 2: 1 held-out tasks fixed, 1 broken." in page
    assert page.count('<tr class="change-fixed">') == 1 and page.count('<tr class="change-broke">') == 1
    assert "rm(file_name=&#x27;x&#x27;)" in page and "(no call)" in page


def test_the_report_sets_synthesized_tasks_beside_held_out_ones_and_shows_parents_rollouts(run_dir):
    rows = [{"iteration": it, "task_id": task, "name": task, "success": ok, "truth_calls": len(tools),
             "truth_tools": tools, "reason": "", "calls": []}
            for it, task, tools, ok in ((0, "h1", ["cat"], False), (2, "h1", ["cat"], True),
                                        (0, "h2", ["cd", "mkdir"], False), (2, "h2", ["cd", "mkdir"], False))]
    (run_dir / "heldout.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    rollouts = [{"id": "p1-i1-s1-k0", "task_id": "p1", "iteration": 1, "score": 0.0, "reasons": ["state differs"],
                 "steps": [{"action": "cat(file_name='b')", "observation": "{\"error\": \"no such file\"}"}]},
                {"id": "zz-i1-s1-k0", "task_id": "zz", "iteration": 1, "score": 1.0, "steps": []}]
    (run_dir / "rollouts.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rollouts))
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    metrics[2]["patterns"] = {"1": {"total": 40, "distinct": 5, "rare": 2, "theta_percent": 7.5}}
    metrics[2]["heldout_by_calls"] = {"1": 0.5, "2": 0.0}
    metrics[0]["heldout_by_calls"] = {"1": 0.25, "2": 0.0}
    metrics[2]["heldout_by_tools"] = {"seen": 0.5, "unseen": 0.25}
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    page = render(run_dir)
    coverage = page.split('<table id="coverage">')[1].split("</table>")[0]
    # `cat`: one accepted synthetic task (lineage row 1) and one held-out task, solved 0 -> 1; `cd > mkdir`: held-out only
    assert "<tr><td>cat</td><td>1</td>" in coverage and "<td>0 -&gt; 1</td>" in coverage
    assert "<tr><td>cd &gt; mkdir</td><td>0</td><td></td><td>1</td><td>0 -&gt; 0</td>" in coverage
    parents = page.split('<table id="parent-rollouts">')[1].split("</table>")[0]
    assert 'id="task-p1"' in parents and "cat(file_name=&#x27;b&#x27;) -&gt; {&quot;error&quot;" in parents
    assert "zz-i1" not in parents  # not a flagged task
    assert 'href="#task-p1"' in page  # the lineage row links to it
    assert "1-grams: N 40, 5 distinct, 2 rare at θ 7.5%" in page
    assert "Held-out success by ground-truth calls" in page and "Held-out success by tools seen in D_0" in page


def test_the_report_reads_regular_files_only(run_dir, tmp_path):
    """A run file that is a link (to /etc/passwd), a FIFO, a folder or /dev/zero is left out with a warning: no
    hang, no traceback, nothing of the target in the page."""
    import os

    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0:SECRET-LINE\n")
    (run_dir / "config.yaml").unlink()
    (run_dir / "config.yaml").symlink_to(secret)
    (run_dir / "summary.json").unlink()
    os.mkfifo(run_dir / "summary.json")
    (run_dir / "heldout.jsonl").mkdir()
    (run_dir / "rollouts.jsonl").symlink_to("/dev/zero")
    warnings: list[str] = []
    page = render(run_dir, warnings)  # a FIFO would block a plain open(); /dev/zero would never end
    assert "SECRET-LINE" not in page
    assert "config.yaml: a link; left out" in " ".join(warnings) and "rollouts.jsonl: a link" in " ".join(warnings)
    assert "summary.json: not a regular file" in " ".join(warnings)
    assert "heldout.jsonl: not a regular file" in " ".join(warnings)


def test_odd_values_in_a_run_file_never_break_the_page_and_facts_read_as_text(run_dir):
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for value, line in zip(("x", None, [1, 2]), lines):
        line["patterns"] = {"1": {"total": 3, "distinct": 2, "rare": 1, "theta_percent": value}}
    lines[1]["patterns"]["1"]["theta_percent"] = None
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (run_dir / "summary.json").write_text(json.dumps({"mode": "coevolve", "pool": {"seed": 10, "synthetic": 5},
                                                      "feedback_share": 0.0009, "held-out success after": 0.55}))
    page = render(run_dir)
    assert "rare at θ -%" in page
    assert "<td>coevolve</td>" in page and "<td>seed: 10, synthetic: 5</td>" in page
    assert "<td>0.1%</td>" in page and "<td>0.55</td>" in page
    flat = stacked_bars("t", [0, 1], {"a": [0.0, 0.0]})
    assert "e-09" not in flat and "e-10" not in flat and ">1<" in flat  # an all-zero plot's axis runs to 1


HUGE = "1" + "0" * 5000


@pytest.mark.parametrize(("file", "edit"), [
    ("metrics.jsonl", lambda m: m[1].update(guided="yes")),
    ("metrics.jsonl", lambda m: m[1].update(new_tool_tasks=[1, 2])),
    ("metrics.jsonl", lambda m: m[1].update(new_tool_tasks={"admitted": "many", "one_call": 1})),
    ("rollouts.jsonl", lambda r: r.append({"task_id": ["a", "b"], "iteration": 1})),
    ("rollouts.jsonl", lambda r: r.extend([{"task_id": "t0", "iteration": "one"}, {"task_id": "t0", "iteration": 2}])),
    ("heldout.jsonl", lambda h: h.extend([{"iteration": 0, "task_id": "h", "calls": 5, "success": True},
                                          {"iteration": "2", "task_id": "h", "calls": [], "success": False},
                                          {"iteration": 2, "task_id": "h", "calls": 7, "success": False}])),
    ("metrics.jsonl", "huge"),
    ("synthesis.jsonl", "huge"),
])
def test_malformed_run_values_are_warnings_never_a_traceback(run_dir, capsys, file, edit):
    """Seven values that raised a traceback from `coevolve report` (exit 1): each is a warning now, exit 0."""
    from coevolve.cli import main

    path = run_dir / file
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    if file == "rollouts.jsonl":
        lineage = [json.loads(line) for line in (run_dir / "synthesis.jsonl").read_text().splitlines()]
        lineage[0]["parent_task_id"] = "t0"
        (run_dir / "synthesis.jsonl").write_text("".join(json.dumps(row) + "\n" for row in lineage))
    if edit == "huge":  # a 5,000-digit integer: JSON holds it, Python's int() of its text refuses
        text = "".join(json.dumps(row) + "\n" for row in rows)
        path.write_text(text + f'{{"iteration": {HUGE}, "feedback_share": {HUGE}}}\n'
                        + f'{{"iteration": 1, "candidate_id": "c", "solution": ["ls()"], "query": {HUGE}}}\n')
    else:
        edit(rows)
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert main(["report", str(run_dir)]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and (run_dir / "report.html").is_file()


def test_a_report_html_that_is_a_folder_is_refused_in_one_line_and_leaves_no_temporary_file(run_dir, capsys):
    from coevolve.cli import main

    (run_dir / "report.html").mkdir()
    assert main(["report", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "report.html is not a regular file" in err
    assert not [path for path in run_dir.iterdir() if path.name.endswith(".tmp")]
