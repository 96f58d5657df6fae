"""Policies: how a model's replies become tool calls (and, as the rollout engine lands, models and backends)."""
