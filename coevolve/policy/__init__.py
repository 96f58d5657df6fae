"""Policies: model loading (`models`), chat rendering (`chat`), reply splitting (`replies`) and the generation
backends (`backends`, `hf_backend`, `openai_backend`, and `serve` for a local OpenAI-compatible endpoint)."""
