"""Decoding over one shared prompt prefix held once: attention split at the prefix and merged by log-sum-exp.

Every request of a rollout or a held-out pass opens with the same tokens (system message, tool list, worked
examples: ~470 tokens on the shipped configs). The plain engine lays that prefix's keys and values into every row
of the batch cache, so a decode step reads rows x prefix keys and values per layer, and each call first copies the
prefix into every row. On the CPU that memory traffic is most of a step: a decode step of 128 rows costs ~1.6x
more at 512 tokens of context than at 16, and the prefill of 128 such rows mostly copies (bench/decode_levers.py).

Here the prefix's keys and values are held once (`SharedPrefix`, batch 1) and each row's cache holds only what
follows it. Attention of a query over [prefix ; row] is computed in two parts (the split of Hydragen, Juravsky et
al. 2024, and FlashInfer's cascade attention):
  A. every query of every row against the one prefix: one matrix product per key/value head, no mask (every
     query sits after the whole prefix);
  B. each row's queries against its own keys and values, under transformers' mask (padding, causality);
and the two softmaxes are merged exactly: with lse_X the log-sum-exp of part X's scores and o_X its softmax-weighted
values, lse = logaddexp(lse_A, lse_B) and o = exp(lse_A - lse) o_A + exp(lse_B - lse) o_B. The same numbers as one
softmax over the concatenation, up to float rounding (tested against sdpa on the whole context).

It runs as a transformers attention function (`AttentionInterface`) registered under `ATTENTION_NAME`, with
sdpa's mask; `shared_prefix_attention(model)` selects it for the calls inside the block and restores the model's own
implementation after, and the prefix reaches every layer as the forward keyword `shared_prefix`. Only for models
whose attention is `sdpa` or `eager` and whose cache layers are plain (`usable`); elsewhere the backend lays the
prefix into every row as before.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

ATTENTION_NAME = "coevolve_shared_prefix"
"""The key under which the split attention and its mask are registered in transformers' interfaces."""

_REGISTERED = False


@dataclass(frozen=True)
class SharedPrefix:
    """The tokens every request of a call starts with and, per layer, their (keys, values), each of shape
    (key_value_heads, len(tokens), head_dim): computed once, read by every row."""

    tokens: tuple[int, ...]
    layers: tuple[tuple[Any, Any], ...]

    def covers(self, prompt: Sequence[int]) -> bool:
        """Whether `prompt` starts with these tokens and has at least one more (its logits start the sampling)."""
        return len(prompt) > len(self.tokens) and tuple(prompt[:len(self.tokens)]) == self.tokens


def split_attention(query: Any, key: Any, value: Any, mask: Any, prefix_keys: Any, prefix_values: Any,
                    scaling: float, fused: bool = True) -> Any:
    """Attention of `query` over [shared prefix ; each row's own keys], merged by log-sum-exp.

    query (rows, heads, queries, head_dim); key, value (rows, kv_heads, own, head_dim); prefix_keys/values
    (kv_heads, prefix, head_dim); mask: a boolean (rows, 1, queries, own) of the positions each query may see among
    its row's own keys (True = visible), or None for causal (the queries are the last `queries` of `own`). Heads
    share a key/value head in groups of heads // kv_heads, as transformers' `repeat_kv` lays them. Returns
    (rows, queries, heads, head_dim), what transformers' attention functions return. `fused`: on the CPU, each part
    runs in torch's flash kernel, which returns its log-sum-exp (`_attend`).
    """
    import torch

    rows, heads, queries, head_dim = query.shape
    kv_heads, own = key.shape[1], key.shape[2]
    group = heads // kv_heads
    # A: all rows' queries of a key/value head as the rows of one product against the prefix.
    grouped = query.reshape(rows, kv_heads, group * queries, head_dim)
    flat = grouped.transpose(0, 1).reshape(1, kv_heads, rows * group * queries, head_dim)
    out_prefix, lse_prefix = _attend(flat, prefix_keys[None], prefix_values[None], None, scaling, fused)
    out_prefix = out_prefix.reshape(kv_heads, rows, group * queries, head_dim).transpose(0, 1)
    lse_prefix = lse_prefix.reshape(kv_heads, rows, group * queries, 1).transpose(0, 1)
    # B: each row's queries (a key/value head's group of heads side by side) against its own keys, masked.
    if mask is None:
        mask = torch.ones((queries, own), dtype=torch.bool, device=query.device).tril(own - queries)
    elif mask.dtype != torch.bool:  # an additive float mask (eager's): visible where it adds nothing
        mask = mask == 0
    visible = mask.expand(rows, 1, queries, own)[:, :, None].expand(rows, 1, group, queries, own)
    additive = torch.zeros(visible.shape, dtype=query.dtype, device=query.device).masked_fill_(~visible, float("-inf"))
    out_own, lse_own = _attend(grouped, key, value, additive.reshape(rows, 1, group * queries, own), scaling, fused)
    lse_own = lse_own[..., None]
    # A query that sees none of its row's own keys (only a padding query: each real one sees itself) takes the
    # prefix part alone; the flash kernel gives such a query a log-sum-exp of 0, not -inf.
    lse_own = torch.where(visible.reshape(rows, 1, group * queries, own).any(-1, keepdim=True), lse_own,
                          torch.full_like(lse_own, float("-inf")))
    lse = torch.logaddexp(lse_prefix, lse_own)
    merged = out_prefix * torch.exp(lse_prefix - lse) + torch.nan_to_num(out_own) * torch.exp(lse_own - lse)
    return merged.to(query.dtype).reshape(rows, heads, queries, head_dim).transpose(1, 2).contiguous()


