"""coevolve: GRPO for tool-use agents whose training data co-evolves with them (CoEvolve, arXiv 2604.15840)."""

__version__ = "0.1.0"
