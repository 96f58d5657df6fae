"""Generation backends behind one small interface, and the vLLM backend.

Two kinds of backend serve the rollout engine:
- token backends (`TransformersBackend`, `VLLMBackend`) take prompts as token ids and return the sampled token
  ids with their logprobs: what GRPO training needs (exact tokens, per-token masks, sampling logprobs);
- chat backends (`OpenAIBackend`) take message lists and return text (and native tool calls): what evaluation
  and the explorer of synthesis need from hosted or `vllm serve` models. Their trajectories carry no
  token record, so they cannot feed training.

Logprobs: every token backend reports log p(token) under the model's distribution at the sampling temperature,
`log_softmax(logits / temperature)`, the quantity TRL recomputes for its importance-sampling correction. With the
default `top_p=1, top_k=0` this is exactly the distribution that sampled the token; with top-p/top-k truncation it
is the untruncated distribution (as in TRL and vLLM's `processed_logprobs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

BACKENDS = ("transformers", "vllm", "openai")


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 1.0
    """0 means greedy decoding."""
    top_p: float = 1.0
    top_k: int = 0
    """0 disables top-k."""
    max_new_tokens: int = 256
    seed: int | None = None
    """Seeds the sampler of the call (token backends); None draws from torch's global generator."""

    def __post_init__(self) -> None:
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0 or self.max_new_tokens < 1:
            raise ValueError(f"invalid sampling settings: {self}")


@dataclass(frozen=True)
class Generation:
    """One sampled reply."""

    text: str
    """The reply's text, without the stop token."""
    token_ids: tuple[int, ...] = ()
    """Sampled tokens, including the stop token when one ended the reply (token backends only)."""
    logprobs: tuple[float, ...] = ()
    finish_reason: str = "stop"
    """`stop` (an end token or end of turn) or `length` (the token budget ran out)."""
    tool_calls: tuple[str, ...] | None = None
    """Native tool calls as JSON texts `{"name", "arguments"}` (chat backends with function calling), else None."""
    error: str | None = None
    """Why the backend could not produce the reply (chat backends after their retry budget); text is then empty."""


@runtime_checkable
class TokenBackend(Protocol):
    tokenizer: Any

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig, stop_token_ids: Sequence[int],
                 budgets: Sequence[int] | None = None) -> list[Generation]:
        """One reply per prompt. `budgets` caps each prompt's new tokens below `sampling.max_new_tokens`."""


@runtime_checkable
class ChatBackend(Protocol):
    def chat(self, conversations: Sequence[Sequence[Mapping[str, Any]]], tools: Sequence[Sequence[Mapping[str, Any]]],
             sampling: SamplingConfig) -> list[Generation]: ...


class BackendUnavailable(RuntimeError):
    """The chosen backend cannot run here; the message names what is missing and how to get it."""


class VLLMBackend:
    """vLLM offline engine (GPU). Prefix caching shares the prefill of the K samples of a prompt, and of the
    common system prompt, automatically. Imported only when chosen."""

    def __init__(self, model_path: str, tokenizer: Any, gpu_memory_utilization: float = 0.5,
                 dtype: str = "auto", max_model_len: int | None = None, engine: Any = None,
                 **engine_args: Any) -> None:
        try:
            import vllm  # noqa: F401
        except ImportError as error:
            raise BackendUnavailable(
                f"the vllm backend needs the `vllm` package and a CUDA GPU ({error}); on a GPU host, "
                "`bash bench/gpu.sh --setup` builds .venv-gpu with it (requirements/gpu.txt); or choose "
                "--backend transformers"
            ) from None
        from vllm import LLM

        self.tokenizer = tokenizer
        self.context_tokens = max_model_len
        """The engine's context, when set: the rollout refuses a longer prompt before generation."""
        # `engine`: an existing `vllm.LLM`, e.g. the one TRL colocates with training and keeps in sync with its weights.
        self.engine = engine or LLM(model=model_path, dtype=dtype, gpu_memory_utilization=gpu_memory_utilization,
                                    enable_prefix_caching=True, max_model_len=max_model_len,
                                    logprobs_mode="processed_logprobs", **engine_args)

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig, stop_token_ids: Sequence[int],
                 budgets: Sequence[int] | None = None) -> list[Generation]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        budgets = budgets or [sampling.max_new_tokens] * len(prompts)
        params = [
            SamplingParams(
                temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k or -1,
                max_tokens=min(budget, sampling.max_new_tokens), logprobs=0, skip_special_tokens=True,
                seed=None if sampling.seed is None else sampling.seed + index, stop_token_ids=list(stop_token_ids),
            )
            for index, budget in enumerate(budgets)
        ]
        outputs = self.engine.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params,
                                       use_tqdm=False)
        generations = []
        for output in outputs:
            sample = output.outputs[0]
            token_ids = tuple(sample.token_ids)
            logprobs = tuple(
                float(entry[token].logprob) if entry and token in entry else 0.0
                for token, entry in zip(token_ids, sample.logprobs or [None] * len(token_ids))
            )
            finish = "length" if sample.finish_reason == "length" else "stop"
            generations.append(Generation(sample.text, token_ids, logprobs, finish))
        return generations


