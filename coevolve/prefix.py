"""Shared-prompt scoring: the GRPO loss's forward and backward pass over a prompt prefix once per micro-batch.

A GRPO micro-batch is K trajectories of each of a few tasks, and every prompt opens with the same tokens (system
message, tool list, worked examples); only the task's own question, the completions and the env's answers differ.
TRL scores each row from its first token, so on the CPU quickstart (~430-token prompts, ~20-token replies) over
90% of a step's forward and backward work is the same prompt prefix, computed 8 times. Here the longest prefix
common to every row of the micro-batch runs once (batch of one, with gradients, its key/value cache kept); the
cache is repeated for each row and the rows' remaining tokens run on top of it through TRL's own fused LM head
(same temperature, same log-probability and entropy kernels).

The result is the same function of the weights, not an approximation: the prefix's keys and values are the ones
each row would compute (causal attention: a position never sees what follows it), and their gradient is the sum of
the rows' gradients, which is what the per-row forward accumulates. Positions are the rows' own (no left-padding
offset: RoPE attention depends on relative positions only, so TRL's padded positions score the same). Tests check
log-probabilities, entropies and gradients against TRL's path on a tiny model.

Across the micro-batches of one optimizer step (`StepPrefix`, `grpo.shared_step_prefix`): every group's prompt
opens with the same system message, tool list and worked examples (~470 of the quickstart's ~500 prompt tokens),
so that part runs once per step instead of once per micro-batch. Its keys and values are computed with gradients
on the first micro-batch that needs them and handed to each micro-batch as leaves (detached copies that collect
their gradient); each micro-batch runs its group's own prompt tail and its rows on top and back-propagates into
the leaves; after the step's last micro-batch, one backward pass carries the leaves' summed gradient into the
weights, before the optimizer step. Exact as above: the weights' gradient is the same sum, in another order.

It applies when the micro-batch is text-only, the model is a causal LM that takes a `cache`, training runs in one
process without gradient checkpointing (which turns the cache off), and the shared prefix is long enough to be
worth a second forward call (`MIN_SHARED_TOKENS`); otherwise TRL's path runs unchanged. Not in the paper: an
implementation detail of the loss computation.
"""

from __future__ import annotations

from typing import Any

import torch

from coevolve.policy.hf_backend import cache_holding, cache_keyword, common_prefix_length

MIN_SHARED_TOKENS = 32
"""Below this, one extra forward call costs more than the shared tokens save."""


def shared_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int) -> int:
    """Tokens every row's (left-padded) prompt starts with, leaving each row at least its last prompt token (the
    position whose output scores the first completion token)."""
    starts = (attention_mask[:, :prompt_width] == 0).sum(dim=1)  # left padding per row
    return common_prefix_length([input_ids[row, int(start):prompt_width - 1].tolist()
                                 for row, start in enumerate(starts)])


def _prefix_cache(model: Any, prefix: torch.Tensor, autocast: Any) -> Any:
    """The key/value cache of `prefix` (a batch of one), with its autograd graph when gradients are on."""
    with autocast():
        outputs = model(input_ids=prefix, attention_mask=torch.ones_like(prefix), use_cache=True, logits_to_keep=1)
    cache = getattr(outputs, "cache", None) or getattr(outputs, "past_key_values", None)
    if cache is None:
        raise RuntimeError("the model returned no key/value cache for the shared prefix")
    return cache


class StepPrefix:
    """The prompt prefix every row of one generation batch shares, run once per optimizer step (module
    docstring). `keys_values` runs it on first use in a step and returns leaves; `backward` (after the step's last
    micro-batch) carries what the leaves collected into the weights and forgets the step's graph."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens
        self._graph: list[torch.Tensor] = []
        self._leaves: list[torch.Tensor] = []
        self._step: int | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    def keys_values(self, model: Any, autocast: Any, step: int) -> list[torch.Tensor]:
        """[keys, values] of every layer (batch of one) as leaves that collect gradient, computed once per `step`
        (a graph left from another step, e.g. by a loss that raised, is dropped: its weights are gone)."""
        if self._step != step or not self._leaves:
            cache = _prefix_cache(model, torch.tensor([self.tokens], device=model.device), autocast)
            self._graph = [tensor for layer in cache.layers for tensor in (layer.keys, layer.values)]
            self._leaves = [tensor.detach().requires_grad_(tensor.requires_grad) for tensor in self._graph]
            self._step = step
        return self._leaves

    def backward(self) -> None:
        """One backward pass of the prefix with the gradient its leaves collected over the step's micro-batches."""
        pairs = [(tensor, leaf.grad) for tensor, leaf in zip(self._graph, self._leaves)
                 if tensor.requires_grad and leaf.grad is not None]
        self._graph, self._leaves, self._step = [], [], None
        if pairs:
            torch.autograd.backward([tensor for tensor, _ in pairs], grad_tensors=[grad for _, grad in pairs])


