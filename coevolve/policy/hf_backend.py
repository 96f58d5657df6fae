"""The transformers generation backend (CPU or GPU): batched sampling with a shared prefill.

Why not `model.generate`: GRPO samples K replies per prompt, and on the CPU the repeated prefill of a long prompt
dominates (8 copies of a 900-token prompt: ~25 s, against ~4 s when prefilled once). This backend prefills in
three stages over one KV cache:

1. the longest prefix common to every prompt of the call (the system prompt, tool list and demonstrations that
   all tasks share) is run once, on a batch of one;
2. the cache is repeated for each *distinct* prompt and the distinct suffixes are run as one batch, padded in the
   middle (between the shared prefix and the suffix) with an attention mask that hides the padding and position
   ids that skip it, so every row sees exactly its own prompt at its own positions;
3. the cache rows are copied to the requests (the K samples of a prompt share its row) and decoding proceeds
   token by token over all requests; a request leaves the batch (its cache row is dropped) when it samples a
   stop token or reaches its token budget.

Sampling: temperature, top-k, top-p, or greedy at temperature 0; one `torch.Generator` per call, seeded from
`SamplingConfig.seed` when given. Logprobs are `log_softmax(logits / temperature)` of the chosen token (see
`coevolve.policy.backends`). `share_prefill=False` runs every request's whole prompt as its own row (the baseline
the rollout benchmark compares against, and the reference the tests check stage 1-3 against).
"""

from __future__ import annotations

from typing import Any, Sequence

from coevolve.policy.backends import Generation, SamplingConfig


def common_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """Length of the longest prefix shared by all sequences."""
    if not sequences:
        return 0
    first = sequences[0]
    limit = min(len(s) for s in sequences)
    for position in range(limit):
        token = first[position]
        if any(s[position] != token for s in sequences):
            return position
    return limit


