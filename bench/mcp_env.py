"""MCP servers as environments: calls per second through env `mcp` (in-process and stdio) against env `python` on
the same tools.

Question: env `mcp` sends each call through the official SDK's client to a server (`coevolve.envs.mcp_env`), with
the session on a shared event loop (`coevolve.envs.mcp_bridge`); env `python` sends it to the class in its worker
process. What does a call, and an episode with a fresh server, cost on each path?

Method: the board example's tools, as an MCP server (`examples/board/server.py`) and as a plain class
(`examples/board/board.py`, the same tools and answers: checked here, call by call). Every task's ground-truth
calls, `--rounds` times, each task an episode (`env.reset(task)` then `episode.act([call])` per call): the
episode's server (or instance) and reset are in the time. Then `--calls` calls of the read-only `list_cards()` in
one open episode: the cost of a call alone. stdio starts a server process per episode, so it gets fewer rounds.
Baseline: env `python` in the same process and run. Figures: calls/s and time ratios against it.

Last, `--group` episodes opened at once and a call in each, as a rollout opens its B x K episodes before the first
reply: stdio servers then start side by side.

Usage: `python bench/mcp_env.py [--rounds 5] [--calls 200] [--group 16] [--no-write]`; writes the `mcp_env`
section.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench._report import machine_line, write_section  # noqa: E402

TASKS = REPO / "examples" / "board" / "tasks.jsonl"


def episodes(env, rounds: int) -> tuple[float, int, list[str]]:
    """(seconds, calls, observations of the first round) for every task's ground truth, `rounds` times."""
    observations, calls = [], 0
    started = time.perf_counter()
    for round_index in range(rounds):
        for task in env.tasks():
            episode = env.reset(task)
            for text in (call for turn in task.ground_truth for call in turn):
                [step] = episode.act([text])
                calls += 1
                if round_index == 0:
                    observations.append(step.observation)
            del episode  # the episode's server (or instance) ends with it
    return time.perf_counter() - started, calls, observations


def opened_together(env, count: int) -> float:
    """Seconds to open `count` episodes, as a rollout does before its first reply, and make one call in each."""
    task = env.tasks()[0]
    started = time.perf_counter()
    opened = [env.reset(task) for _ in range(count)]
    for episode in opened:
        [step] = episode.act(["list_cards()"])
        assert step.error is None, step.error
    return time.perf_counter() - started


def one_episode(env, calls: int) -> float:
    episode = env.reset(env.tasks()[0])
    started = time.perf_counter()
    for _ in range(calls):
        episode.act(["list_cards()"])
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--group", type=int, default=16, help="episodes opened at once (a rollout's B x K)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    from coevolve.envs.mcp_env import MCPEnv
    from coevolve.envs.python_env import PythonEnv

    with tempfile.TemporaryDirectory() as folder:  # env python compares whole states: no per-task `checks` there
        plain = Path(folder) / "tasks.jsonl"
        rows = [{key: value for key, value in json.loads(line).items() if key != "checks"}
                for line in TASKS.read_text().splitlines()]
        plain.write_text("".join(json.dumps(row) + "\n" for row in rows))
        python = PythonEnv("examples.board.board:Board", tasks=str(plain))
        in_process = MCPEnv(server="examples.board.server:make_server", tasks=str(TASKS))
        stdio = MCPEnv(command=[sys.executable, "-m", "examples.board.server"], cwd=str(REPO), tasks=str(TASKS))
        stdio_rounds = max(1, args.rounds // 5)
        measured = {name: episodes(env, rounds) for name, env, rounds in
                    (("python", python, args.rounds), ("in-process", in_process, args.rounds),
                     ("stdio", stdio, stdio_rounds))}
        # The same tools must answer the same (errors aside, whose wording is each path's own).
        answers = {name: [text for text in result[2] if not text.startswith("Error")] for name, result in measured.items()}
        assert answers["python"] == answers["in-process"] == answers["stdio"], "the two boards answer differently"
        single = {name: one_episode(env, args.calls if name != "stdio" else max(20, args.calls // 5))
                  for name, env in (("python", python), ("in-process", in_process), ("stdio", stdio))}
        together = {name: opened_together(env, args.group)
                    for name, env in (("python", python), ("in-process", in_process), ("stdio", stdio))}
    single_calls = {"python": args.calls, "in-process": args.calls, "stdio": max(20, args.calls // 5)}
    base_rate = measured["python"][1] / measured["python"][0]
    base_single = single["python"] / single_calls["python"]
    labels = {"python": "env `python` (worker process; baseline)", "in-process": "env `mcp`, in-process server",
              "stdio": "env `mcp`, stdio server (a process per episode)"}
    lines = ["## MCP servers as environments: calls/s against env python (`bench/mcp_env.py`)", "",
             f"Command: `python bench/mcp_env.py --rounds {args.rounds} --calls {args.calls} --group {args.group}` "
             f"({machine_line()}): "
             f"the board example's {len(python.tasks())} ground-truth sequences, each task an episode with a fresh "
             f"server or instance ({args.rounds} rounds; stdio {stdio_rounds}); then `list_cards()` in one open "
             "episode. The answers of the three paths were checked equal.", "",
             "| path | episodes: calls | seconds | calls/s | time per call vs python | one session: ms per call "
             f"| vs python | {args.group} episodes opened at once + a call each: s | vs python |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in ("python", "in-process", "stdio"):
        seconds, calls, _ = measured[name]
        per_call = single[name] / single_calls[name]
        lines.append(f"| {labels[name]} | {calls} | {seconds:.2f} | {calls / seconds:,.0f} | "
                     f"{base_rate / (calls / seconds):.1f}x | {per_call * 1000:.2f} | {per_call / base_single:.1f}x | "
                     f"{together[name]:.2f} | {together[name] / together['python']:.1f}x |")
    lines += ["", "An episode on env `mcp` pays for a fresh server (the SDK's `MCPServer()` builds a pydantic model "
              "per tool) and its session; a call pays the SDK's request path and, for a sync tool, a hop to a worker "
              "thread. A rollout step makes prompts_per_step x group_size episodes: compare with the seconds a step "
              "spends generating (BENCHMARKS.md, step time)."]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section("mcp_env", text)


if __name__ == "__main__":
    main()
