"""The offline quickstart, measured: wall time and held-out success before/after training, over several seeds.

Question: does `make quickstart` (the CoEvolve loop on BFCL-lite with the shipped SmolLM2-135M, configs/quickstart.yaml)
finish within 15 minutes on this 2-core machine, and is its held-out success after training above its zero-shot
success (iteration 0 of the same run: the same 40 held-out tasks, greedy), seed after seed?

Each seed is one `coevolve train` run in its own directory (run.seed=S changes the rollouts' sampling, the
exploration and the task order; the held-out set is fixed). `--fresh-clone` also times the first seed as a new
user meets it: `git clone` of this repository into a temporary folder, then `make quickstart` there, virtualenv
creation and pinned installs included.
Usage: `python bench/quickstart.py [--seeds 0 1 2] [--fresh-clone]`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import machine_line, write_section  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def read_run(directory: Path) -> dict:
    from coevolve.jsonl import read_jsonl

    metrics = read_jsonl(directory / "metrics.jsonl")
    summary = json.loads((directory / "summary.json").read_text())
    before = metrics[0]["heldout_success"]
    after = next(m["heldout_success"] for m in reversed(metrics) if m["heldout_success"] is not None)
    return {"before": before, "after": after, "added": summary["tasks_added"],
            "feedback_share": summary["feedback_share"], "steps": summary["steps"],
            "train_success": [m["train_success"] for m in metrics[1:]],
            "signals": [sum(m["signals"].values()) for m in metrics[1:]],
            "accepted": [m["synthesis"].get("accepted", 0) for m in metrics[1:]]}


def run_seed(seed: int, output: Path) -> dict:
    started = time.perf_counter()
    done = subprocess.run([str(REPO / ".venv" / "bin" / "coevolve"), "train", "--config",
                           str(REPO / "configs" / "quickstart.yaml"), "--output-dir", str(output), f"run.seed={seed}"],
                          cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"seed {seed} failed:\n{done.stderr[-3000:]}")
    return {"seed": seed, "seconds": time.perf_counter() - started, **read_run(output)}


def fresh_clone() -> dict:
    folder = Path(tempfile.mkdtemp(prefix="quickstart-"))
    try:
        subprocess.run(["git", "clone", "-q", str(REPO), str(folder / "repo")], check=True)
        started = time.perf_counter()
        done = subprocess.run(["make", "quickstart"], cwd=folder / "repo", capture_output=True, text=True,
                              env={k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"})
        seconds = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"make quickstart failed in a fresh clone:\n{done.stderr[-3000:]}")
        return {"seed": 0, "seconds": seconds, **read_run(folder / "repo" / "runs" / "quickstart")}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def config_line() -> str:
    import yaml

    config = yaml.safe_load((REPO / "configs" / "quickstart.yaml").read_text())
    run, grpo, loop = config["run"], config["grpo"], config["loop"]
    iterations = -(-run["max_steps"] // loop["steps_per_iteration"])
    return (f"SmolLM2-135M, {config['model']['tool_style']} tool list, {config['model']['demos']} worked examples "
            f"({config['model'].get('demo_choice', 'first-tool')}), "
            f"{run['max_steps']} GRPO steps of {grpo['prompts_per_step']} tasks x K={config['rollout']['group_size']} "
            f"in {iterations} iterations, lr {grpo['learning_rate']}, T={config['rollout']['temperature']}, "
            f"reward {grpo.get('reward', 'env')}, "
            f"{config['synthesis']['explorer']} explorer + {config['synthesis']['abstractor']} abstractor, "
            f"steering (coevolve.config.STEERING): {steering()}")


def steering() -> str:
    """The paper-faithful switches as the quickstart config sets them."""
    from coevolve.config import load_config, steering_of

    values = steering_of(load_config(REPO / "configs" / "quickstart.yaml"))
    return ", ".join(f"{key} {str(value).lower()}" for key, value in values.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--fresh-clone", action="store_true", help="time seed 0 as `make quickstart` in a new clone")
    parser.add_argument("--out", default=str(REPO / "runs" / "bench-quickstart"))
    args = parser.parse_args()
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    rows = []
    for seed in args.seeds:
        if seed == 0 and args.fresh_clone:
            row = {**fresh_clone(), "where": "fresh clone, `make quickstart` (setup included)"}
        else:
            row = {**run_seed(seed, out / f"seed-{seed}"), "where": "`coevolve train` (venv present)"}
        rows.append(row)
        print(row, flush=True)
    better = sum(r["after"] > r["before"] for r in rows)
    mean_before = sum(r["before"] for r in rows) / len(rows)
    mean_after = sum(r["after"] for r in rows) / len(rows)
    lines = [
        "## Quickstart: the CoEvolve loop on CPU, held-out success before and after (`bench/quickstart.py`)",
        "",
        "Question: does `make quickstart` finish within 15 minutes on this machine, and does the agent get better "
        "than its zero-shot self on the held-out split? Baseline: iteration 0 of the same run (the untrained "
        "policy, same prompt, same 40 held-out BFCL-lite tasks, greedy).",
        "",
        f"Command: `python bench/quickstart.py --seeds {' '.join(map(str, args.seeds))}"
        f"{' --fresh-clone' if args.fresh_clone else ''}`. Machine: {machine_line()}. Config: "
        f"`configs/quickstart.yaml` ({config_line()}).",
        "",
        "| seed | how it ran | wall seconds | held-out before | held-out after | after / before | synthetic tasks "
        "added | feedback share | train success per iteration |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = f"{r['after'] / r['before']:.2f}" if r["before"] else "-"
        lines.append(f"| {r['seed']} | {r['where']} | {r['seconds']:.0f} | {r['before']:.3f} | {r['after']:.3f} | "
                     f"{ratio} | {r['added']} | {r['feedback_share']:.2%} | "
                     f"{', '.join(f'{s:.2f}' for s in r['train_success'])} |")
    lines += ["", f"Held-out after > before in {better} of {len(rows)} seeds; mean {mean_before:.3f} -> "
              f"{mean_after:.3f}. 40 tasks: one task is 0.025, so differences of one or two tasks are noise."]
    write_section("quickstart", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