def cache_keyword(model: Any) -> str:
    """The forward keyword that takes a key/value cache: `cache` since transformers renamed `past_key_values`
    (after 5.20; our CPU pin 5.24 has `cache`, the GPU hosts' 5.20.2, which vLLM 0.33 requires, has the old
    name). Passed under the wrong name, the cache reaches the attention layers but not the mask, which then
    covers the new tokens only."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft wrapper
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def _filter_logits(logits: Any, top_k: int, top_p: float) -> Any:
    import torch

    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative - torch.softmax(sorted_logits, dim=-1) > top_p  # keep the token that crosses p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


class TransformersBackend:
    """Token backend over a loaded `transformers` causal LM (see the module docstring)."""

    def __init__(self, model: Any, tokenizer: Any, share_prefill: bool = True) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.share_prefill = share_prefill
        self.cache_keyword = cache_keyword(model)
        self.prefill_tokens = 0
        """Prompt tokens actually run through the model (a counter the benchmark reads)."""

    @property
    def device(self) -> Any:
        return next(self.model.parameters()).device

    def _forward(self, input_ids: Any, cache: Any, attention_mask: Any = None, position_ids: Any = None) -> Any:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=True, logits_to_keep=1, **{self.cache_keyword: cache})
        return out.logits[:, -1, :]

    def _prefill(self, prompts: Sequence[Sequence[int]]) -> tuple[Any, Any, Any]:
        """Run the prompts; return (cache, last-position logits, attention mask), one row per prompt."""
        import torch
        from transformers import DynamicCache

        device = self.device
        if self.share_prefill:
            distinct: dict[tuple[int, ...], int] = {}
            row_of = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
            unique = list(distinct)
            # Keep at least one suffix token per prompt: its logits start the sampling.
            prefix_length = min(common_prefix_length(unique), min(len(p) for p in unique) - 1)
        else:
            row_of, unique, prefix_length = list(range(len(prompts))), [tuple(p) for p in prompts], 0
        cache = DynamicCache(config=self.model.config)
        if prefix_length > 0:
            self._forward(torch.tensor([unique[0][:prefix_length]], device=device), cache)
            cache.batch_repeat_interleave(len(unique))
        suffixes = [u[prefix_length:] for u in unique]
        width = max(len(s) for s in suffixes)
        pad = self.tokenizer.pad_token_id or 0
        input_ids = torch.full((len(unique), width), pad, dtype=torch.long, device=device)
        mask = torch.zeros((len(unique), prefix_length + width), dtype=torch.long, device=device)
        mask[:, :prefix_length] = 1
        for row, suffix in enumerate(suffixes):
            input_ids[row, width - len(suffix):] = torch.tensor(suffix, device=device)
            mask[row, prefix_length + width - len(suffix):] = 1
        # Positions skip the padding: each real token sits where it would without padding.
        positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)[:, prefix_length:]
        logits = self._forward(input_ids, cache, attention_mask=mask, position_ids=positions)
        self.prefill_tokens += prefix_length + sum(len(s) for s in suffixes)
        index = torch.tensor(row_of, device=device)
        if len(unique) != len(prompts) or row_of != list(range(len(prompts))):
            cache.batch_select_indices(index)
        return cache, logits[index], mask[index]

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig, stop_token_ids: Sequence[int],
                 budgets: Sequence[int] | None = None) -> list[Generation]:
        import torch

        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        limits = [max(1, min(b, sampling.max_new_tokens)) for b in (budgets or [sampling.max_new_tokens] * len(prompts))]
        with torch.inference_mode():
            return self._generate(prompts, sampling, stop_token_ids, limits)

    def _generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig,
                  stop_token_ids: Sequence[int], limits: list[int]) -> list[Generation]:
        import torch

        device = self.device
        generator = None
        if sampling.seed is not None:
            generator = torch.Generator(device=device)
            generator.manual_seed(sampling.seed)
        cache, logits, mask = self._prefill(prompts)
        stops = torch.tensor(sorted(set(stop_token_ids)) or [-1], device=device)
        positions = mask.sum(dim=-1)  # next position id of each row
        rows = list(range(len(prompts)))  # request index of each live cache row
        row_limits = torch.tensor(limits, device=device)  # token budget of each live cache row
        tokens: list[list[int]] = [[] for _ in prompts]
        logps: list[list[float]] = [[] for _ in prompts]
        finish = ["length"] * len(prompts)
        for step in range(max(limits)):
            scaled = logits.float() / sampling.temperature if sampling.temperature > 0 else logits.float()
            log_probs = torch.log_softmax(scaled, dim=-1)
            if sampling.temperature > 0:
                if sampling.top_k or sampling.top_p < 1.0:
                    probs = torch.softmax(_filter_logits(scaled, sampling.top_k, sampling.top_p), dim=-1)
                else:  # the untruncated distribution: reuse the log-softmax already computed
                    probs = log_probs.exp()
                chosen = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
            else:
                chosen = scaled.argmax(dim=-1)
            chosen_logps = log_probs.gather(-1, chosen[:, None]).squeeze(-1)
            for row, token, logp in zip(rows, chosen.tolist(), chosen_logps.tolist()):
                tokens[row].append(token)
                logps[row].append(logp)
            stopped = torch.isin(chosen, stops)
            for live, is_stopped in enumerate(stopped.tolist()):
                if is_stopped:
                    finish[rows[live]] = "stop"
            # A row also leaves when its own budget is spent (finish stays "length"); every live row has
            # sampled step + 1 tokens so far.
            leaving = stopped | (row_limits <= step + 1)
            if bool(leaving.all()):
                break
            if bool(leaving.any()):
                keep = (~leaving).nonzero().squeeze(-1)
                cache.batch_select_indices(keep)
                mask, positions, chosen, row_limits = mask[keep], positions[keep], chosen[keep], row_limits[keep]
                rows = [rows[i] for i in keep.tolist()]
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)
            logits = self._forward(chosen[:, None], cache, attention_mask=mask, position_ids=positions[:, None])
            positions = positions + 1
        stop_set = set(stop_token_ids)
        generations = []
        for row in range(len(prompts)):
            text_ids = tokens[row][:-1] if finish[row] == "stop" and tokens[row][-1] in stop_set else tokens[row]
            text = self.tokenizer.decode(text_ids, skip_special_tokens=True)
            generations.append(Generation(text, tuple(tokens[row]), tuple(logps[row]), finish[row]))
        return generations
