"""Helpers for training tests: tiny models saved as folders (TRL loads its policy and reference from a path), and a
tiny model taught, by a few seconds of supervised steps, to answer every prompt with one of a few replies at
chosen odds. A random tiny model never solves a task, so every GRPO group is all-zero and nothing trains; the
taught one solves `ls()` tasks about half the time, which gives the groups the reward variance GRPO learns from."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Sequence

LS_REPLIES = ("[ls()]", "[pwd()]")


def ls_tasks(count: int = 4):
    """BFCL-lite train tasks whose ground truth is a single `ls()`."""
    from coevolve.envs.bfcl_lite import BFCLLiteEnv

    tasks = [t for t in BFCLLiteEnv("train").tasks() if tuple(t.ground_truth[0]) == ("ls()",)]
    return tasks[:count]


def write_tasks(tasks, path: Path) -> Path:
    path.write_text("".join(task.to_json() + "\n" for task in tasks))
    return path


def save_model(model, tokenizer, path: Path) -> Path:
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path


def teach_replies(model, tokenizer, prompts: Sequence[Sequence[int]], replies: Sequence[str], stop_token: int,
                  steps: int = 120, learning_rate: float = 3e-3, seed: int = 0):
    """Supervised steps on (prompt, reply + stop) pairs, the reply drawn uniformly: the model learns to answer any
    of these prompts with each reply at about equal odds."""
    import torch

    rng = random.Random(seed)
    torch.manual_seed(seed)
    targets = [tokenizer(reply, add_special_tokens=False)["input_ids"] + [stop_token] for reply in replies]
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
    model.train()
    for _ in range(steps):
        batch = [(list(rng.choice(prompts)), rng.choice(targets)) for _ in range(4)]
        width = max(len(p) + len(t) for p, t in batch)
        input_ids = torch.full((len(batch), width), tokenizer.pad_token_id, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for row, (prompt, target) in enumerate(batch):
            sequence = prompt + target
            input_ids[row, : len(sequence)] = torch.tensor(sequence)
            labels[row, len(prompt): len(sequence)] = torch.tensor(target)
            attention[row, : len(sequence)] = 1
        # Project only the reply positions onto the vocabulary: the prompt is ~900 tokens, the reply ~6, and
        # full-vocabulary logits of every position would be most of the work.
        hidden = model.model(input_ids=input_ids, attention_mask=attention).last_hidden_state
        scored = labels[:, 1:] != -100
        logits = model.lm_head(hidden[:, :-1][scored])
        loss = torch.nn.functional.cross_entropy(logits, labels[:, 1:][scored])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    return model


def opening_prompts(tokenizer, tasks, reply_format: str = "python") -> list[list[int]]:
    from coevolve.envs.bfcl_lite import BFCLLiteEnv
    from coevolve.policy.chat import ChatRenderer

    env = BFCLLiteEnv("train")
    renderer = ChatRenderer(tokenizer, reply_format)
    prompts = []
    for task in tasks:
        episode = env.reset(task)
        messages = renderer.opening_messages(episode.tools(), episode.user_messages())
        prompts.append(renderer.prompt_ids(messages, episode.tools()))
    return prompts


def run_record(directory: Path) -> dict:
    """What a run directory says happened, without timings: metrics lines, every D_t, success histories, lineage,
    every process's rollouts (ids and scores) and samples, and the logged steps. Two runs that trained alike (an
    uninterrupted one and one killed and resumed) have equal records."""
    from coevolve.jsonl import read_jsonl
    from coevolve.pool import TaskPool

    metrics = [{k: v for k, v in m.items() if k not in ("seconds", "train_seconds", "feedback_share")}
               for m in read_jsonl(directory / "metrics.jsonl")]
    for m in metrics:
        m.get("synthesis", {}).pop("seconds", None)
    with TaskPool(directory / "pool.sqlite") as pool:
        versions = {t: sorted(task.id for task in pool.tasks_at(t)) for t in pool.iterations()}
        history = {task.id: pool.history(task.id) for task in pool.tasks_at(pool.latest_iteration())}
    return {"metrics": metrics, "versions": versions, "history": history,
            "lineage": [(r["iteration"], r["candidate_id"], r["accepted"]) for r in read_jsonl(directory / "synthesis.jsonl")],
            "rollouts": {path.name: [(r["id"], r["score"]) for r in read_jsonl(path)]
                         for path in sorted(directory.glob("rollouts*.jsonl"))},
            "samples": {path.name: read_jsonl(path) for path in sorted(directory.glob("samples*.jsonl"))},
            "steps": [m["step"] for m in read_jsonl(directory / "steps.jsonl")]}