def step_prefix_of(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> StepPrefix | None:
    """The `StepPrefix` of a generation batch's left-padded prompts, or None when it is under `MIN_SHARED_TOKENS`."""
    length = shared_prefix_length(prompt_ids, prompt_mask, prompt_ids.size(1))
    if length < MIN_SHARED_TOKENS:
        return None
    start = int((prompt_mask[0] == 0).sum())
    return StepPrefix(prompt_ids[0, start:start + length].tolist())


def shared_prefix_logps(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                        prefix_length: int, compute_entropy: bool, autocast: Any,
                        step_prefix: tuple[StepPrefix, int] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probabilities (and entropies) of the last `logits_to_keep` positions of each row, as TRL's
    `_get_per_token_logps_and_entropies` computes them for one chunk, with the first `prefix_length` real tokens
    of every row (identical across rows) computed once. `model` carries TRL's fused LM head. With `step_prefix`
    (the step's `StepPrefix` and the optimizer step), its tokens come from its leaves and only the rest of the
    `prefix_length` tokens run here, when the rows start with them."""
    rows, width = input_ids.shape
    prompt_width = width - logits_to_keep
    # TRL pads every completion to the generation batch's longest: columns where no row of this chunk has a token
    # left are not run, and score 0 as TRL's compact path scores padding.
    real = attention_mask[:, prompt_width:].any(dim=0).nonzero()
    trailing = logits_to_keep - (int(real[-1]) + 1 if real.numel() else 1)
    if trailing > 0:
        input_ids, attention_mask = input_ids[:, :width - trailing], attention_mask[:, :width - trailing]
        logits_to_keep -= trailing
    starts = (attention_mask[:, :prompt_width] == 0).sum(dim=1)
    first_start = int(starts[0])
    prefix = input_ids[:1, first_start:first_start + prefix_length]
    shared = step_prefix[0] if step_prefix is not None else None
    if shared is not None and (len(shared) > prefix_length or prefix[0, :len(shared)].tolist() != shared.tokens):
        shared = None  # not this batch's prefix: score the chunk on its own
    if shared is None:
        cache = _prefix_cache(model, prefix, autocast)  # what the rows attend to, with its autograd graph
    else:
        leaves = shared.keys_values(model, autocast, step_prefix[1])
        cache = cache_holding(model, list(zip(leaves[0::2], leaves[1::2])))  # the rows' copies, not the leaves
        if prefix_length > len(shared):  # the group's own prompt tail, once, on top of the step's prefix
            with autocast():
                model(input_ids=prefix[:, len(shared):], attention_mask=torch.ones_like(prefix), use_cache=True,
                      position_ids=torch.arange(len(shared), prefix_length, device=prefix.device)[None],
                      logits_to_keep=1, **{cache_keyword(model): cache})
    cache.batch_repeat_interleave(rows)

    # Each row after the prefix: the rest of its prompt, left-padded to a common width, then its completion.
    rest_lengths = (prompt_width - starts) - prefix_length
    rest_width = int(rest_lengths.max())
    suffix_width = rest_width + logits_to_keep
    suffix = input_ids.new_zeros(rows, suffix_width)
    suffix_mask = attention_mask.new_zeros(rows, suffix_width)
    for row in range(rows):
        length = int(rest_lengths[row])
        source = int(starts[row]) + prefix_length
        suffix[row, rest_width - length:rest_width] = input_ids[row, source:prompt_width]
        suffix_mask[row, rest_width - length:rest_width] = 1
    suffix[:, rest_width:] = input_ids[:, prompt_width:]
    suffix_mask[:, rest_width:] = attention_mask[:, prompt_width:]
    full_mask = torch.cat([attention_mask.new_ones(rows, prefix_length), suffix_mask], dim=1)
    # The rows' own positions: prefix_length + how many real tokens precede (pads repeat their neighbour's).
    position_ids = (full_mask.cumsum(dim=1) - 1).clamp(min=0)[:, prefix_length:]
    labels = suffix.masked_fill(suffix_mask == 0, -100)
    labels[:, :-logits_to_keep] = -100
    with autocast():
        outputs = model(input_ids=suffix, attention_mask=full_mask, position_ids=position_ids, labels=labels,
                        fused_lm_head=True, **{cache_keyword(model): cache})
    logps = outputs.log_probs[:, -logits_to_keep:]
    entropies = outputs.entropy[:, -logits_to_keep:] if compute_entropy else None
    if trailing > 0:
        logps = torch.nn.functional.pad(logps, (0, trailing))
        entropies = torch.nn.functional.pad(entropies, (0, trailing)) if entropies is not None else None
    return logps, entropies


def score_in_chunks(base: Any, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    logits_to_keep: int, batch_size: int, compute_entropy: bool, autocast: Any,
                    step_prefix: tuple[StepPrefix, int] | None) -> tuple[torch.Tensor, torch.Tensor | None, None]:
    """TRL's `_get_per_token_logps_and_entropies` (`base`) chunk by chunk, where a chunk's rows share at least
    `MIN_SHARED_TOKENS` prompt tokens through `shared_prefix_logps` (with the step's prefix, when given)."""
    logps, entropies = [], []
    for start in range(0, input_ids.size(0), batch_size):
        ids, mask = input_ids[start:start + batch_size], attention_mask[start:start + batch_size]
        shared = shared_prefix_length(ids, mask, ids.size(1) - logits_to_keep)
        if shared >= MIN_SHARED_TOKENS:
            chunk_logps, chunk_entropies = shared_prefix_logps(model, ids, mask, logits_to_keep, shared,
                                                               compute_entropy, autocast, step_prefix=step_prefix)
        else:
            chunk_logps, chunk_entropies, _ = base(model, ids, mask, logits_to_keep, compute_entropy=compute_entropy)
        logps.append(chunk_logps)
        entropies.append(chunk_entropies)
    return torch.cat(logps), (torch.cat(entropies) if compute_entropy else None), None


def flat_groups_last(advantages: Any, group_size: int) -> list[int]:
    """Row order for a generation batch laid out as consecutive groups of `group_size`: groups with a nonzero
    advantage first, then flat ones (every advantage zero), each group whole and in its original order."""
    rows = len(advantages)
    if group_size <= 0 or rows % group_size:
        return list(range(rows))
    starts = range(0, rows, group_size)
    flat = [not any(float(a) != 0.0 for a in advantages[start:start + group_size]) for start in starts]
    ordered = [start for start, is_flat in zip(starts, flat) if not is_flat]
    ordered += [start for start, is_flat in zip(starts, flat) if is_flat]
    return [row for start in ordered for row in range(start, start + group_size)]


def permuted(value: Any, order: list[int]) -> Any:
    """`value` (a per-row tensor or list of a generation batch) in `order`; scalars and None as they are (the
    same rule as TRL's `shuffle_sequence_dict`)."""
    if value is None or (hasattr(value, "ndim") and value.ndim == 0):
        return value
    if hasattr(value, "ndim"):
        return value[order]
    return [value[i] for i in order]


def zero_gradient_loss(model: Any) -> Any:
    """The loss of a micro-batch whose every advantage is zero, without a pass over the weights: each trainable
    weight with no gradient yet gets an exact zero one (what the surrogate's backward would give it; a gradient
    already there from an earlier micro-batch is left as it is, as adding zero would), and the returned zero is a
    leaf of its own, so the trainer's `backward()` runs and touches nothing else. The optimizer step then sees the
    same gradients (so AdamW's moments and weight decay move as they would). `sum((w * 0).sum() ...)` did the same
    through autograd at the cost of a product over every weight forward and another backward: on the quickstart,
    whose steps are often all flat, that was the whole loss time (BENCHMARKS.md "Where a step's seconds go")."""
    device = None
    for weight in model.parameters():
        if weight.requires_grad:
            device = weight.device
            if weight.grad is None:
                weight.grad = torch.zeros_like(weight)
    return torch.zeros((), device=device, requires_grad=True)
