"""Environment steps per second: our BFCL dispatch vs bfcl-eval's `execute_multi_turn_func_call`.

Question: how fast does an RL rollout step through the BFCL backends with our safe dispatch (ast parsing, fresh
instances per episode, name -> method dispatch) compared with the official executor (regex rewrite + `eval`,
instances cached in module globals)?

Both sides replay the same ground-truth call sequences of the four multi-turn categories, episode by episode:
- official: one `execute_multi_turn_func_call` per turn with a fresh model name per episode (as a trainer must,
  or episodes would share state), its globals cleared after the episode;
- ours: `BFCLEnv.reset(task)` (which also builds the shadow ground-truth instances used by scoring) and one
  `episode.act(calls)` per turn. Scoring (`end_turn`) is timed separately and not part of the ratio.
Figures are the best of `--repeats` interleaved rounds (each round times every path once), in one process. Usage: `python bench/env_step.py`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import machine_line, write_section  # noqa: E402
import coevolve.calls as calls_module  # noqa: E402
import coevolve.envs.bfcl as bfcl_module  # noqa: E402
from coevolve.envs.bfcl import CATEGORIES, BFCLEnv, load_tasks  # noqa: E402


def run_official(tasks, group_size: int, pass_index: int) -> int:
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    module_globals = vars(multi_turn_utils)
    calls = 0
    for index, task in enumerate(task for task in tasks for _ in range(group_size)):
        model_name = f"bench_{pass_index}_{index}"
        for turn in task.ground_truth:
            multi_turn_utils.execute_multi_turn_func_call(
                list(turn), task.initial_state, task.meta["involved_classes"], model_name, task.name,
                long_context=task.meta["long_context"],
            )
            calls += len(turn)
        for key in [key for key in module_globals if key.startswith(model_name)]:
            del module_globals[key]
    return calls


def run_ours(envs, tasks, group_size: int, score: bool) -> int:
    # Each pass starts cold: parses, instance snapshots and ground-truth traces are reused only within the pass
    # (across the K episodes of a group, as in training), never carried over from a previous pass.
    clear_memo = getattr(calls_module._parse_python_call_cached, "cache_clear", None)
    if clear_memo is not None:  # absent in the memo-off pass
        clear_memo()
    bfcl_module._INSTANCE_BLOBS.clear()
    for env in envs.values():
        env._truth_cache.clear()
    calls = 0
    for task in (task for task in tasks for _ in range(group_size)):
        episode = envs[task.meta["category"]].reset(task)
        for turn in task.ground_truth:
            if turn:
                episode.act(list(turn))
                calls += len(turn)
            if score:
                episode.end_turn()
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--group-size", type=int, default=4, help="episodes per task in a row, like a GRPO group")
    parser.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    args = parser.parse_args()

    tasks = [task for category in CATEGORIES for task in load_tasks(category)]
    envs = {category: BFCLEnv(category, scope="official") for category in CATEGORIES}
    group_size = args.group_size
    run_ours(envs, tasks[:5], 1, score=True)  # warm imports on both sides
    run_official(tasks[:5], 1, -1)

    cached_parse = calls_module._parse_python_call_cached

    def memo_off(pass_index: int) -> int:
        calls_module._parse_python_call_cached = cached_parse.__wrapped__  # the same parser with no memo
        try:
            return run_ours(envs, tasks, group_size, score=False)
        finally:
            calls_module._parse_python_call_cached = cached_parse

    paths = {
        "official": lambda i: run_official(tasks, group_size, i),
        "ours": lambda i: run_ours(envs, tasks, group_size, score=False),
        "memo_off": memo_off,
        "scored": lambda i: run_ours(envs, tasks, group_size, score=True),
    }
    # Interleaved rounds (A B C D A B C D ...), best of each: this VM's speed drifts by up to 2x with host load,
    # and interleaving exposes every path to the same drift.
    best = {name: float("inf") for name in paths}
    counts = {}
    hit_rate = 0.0
    for round_index in range(args.repeats):
        for name, function in paths.items():
            start = time.perf_counter()
            counts[name] = function(round_index)
            best[name] = min(best[name], time.perf_counter() - start)
            if name == "ours":
                info = cached_parse.cache_info()
                hit_rate = info.hits / max(1, info.hits + info.misses)
    official_s, ours_s, uncached_s, scored_s = best["official"], best["ours"], best["memo_off"], best["scored"]
    official_calls, our_calls = counts["official"], counts["ours"]
    assert official_calls == our_calls
    ratio = official_s / ours_s
    rows = [
        ("bfcl-eval `execute_multi_turn_func_call`", official_s, official_calls / official_s),
        ("coevolve `BFCLEnv` reset + act", ours_s, our_calls / ours_s),
        ("coevolve reset + act, parse memo off", uncached_s, our_calls / uncached_s),
        ("coevolve reset + act + end_turn (scoring)", scored_s, our_calls / scored_s),
    ]
    table = "\n".join(f"| {name} | {seconds:.2f} | {rate:,.0f} |" for name, seconds, rate in rows)
    markdown = f"""## Environment steps: our BFCL dispatch vs the official executor

Question: env steps per second when replaying the same ground-truth call sequences of all four BFCL-V3
multi-turn categories, {group_size} episodes per task in a row as in a GRPO group ({len(tasks)} tasks,
{len(tasks) * group_size} episodes, {our_calls} calls), fresh state per episode on both sides.

Command: `python bench/env_step.py` (best of {args.repeats} interleaved rounds, one process). Machine: {machine_line()}.

| path | seconds | steps/s |
|---|---:|---:|
{table}

**Ratio (ours / official, steps/s): {ratio:.2f}x** (goal >= 2x); {official_s / uncached_s:.2f}x with the parse memo
off. Every pass starts cold (parse memo, instance snapshots and ground-truth traces emptied); within a pass
{hit_rate:.0%} of the call strings repeat an earlier one (the K episodes of a task replay the same calls, and the
four categories share scenarios). Where the time goes: the official executor re-runs `inspect.getmembers` on
every instance and `eval`s each call; we load each task's scenario once and unpickle a snapshot of the loaded
instances for the other episodes, and parse to an AST with no bytecode. Both pay the same `json.dumps` of
results. Scoring (last row) replays each task's ground truth once per pass and runs the state/response checks
at every turn end; the official checker pays for that work separately. This VM's speed drifts with host load
(absolute steps/s moved up to 2x between runs), so read the ratio, measured in interleaved rounds, not the rates.
"""
    print(markdown)
    if not args.no_write:
        write_section("env_step", markdown)


if __name__ == "__main__":
    main()
