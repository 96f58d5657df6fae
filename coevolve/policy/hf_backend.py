"""The transformers generation backend (CPU or GPU): batched sampling with a shared prefill, and each episode's
KV cache kept from one reply to the next.

Why not `model.generate`: GRPO samples K replies per prompt, and on the CPU the repeated prefill of a long prompt
dominates (8 copies of a 900-token prompt: ~25 s, against ~4 s when prefilled once). A generate call prefills in
three stages over one KV cache:

1. each distinct prompt's *past*: inside `episode_caches()` (the rollout engine opens one per rollout), the cache
   an earlier call of the same rollout left for a request whose tokens are a prefix of this prompt (the same
   episode's previous reply: the prompt then adds only the last sampled token, the tool results or user turn and
   the template around them); for the other prompts, the longest prefix common to all of them (the system prompt,
   tool list and demonstrations every task shares), run once on a batch of one;
2. the pasts are laid right-aligned into one batch cache and the rest of every distinct prompt is run as one
   batch, padded before each past and between past and rest, with an attention mask that hides the padding and
   position ids that skip it, so every row sees exactly its own tokens at their own positions;
3. the cache rows are copied to the requests (the K samples of a prompt share its row) and decoding proceeds
   token by token over all requests; a request leaves the batch when it samples a stop token or reaches its
   token budget, and (inside `episode_caches()`) its cache row is kept, compacted to its real slots and keyed by
   the tokens it covers (the prompt and every sampled token but the last, which was never run).

What a call keeps replaces what the previous call kept, so the caches held are at most one call's requests
(an episode that ended is not in the next call, and its cache goes then); all of them go when the block ends,
before the weights change. Kept caches change which tokens are run, not what they compute: greedy tokens are
the same as re-prefilling gives, sampled tokens and log-probabilities the same within float rounding (tested).
Only models whose every cache layer is a plain growing one keep caches (`keepable`); others re-prefill. Decoding
writes each token's keys/values into room preallocated for the call's longest reply (`GrowingLayer`) instead of
transformers' `torch.cat` of the whole cache at every token, and when requests leave the batch the rows left move
down inside that room (`compact_in_place`; off: every kept row copied into a new room, as transformers'
`batch_select_indices` does), which moves the same numbers and so samples the same tokens.

With `split_prefix` (on where the model allows it: `coevolve.policy.prefix_attention.usable`), the prefix every
prompt of a call shares (at least `MIN_SPLIT` tokens) is run once and held once, outside the batch cache: rows hold
only what follows it, attention is split at it and merged by log-sum-exp, and the next call of the same rollout
reuses it while every prompt still starts with it (its kept caches follow it). The same softmax up to float
rounding; what it saves is the prefix's copy into every row and each decode step's reading of it per row.

Sampling: temperature, top-k, top-p, or greedy at temperature 0; one `torch.Generator` per call, seeded from
`SamplingConfig.seed` when given. Logprobs are `log_softmax(logits / temperature)` of the chosen token (see
`coevolve.policy.backends`). `share_prefill=False` runs every request's whole prompt as its own row and
`keep_cache=False` re-prefills every call's contexts (the baselines the rollout benchmark compares against, and
the references the tests check the stages against).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from coevolve.policy.backends import Generation, SamplingConfig
from coevolve.policy.prefix_attention import SharedPrefix, shared_prefix_attention, usable


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


def _runnable_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """The prefix all `prompts` share, less what would leave a prompt without a token of its own to run (its
    logits start the sampling)."""
    return min(common_prefix_length(prompts), min(len(prompt) for prompt in prompts) - 1)


def cache_keyword(model: Any) -> str:
    """The forward keyword that takes a key/value cache: `cache` since transformers renamed `past_key_values`
    (after 5.20; our CPU pin 5.24 has `cache`, the GPU hosts' 5.20.2, which vLLM 0.33 requires, has the old
    name). Passed under the wrong name, the cache reaches the attention layers but not the mask, which then
    covers the new tokens only."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft wrapper
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def cache_holding(model: Any, layers: Sequence[tuple[Any, Any]]) -> Any:
    """A fresh `DynamicCache` for `model` holding (keys, values) per layer; it grows by copies, never in them."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    for index, (keys, values) in enumerate(layers):
        cache.update(keys, values, index)
    return cache


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


def keepable(model: Any) -> bool:
    """Whether every layer's cache is a plain growing one (`DynamicLayer`), whose rows can be cut out and laid
    into a later batch. Sliding-window and other layer kinds re-prefill as before."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=base.config).layers)


