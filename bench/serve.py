"""`coevolve serve` vs `transformers serve` on the same burst of chat requests, same model, same machine.

Question: should our small OpenAI-compatible server (one worker batching concurrent requests into one generate
call with a shared prefill) give way to transformers' own `transformers serve` (FastAPI/uvicorn, streaming, the
OpenAI schemas)? Measured: the wall seconds until every request of a burst is answered, requests/s, and how many
were answered at all.

Method: the shipped SmolLM2-135M (fp32, CPU); a burst of `--clients` concurrent chat requests (distinct questions,
`max_tokens` `--max-tokens`, temperature 1.0) through the `openai` client; one warm-up request first. Ours runs in
this process; `transformers serve` runs as a subprocess with the model preloaded. `transformers serve` needs
`transformers[serving]` (fastapi, uvicorn), which this project does not pin: give a folder holding them with
`--serving-path` (e.g. `pip install --target DIR fastapi uvicorn`); without it only ours is measured.

Usage: `python bench/serve.py [--clients 16] [--max-tokens 32] [--serving-path DIR] [--no-write]`; writes the
`serve` section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench._report import machine_line, write_section  # noqa: E402


def burst(base_url: str, model: str, clients: int, max_tokens: int) -> dict:
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="none", timeout=600, max_retries=0)
    ask = lambda index: client.chat.completions.create(  # noqa: E731
        model=model, messages=[{"role": "user", "content": f"Name a fact about the number {index}."}],
        max_tokens=max_tokens, temperature=1.0)
    ask(0)  # warm-up
    answered: list[int] = []

    def one(index: int) -> None:
        try:
            reply = ask(index)
            answered.append(reply.usage.completion_tokens if reply.usage else 0)
        except Exception:  # noqa: BLE001 - counted as unanswered
            pass

    threads = [threading.Thread(target=one, args=(index,)) for index in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "answered": len(answered), "tokens": sum(answered),
            "requests_per_s": len(answered) / seconds}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def theirs(model_dir: str, args: argparse.Namespace) -> dict:
    port = free_port()
    environment = {**os.environ, "PYTHONPATH": f"{args.serving_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [sys.executable, "-m", "transformers.cli.transformers", "serve", model_dir, "--port", str(port),
               "--device", "cpu"]
    process = subprocess.Popen(command, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if process.poll() is not None:
                    return {"error": (process.stderr.read() or "exited").strip().splitlines()[-1]}
                time.sleep(1)
        return burst(f"http://127.0.0.1:{port}/v1", model_dir, args.clients, args.max_tokens)
    finally:
        process.terminate()
        process.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--serving-path", default=None)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    from coevolve.policy.hf_backend import TransformersBackend
    from coevolve.policy.models import load_model, shipped_model_dir
    from coevolve.policy.serve import ChatServer

    model_dir = str(shipped_model_dir())
    model, tokenizer = load_model(model_dir, device="cpu")
    with ChatServer(TransformersBackend(model, tokenizer), model_name=model_dir) as server:
        ours = burst(server.base_url, model_dir, args.clients, args.max_tokens)
    del model
    rows = {"coevolve serve (baseline)": ours}
    if args.serving_path:
        rows["transformers serve"] = theirs(model_dir, args)
    lines = ["## `coevolve serve` vs `transformers serve`: one burst of chat requests (`bench/serve.py`)", "",
             f"Command: `python bench/serve.py --clients {args.clients} --max-tokens {args.max_tokens}"
             f"{' --serving-path DIR' if args.serving_path else ''}` ({machine_line()}); the shipped SmolLM2, fp32, "
             "CPU, temperature 1.0.", "",
             "| server | answered | wall seconds | requests/s | completion tokens | time ratio |", "|---|---|---|---|---|---|"]
    for name, row in rows.items():
        if "error" in row:
            lines.append(f"| {name} | failed to start: {row['error']} | | | | |")
            continue
        lines.append(f"| {name} | {row['answered']} of {args.clients} | {row['seconds']:.1f} | "
                     f"{row['requests_per_s']:.2f} | {row['tokens']} | {row['seconds'] / ours['seconds']:.2f} |")
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section("serve", text)


if __name__ == "__main__":
    main()
