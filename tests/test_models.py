"""Model loading: the shipped SmolLM2 converted from its GGUF, tiny models, clear errors."""

from __future__ import annotations

import json

import pytest

from coevolve.policy import models


def test_shipped_model_is_a_plain_safetensors_folder(smol_dir):
    assert (smol_dir / "model.safetensors").is_file() and (smol_dir / "tokenizer.json").is_file()
    config = json.loads((smol_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    assert models.shipped_model_dir() == smol_dir  # converted once, then reused


@pytest.mark.slow
def test_converted_weights_equal_the_gguf_dequantized_ones(smol_dir):
    import torch
    from transformers import AutoModelForCausalLM

    gguf = models.shipped_gguf()
    original = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    converted, tokenizer = models.load_model(str(smol_dir), device="cpu")
    assert sum(p.numel() for p in converted.parameters()) == 134_515_008
    ids = torch.tensor([tokenizer("<|im_start|>user\nList the files here.<|im_end|>\n")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(original(ids).logits, converted(ids).logits)
    assert tokenizer.chat_template and tokenizer.pad_token_id is not None


def test_conversion_is_atomic(tmp_path, monkeypatch):
    calls = []

    def fake_convert(gguf_path, out_dir):
        calls.append(out_dir)
        (out_dir / "model.safetensors").write_text("weights")

    monkeypatch.setattr(models, "_convert_gguf", fake_convert)
    stale = tmp_path / "smollm2-135m-instruct"
    stale.mkdir()
    (stale / "half-written").write_text("x")  # an earlier conversion died here: no completion marker
    folder = models.shipped_model_dir(tmp_path)
    assert folder == stale and (folder / "model.safetensors").is_file() and not (folder / "half-written").exists()
    assert models.shipped_model_dir(tmp_path) == folder and len(calls) == 1

    def broken(gguf_path, out_dir):
        raise RuntimeError("disk full")

    monkeypatch.setattr(models, "_convert_gguf", broken)
    with pytest.raises(RuntimeError):
        models.shipped_model_dir(tmp_path / "other")
    assert not list((tmp_path / "other").iterdir())  # nothing half-written left behind


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_tiny_models_of_both_families(tokenizer, family):
    import torch

    model = models.build_tiny_model(tokenizer, family=family)
    logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, len(tokenizer)) and torch.isfinite(logits).all()


def test_missing_model_is_a_clear_error(tmp_path):
    with pytest.raises(models.ModelError, match="no such folder"):
        models.load_model(str(tmp_path / "nowhere"))
    with pytest.raises(models.ModelError, match="unknown dtype"):
        models.torch_dtype("float8", "cpu")