def _growing_layer_class() -> type:
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
        """A `DynamicLayer` that writes each step's keys/values into spare room instead of concatenating: the
        plain layer copies its whole cache at every decoded token (`torch.cat`), which at batch 16 and ~1,000
        tokens of context is most of a decode step's memory traffic here. `keys`/`values` are views of the
        filled part (the last dimension stays contiguous), so attention and masks read them as before."""

        reserve = 64
        """Room added beyond what an update needs, in tokens (set to the call's longest reply budget)."""
        in_place = True
        """Whether dropping rows (`batch_select_indices` with increasing indices: requests leaving the batch)
        moves the kept rows down inside the room instead of copying them all into a new one (set per backend)."""

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.length = 0
            self.rows = 0  # the live rows: the room's first `rows` rows (it may hold more after rows left)
            self.key_room = self.value_room = None

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.device, self.is_initialized = key_states.device, True
            new, rows = key_states.shape[-2], key_states.shape[0]
            if self.key_room is None or self.length + new > self.key_room.shape[-2]:
                room = self.length + new + self.reserve
                keys = key_states.new_empty((rows, key_states.shape[1], room, key_states.shape[-1]))
                values = value_states.new_empty((rows, value_states.shape[1], room, value_states.shape[-1]))
                if self.length:
                    keys[:, :, :self.length] = self.keys
                    values[:, :, :self.length] = self.values
                self.key_room, self.value_room = keys, values
            self.key_room[:rows, :, self.length:self.length + new] = key_states
            self.value_room[:rows, :, self.length:self.length + new] = value_states
            self.length += new
            self.rows = rows
            self._views()
            return self.keys, self.values

        def _views(self) -> None:
            self.keys = self.key_room[:self.rows, :, :self.length]
            self.values = self.value_room[:self.rows, :, :self.length]

        def get_seq_length(self) -> int:
            return self.length

        def _rows(self, pick) -> None:
            if self.length:
                self.key_room, self.value_room = pick(self.key_room[:self.rows]), pick(self.value_room[:self.rows])
                self.rows = self.key_room.shape[0]
                self._views()

        def batch_repeat_interleave(self, repeats: int) -> None:
            self._rows(lambda room: room.repeat_interleave(repeats, dim=0))

        def batch_select_indices(self, indices) -> None:
            keep = indices.tolist() if hasattr(indices, "tolist") else list(indices)
            if not (self.in_place and self.length and all(b > a for a, b in zip(keep, keep[1:]))
                    and all(0 <= row < self.rows for row in keep)):
                self._rows(lambda room: room[indices, ...])
                return
            # Rows only move down (keep is increasing), each into a row that has left or already moved, so a
            # row-by-row copy never reads what it overwrote; only the filled slots move. No new room: at batch
            # 16 and ~600 tokens a fresh room is ~400 MB of the 135M model's cache, allocated (and faulted in)
            # every time a request leaves.
            for target, source in enumerate(keep):
                if source != target:
                    self.key_room[target, :, :self.length].copy_(self.key_room[source, :, :self.length])
                    self.value_room[target, :, :self.length].copy_(self.value_room[source, :, :self.length])
            self.rows = len(keep)
            self._views()

    return GrowingLayer


@dataclass(frozen=True)
class _KeptCache:
    """One request's KV cache after a call: the tokens it covers and, per layer, (keys, values) of shape
    (heads, len(tokens), head_dim)."""

    tokens: tuple[int, ...]
    layers: list[tuple[Any, Any]]
    shared: SharedPrefix | None = None
    """With the split attention: the prefix held once, which `layers` follow (they cover `tokens` after it)."""

    @property
    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.layers)


MIN_SPLIT = 16
"""The shortest shared prefix held once with the split attention; a shorter one is laid into every row."""


