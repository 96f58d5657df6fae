"""This machine's matrix throughput for a model's shapes, and the seconds a generation's forward passes need at it.

The roofline of a path is the time its forward passes would take if every matrix product ran at the throughput
this machine reaches for a product of that shape (measured here, not taken from a data sheet):

- `measure(model, dtype)`: `torch.nn.functional.linear` timed for each distinct weight shape of the model's
  linear layers (and its LM head), at M = 1, 4, 16, 64, 256, 1024 rows; the throughput at M is the FLOPs of one
  product per shape, summed over the model's layers, divided by their summed seconds (best of `repeats`);
- `Counter`: wraps a backend's `_forward` and records every call's (rows, new tokens, past length);
- `seconds(calls)`: per forward call, 2 x M x (linear weights) FLOPs at the throughput for M = rows x new tokens
  (interpolated between the measured M, log-linear), the LM head at M = rows (only the last position is scored
  when generating), and attention's 4 x rows x new x (past + new) x hidden x layers FLOPs at the best measured
  throughput. What it leaves out (norms, activations, sampling, the cache's copies, Python) is what a path
  spends above its roofline.

Two figures come from it: the roofline at the shapes a path ran (small-batch decoding included: at M = 16 this
CPU reaches less than half of its large-M throughput), and the large-M figure (every product at the best M).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

ROWS = (1, 4, 16, 64, 256, 1024)


@dataclass
class Roofline:
    dtype: str
    throughput: dict[int, float]
    """M -> FLOP/s of the model's linear shapes at M rows."""
    linear_weights: int
    """Weights of the linear layers run for every token (the decoder layers)."""
    head_weights: int
    hidden: int
    layers: int

    @property
    def best(self) -> float:
        return max(self.throughput.values())

    def at(self, rows: int) -> float:
        """Throughput at `rows` rows, log-linear between the measured points (flat outside them)."""
        points = sorted(self.throughput)
        if rows <= points[0]:
            return self.throughput[points[0]]
        for low, high in zip(points, points[1:]):
            if rows <= high:
                share = (math.log(rows) - math.log(low)) / (math.log(high) - math.log(low))
                return self.throughput[low] + share * (self.throughput[high] - self.throughput[low])
        return self.throughput[points[-1]]

    def seconds(self, calls: list[tuple[int, int, int]], best_only: bool = False) -> float:
        total = 0.0
        for rows, new, past in calls:
            tokens = rows * new
            speed = self.best if best_only else self.at(tokens)
            head_speed = self.best if best_only else self.at(rows)
            total += 2 * tokens * self.linear_weights / speed + 2 * rows * self.head_weights / head_speed
            total += 4 * rows * new * (past + new) * self.hidden * self.layers / self.best
        return total

    def flat_seconds(self, tokens: int) -> float:
        """Every token's linear FLOPs (head included) at the best throughput: a bound for paths whose forward
        calls are not counted (TRL's), given how many tokens they ran through the model."""
        return 2 * tokens * (self.linear_weights + self.head_weights) / self.best


def measure(model: Any, dtype: Any, repeats: int = 5) -> Roofline:
    import torch

    shapes: dict[tuple[int, int], int] = {}
    head = model.get_output_embeddings()
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module is not head:
            key = tuple(module.weight.shape)
            shapes[key] = shapes.get(key, 0) + 1
    head_shape = tuple(head.weight.shape)
    throughput = {}
    for rows in ROWS:
        flops = seconds = 0.0
        for (out_features, in_features), count in list(shapes.items()) + [(head_shape, 1)]:
            weight = torch.randn(out_features, in_features, dtype=dtype)
            x = torch.randn(rows, in_features, dtype=dtype)
            torch.nn.functional.linear(x, weight)  # warm-up
            best = float("inf")
            for _ in range(repeats):
                started = time.perf_counter()
                torch.nn.functional.linear(x, weight)
                best = min(best, time.perf_counter() - started)
            flops += 2 * rows * in_features * out_features * count
            seconds += best * count
        throughput[rows] = flops / seconds
    linear = sum(o * i * c for (o, i), c in shapes.items())
    config = model.config
    return Roofline(str(dtype).replace("torch.", ""), throughput, linear, head_shape[0] * head_shape[1],
                    config.hidden_size, config.num_hidden_layers)


@dataclass
class Counter:
    """Records (rows, new tokens, past length) of every forward pass a `TransformersBackend` makes."""

    backend: Any
    calls: list[tuple[int, int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        original = self.backend._forward

        def counted(input_ids, cache, attention_mask=None, position_ids=None):
            past = cache.get_seq_length() if cache is not None else 0
            self.calls.append((int(input_ids.shape[0]), int(input_ids.shape[1]), int(past)))
            return original(input_ids, cache, attention_mask=attention_mask, position_ids=position_ids)

        self.backend._forward = counted

    def take(self) -> list[tuple[int, int, int]]:
        calls, self.calls = self.calls, []
        return calls