class VLLMClientBackend:
    """Token backend over a vLLM server reached through a client with TRL's `VLLMClient.generate` interface
    (`trl vllm-serve`; the trainer pushes its weights to that server). Requests are grouped by token budget, since
    the server takes one `max_tokens` per request."""

    def __init__(self, client: Any, tokenizer: Any) -> None:
        self.client = client
        self.tokenizer = tokenizer

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig, stop_token_ids: Sequence[int],
                 budgets: Sequence[int] | None = None) -> list[Generation]:
        limits = [min(b, sampling.max_new_tokens) for b in (budgets or [sampling.max_new_tokens] * len(prompts))]
        by_budget: dict[int, list[int]] = {}
        for index, limit in enumerate(limits):
            by_budget.setdefault(max(1, limit), []).append(index)
        results: list[Generation | None] = [None] * len(prompts)
        stops = set(stop_token_ids)
        for limit, indices in by_budget.items():
            # No seed: the server applies one seed to every prompt of a request, which would make the K copies of
            # a prompt (one GRPO group) sample the same reply. Server rollouts are therefore not reproducible.
            extra: dict[str, Any] = {"stop_token_ids": list(stop_token_ids)}
            out = self.client.generate(prompts=[list(prompts[i]) for i in indices], n=1,
                                       temperature=sampling.temperature, top_p=sampling.top_p,
                                       top_k=sampling.top_k, max_tokens=limit, logprobs=0, generation_kwargs=extra)
            for index, token_ids, logprobs in zip(indices, out["completion_ids"], out["logprobs"]):
                token_ids = tuple(token_ids)
                finish = "stop" if token_ids and token_ids[-1] in stops else "length"
                text_ids = token_ids[:-1] if finish == "stop" else token_ids
                results[index] = Generation(self.tokenizer.decode(text_ids, skip_special_tokens=True), token_ids,
                                            tuple(float(lp[0]) if lp and lp[0] is not None else 0.0 for lp in logprobs),
                                            finish)
        return [r for r in results if r is not None]


def make_backend(name: str, model: str = "", *, tokenizer: Any = None, device: str = "auto", dtype: str = "auto",
                 base_url: str | None = None, api_key: str | None = None, **options: Any) -> Any:
    """Build a backend by name. `model` is a model spec (see `coevolve.policy.models`) or, for `openai`, the
    served model's name."""
    if name == "transformers":
        from coevolve.policy.hf_backend import TransformersBackend
        from coevolve.policy.models import load_model

        hf_model, hf_tokenizer = load_model(model, dtype=dtype, device=device)
        return TransformersBackend(hf_model, tokenizer or hf_tokenizer, **options)
    if name == "vllm":
        from coevolve.policy.models import load_tokenizer, resolve_model

        return VLLMBackend(resolve_model(model), tokenizer or load_tokenizer(model), dtype=dtype, **options)
    if name == "openai":
        from coevolve.policy.openai_backend import OpenAIBackend

        return OpenAIBackend(model=model, base_url=base_url, api_key=api_key, **options)
    raise ValueError(f"unknown backend {name!r}; choose one of {BACKENDS}")