class TransformersBackend:
    """Token backend over a loaded `transformers` causal LM (see the module docstring)."""

    def __init__(self, model: Any, tokenizer: Any, share_prefill: bool = True, keep_cache: bool = True,
                 compact_in_place: bool = True, split_prefix: bool = True) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.share_prefill = share_prefill
        self.cache_keyword = cache_keyword(model)
        plain = keepable(model)
        self.keep_cache = keep_cache and plain
        self.split_prefix = split_prefix and share_prefill and plain and usable(model)
        """Hold the prefix all prompts share once and split attention at it (`coevolve.policy.prefix_attention`)
        instead of laying it into every row."""
        self._shared: SharedPrefix | None = None  # during a call with the split: the prefix it holds once
        self.growing_layer = _growing_layer_class() if plain else None
        if self.growing_layer is not None:
            self.growing_layer.in_place = compact_in_place
        self.prefill_tokens = 0
        """Prompt tokens actually run through the model (a counter the benchmark reads)."""
        self.kept_bytes_peak = 0
        """The most bytes of kept caches held at once (the benchmark reports it)."""
        self._kept: list[_KeptCache] | None = None  # inside `episode_caches`: the caches the last call left
        self._next: list[_KeptCache] | None = None  # during a call: the caches it leaves

    @property
    def device(self) -> Any:
        return next(self.model.parameters()).device

    @property
    def context_tokens(self) -> int | None:
        """The model's context (`max_position_embeddings`): the rollout refuses a longer prompt before generation."""
        return int(getattr(getattr(self.model, "config", None), "max_position_embeddings", 0) or 0) or None

    def _forward(self, input_ids: Any, cache: Any, attention_mask: Any = None, position_ids: Any = None) -> Any:
        extra = {"shared_prefix": self._shared} if self._shared is not None else {}
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=True, logits_to_keep=1, **{self.cache_keyword: cache}, **extra)
        return out.logits[:, -1, :]

    @contextlib.contextmanager
    def episode_caches(self) -> Iterator[None]:
        """Keep each request's KV cache between the calls made inside this block (see the module docstring):
        the rollout engine opens one per rollout, so caches never outlive the weights that computed them."""
        if not self.keep_cache or self._kept is not None:  # off, or already open (a nested rollout)
            yield
            return
        self._kept = []
        try:
            yield
        finally:
            self._kept = None

    def _match(self, prompt: tuple[int, ...]) -> "_KeptCache | None":
        """The longest kept cache whose tokens are a proper prefix of `prompt` (one token at least is left to run)."""
        best = None
        for kept in self._kept or ():
            length = len(kept.tokens)
            if length < len(prompt) and (best is None or length > len(best.tokens)) and prompt[:length] == kept.tokens:
                best = kept
        return best

    def _prefill(self, prompts: Sequence[Sequence[int]]) -> tuple[Any, Any, Any]:
        """Run the prompts; return (cache, last-position logits, attention mask), one row per prompt."""
        import torch

        device = self.device
        if self.share_prefill:
            distinct: dict[tuple[int, ...], int] = {}
            row_of = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
            unique = list(distinct)
        else:
            row_of, unique = list(range(len(prompts))), [tuple(p) for p in prompts]
        # With the split attention, the prefix every prompt shares is held once (`self._shared`) and each row's
        # cache starts after it: `offset` tokens no row holds.
        self._shared = self._shared_prefix(unique) if self.split_prefix else None
        offset = self._offset
        # Each distinct prompt's past: a kept cache of an earlier reply of its episode, else (fresh prompts) the
        # prefix common to all fresh prompts, run once on a batch of one.
        pasts: list[tuple[int, list[tuple[Any, Any]]] | None] = [None] * len(unique)
        fresh = []
        for row, prompt in enumerate(unique):
            kept = self._match(prompt)
            if kept is not None and kept.shared is self._shared:  # its layers follow the prefix this call holds
                pasts[row] = (len(kept.tokens) - offset, kept.layers)
            else:
                fresh.append(row)
        if self.share_prefill and fresh and self._shared is None:
            length = _runnable_prefix_length([unique[r] for r in fresh])
            if length > 0:
                layers = self._run_prefix(unique[fresh[0]][:length])
                for row in fresh:
                    pasts[row] = (length, layers)
        past_lengths = [past[0] if past else 0 for past in pasts]
        width_past = max(past_lengths)
        cache = self._new_cache()
        if width_past:
            self._fill(cache, pasts, width_past)
        suffixes = [u[offset + length:] for u, length in zip(unique, past_lengths)]
        width = max(len(s) for s in suffixes)
        pad = self.tokenizer.pad_token_id or 0
        input_ids = torch.full((len(unique), width), pad, dtype=torch.long, device=device)
        mask = torch.zeros((len(unique), width_past + width), dtype=torch.long, device=device)
        for row, (suffix, length) in enumerate(zip(suffixes, past_lengths)):
            # Padding sits before each row's past and between its past and its suffix: masked, and skipped by the
            # position ids, so every row sees exactly its own tokens at their own positions.
            mask[row, width_past - length:width_past] = 1
            input_ids[row, width - len(suffix):] = torch.tensor(suffix, device=device)
            mask[row, width_past + width - len(suffix):] = 1
        positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)[:, width_past:] + offset
        logits = self._forward(input_ids, cache, attention_mask=mask, position_ids=positions)
        self.prefill_tokens += sum(len(s) for s in suffixes)
        index = torch.tensor(row_of, device=device)
        if len(unique) != len(prompts) or row_of != list(range(len(prompts))):
            cache.batch_select_indices(index)
        return cache, logits[index], mask[index]

    def _shared_prefix(self, prompts: Sequence[tuple[int, ...]]) -> SharedPrefix | None:
        """The prefix this call holds once: the one the last call of this rollout held, where every prompt still
        starts with it (the kept caches follow it), else the prefix common to all prompts, run once on a batch of
        one; None where that is shorter than `MIN_SPLIT` tokens (the split would cost more than it reads)."""
        held = next((kept.shared for kept in self._kept or () if kept.shared is not None), None)
        if held is not None and all(held.covers(prompt) for prompt in prompts):
            return held
        length = _runnable_prefix_length(prompts)
        if length < MIN_SPLIT:
            return None
        return SharedPrefix(tuple(prompts[0][:length]), tuple(self._run_prefix(prompts[0][:length])))

    def _run_prefix(self, tokens: Sequence[int]) -> list[tuple[Any, Any]]:
        """Run `tokens` once on a batch of one; their (keys, values) per layer, each (kv_heads, tokens, head_dim)."""
        import torch
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        self._forward(torch.tensor([list(tokens)], device=self.device), cache)
        self.prefill_tokens += len(tokens)
        return [(layer.keys[0], layer.values[0]) for layer in cache.layers]

    @property
    def _offset(self) -> int:
        """Positions before each row's own cache: the prefix held once, where this call holds one."""
        return len(self._shared.tokens) if self._shared is not None else 0

    def _new_cache(self) -> Any:
        """A cache for one generate call: growing layers with room for the call's replies, where every layer is
        a plain one (`keepable`)."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        if self.growing_layer is not None:
            cache.layers = [self.growing_layer() for _ in cache.layers]
        return cache

    def _fill(self, cache: Any, pasts: Sequence[tuple[int, list[tuple[Any, Any]]] | None], width: int) -> None:
        """Lay each row's past keys/values into `cache`, right-aligned in a batch of `width` slots."""
        reference = next(past for past in pasts if past)[1]
        for layer_index, (keys, values) in enumerate(reference):
            heads, _, head_dim = keys.shape
            batch_keys = keys.new_zeros((len(pasts), heads, width, head_dim))
            batch_values = values.new_zeros((len(pasts), values.shape[0], width, values.shape[-1]))
            for row, past in enumerate(pasts):
                if past:
                    length, layers = past
                    batch_keys[row, :, width - length:] = layers[layer_index][0][:, :length]
                    batch_values[row, :, width - length:] = layers[layer_index][1][:, :length]
            cache.update(batch_keys, batch_values, layer_index)

    def _keep(self, cache: Any, live: int, mask: Any, tokens: tuple[int, ...]) -> None:
        """Keep live row `live`'s cache (its real slots only, compacted) for the next call, keyed by its tokens."""
        if self._next is None:
            return
        real = mask[live].nonzero().squeeze(-1)
        layers = [(layer.keys[live].index_select(1, real), layer.values[live].index_select(1, real))
                  for layer in cache.layers]
        self._next.append(_KeptCache(tokens, layers, self._shared))

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig, stop_token_ids: Sequence[int],
                 budgets: Sequence[int] | None = None) -> list[Generation]:
        import torch

        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        limits = [max(1, min(b, sampling.max_new_tokens)) for b in (budgets or [sampling.max_new_tokens] * len(prompts))]
        split = shared_prefix_attention(self.model) if self.split_prefix else contextlib.nullcontext()
        try:
            with torch.inference_mode(), split:
                return self._generate(prompts, sampling, stop_token_ids, limits)
        finally:
            self._shared = None  # what the kept caches follow stays alive through them, and only there

    def _generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig,
                  stop_token_ids: Sequence[int], limits: list[int]) -> list[Generation]:
        import torch

        device = self.device
        generator = None
        if sampling.seed is not None:
            generator = torch.Generator(device=device)
            generator.manual_seed(sampling.seed)
        if self.growing_layer is not None:
            self.growing_layer.reserve = max(limits) + 1
        cache, logits, mask = self._prefill(prompts)
        self._next = [] if self._kept is not None else None
        stops = torch.tensor(sorted(set(stop_token_ids)) or [-1], device=device)
        positions = mask.sum(dim=-1) + self._offset  # next position id of each row
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
            if self._next is not None:  # the cache holds the prompt and every sampled token but the last
                for live in leaving.nonzero().squeeze(-1).tolist():
                    self._keep(cache, live, mask, tuple(prompts[rows[live]]) + tuple(tokens[rows[live]][:-1]))
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
        if self._next is not None:  # what this call left replaces what the last one did: finished episodes drop out
            self._kept, self._next = self._next, None
            self.kept_bytes_peak = max(self.kept_bytes_peak, sum(kept.nbytes for kept in self._kept))
        stop_set = set(stop_token_ids)
        generations = []
        for row in range(len(prompts)):
            text_ids = tokens[row][:-1] if finish[row] == "stop" and tokens[row][-1] in stop_set else tokens[row]
            text = self.tokenizer.decode(text_ids, skip_special_tokens=True)
            generations.append(Generation(text, tuple(tokens[row]), tuple(logps[row]), finish[row]))
        return generations