def _attend(query: Any, key: Any, value: Any, additive: Any, scaling: float, fused: bool) -> tuple[Any, Any]:
    """Softmax attention with one key/value head per query head; returns (output, log-sum-exp of the scores),
    the log-sum-exp without its last dimension. On the CPU torch's flash kernel returns both at once (the op sdpa
    itself runs there); elsewhere, or with `fused=False`, the same written out."""
    import torch

    flash = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if fused and flash is not None and query.device.type == "cpu" and query.dtype == torch.float32:
        return flash(query, key, value, attn_mask=additive, scale=scaling)
    dtype = query.dtype  # half precision is upcast: the softmax and its log-sum-exp in float32, as sdpa's kernels do
    query, key, value = query.float(), key.float(), value.float()
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if additive is not None:
        scores = scores + additive.float()
    peak = scores.amax(dim=-1, keepdim=True)
    peak = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))
    weights = torch.exp(scores - peak)
    total = weights.sum(dim=-1, keepdim=True)
    output = torch.matmul(weights, value) / total.clamp(min=torch.finfo(total.dtype).tiny)
    return output.to(dtype), (peak + torch.log(total)).squeeze(-1)


def _attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, dropout: float = 0.0,
               scaling: float | None = None, shared_prefix: SharedPrefix | None = None, **kwargs: Any
               ) -> tuple[Any, None]:
    """The registered attention function: the split over `shared_prefix` where one is given, sdpa otherwise."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if shared_prefix is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    prefix_keys, prefix_values = shared_prefix.layers[module.layer_idx]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return split_attention(query, key, value, attention_mask, prefix_keys, prefix_values, scale), None


def _register() -> None:
    global _REGISTERED
    if _REGISTERED:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, _attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    _REGISTERED = True


def _config(model: Any) -> Any:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft wrapper
    return base.config


def usable(model: Any) -> bool:
    """Whether the split can stand in for the model's attention: sdpa or eager, one plain softmax over every
    visible key (no soft-capping or chunked attention). Sliding windows are refused by the caller, whose cache
    layers must be plain ones (`hf_backend.keepable`)."""
    config = _config(model)
    if getattr(config, "_attn_implementation", None) not in ("sdpa", "eager"):
        return False
    return not any(getattr(config, name, None) for name in ("attn_logit_softcapping", "attention_chunk_size"))


@contextlib.contextmanager
def shared_prefix_attention(model: Any) -> Iterator[None]:
    """Select the split attention for the forward calls inside the block (they pass `shared_prefix=`); the
    model's own implementation is restored after, even on an error."""
    _register()
    config = _config(model)
    own = config._attn_implementation
    config._attn_implementation = ATTENTION_NAME
    try:
        yield
    finally:
        config._attn_implementation = own
