"""Shared fixtures: the shipped SmolLM2 (converted once into the repo's .cache), its tokenizer, tiny models, and a
scripted token backend that replies with chosen texts (to test the rollout engine with known replies)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Tests never write to the user's home cache, and never reach a hub.
os.environ.setdefault("COEVOLVE_CACHE", str(Path(__file__).resolve().parent.parent / ".cache"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TRL_TEMPLATES = "trl/chat_templates"


@pytest.fixture(scope="session")
def appworld_venv() -> Path:
    """AppWorld's own venv. `make test` builds it (`make appworld-venv`), so a test that needs it fails without it,
    saying how to build it, rather than skipping."""
    venv = Path(__file__).resolve().parent.parent / ".venv-appworld"
    if not (venv / ".installed").exists():
        pytest.fail("AppWorld's venv is missing: run `make appworld-venv` (`make test` builds it)", pytrace=False)
    return venv


@pytest.fixture(scope="session")
def smol_dir() -> Path:
    from coevolve.policy.models import shipped_model_dir

    return shipped_model_dir()


@pytest.fixture(scope="session")
def tokenizer(smol_dir):
    from coevolve.policy.models import load_tokenizer

    return load_tokenizer(str(smol_dir))


@pytest.fixture(scope="session")
def tiny_model(tokenizer):
    from coevolve.policy.models import build_tiny_model

    return build_tiny_model(tokenizer, hidden_size=64, num_layers=2, seed=0)


def trl_template(name: str) -> str:
    """A chat template file shipped inside the installed trl package (offline), e.g. `qwen2_5`."""
    import trl

    return (Path(trl.__file__).parent / "chat_templates" / f"{name}.jinja").read_text()


@pytest.fixture()
def qwen_tokenizer(smol_dir):
    """The SmolLM2 tokenizer (same ChatML tokens) with Qwen2.5's tool-aware chat template."""
    from coevolve.policy.models import load_tokenizer

    tokenizer = load_tokenizer(str(smol_dir))
    tokenizer.chat_template = trl_template("qwen2_5")
    return tokenizer


class ScriptedBackend:
    """A token backend whose replies are chosen by `reply_for(decoded_context) -> text`.

    Replies are tokenized and end with the stop token, like a model that wrote exactly that text; logprobs are a
    fixed -0.5 per token so tests can tell model positions from others."""

    def __init__(self, tokenizer, reply_for, stop_token: int | None = None) -> None:
        self.tokenizer = tokenizer
        self.reply_for = reply_for
        self.stop_token = stop_token
        self.calls: list[int] = []  # batch size of each generate call

    def generate(self, prompts, sampling, stop_token_ids, budgets=None):
        from coevolve.policy.backends import Generation

        self.calls.append(len(prompts))
        stop = self.stop_token if self.stop_token is not None else stop_token_ids[-1]
        out = []
        for index, prompt in enumerate(prompts):
            text = self.reply_for(self.tokenizer.decode(prompt))
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [stop]
            limit = min(sampling.max_new_tokens, budgets[index] if budgets else sampling.max_new_tokens)
            finish = "stop"
            if len(ids) > limit:
                ids, finish = ids[:limit], "length"
            shown = ids[:-1] if finish == "stop" else ids
            out.append(Generation(self.tokenizer.decode(shown), tuple(ids), tuple([-0.5] * len(ids)), finish))
        return out


@pytest.fixture()
def scripted():
    return ScriptedBackend


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, tokenizer):
    """A random tiny Llama saved as a folder with the SmolLM2 tokenizer (TRL loads policy and reference by path)."""
    from coevolve.policy.models import build_tiny_model
    from support import save_model

    return save_model(build_tiny_model(tokenizer, hidden_size=64, num_layers=2, seed=0), tokenizer,
                      tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def ls_policy_dir(tokenizer):
    """A tiny model taught to answer BFCL-lite prompts with `[ls()]` or `[pwd()]` at about even odds (see
    support.py), so GRPO groups on `ls()` tasks have reward variance. Built once into the test cache (~15 s)."""
    import shutil
    import tempfile

    from coevolve.policy.models import build_tiny_model, cache_dir
    from support import LS_REPLIES, ls_tasks, opening_prompts, save_model, teach_replies

    target = cache_dir() / "test-models" / "ls-policy-v1"
    if (target / "model.safetensors").exists():
        return target
    model = build_tiny_model(tokenizer, hidden_size=64, num_layers=2, seed=0)
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    teach_replies(model, tokenizer, opening_prompts(tokenizer, ls_tasks(4)), LS_REPLIES, stop, steps=60)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent))
    save_model(model, tokenizer, staging)
    try:
        staging.rename(target)  # atomic: a concurrent or killed build never leaves half a model
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return target
