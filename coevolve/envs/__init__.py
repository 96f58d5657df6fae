"""Environments and their registry. `make_env("bfcl", category="multi_turn_base")` builds one by name."""

from __future__ import annotations

from typing import Any

from coevolve.envs.base import Env, Episode
from coevolve.registry import Registry

ENVS: Registry[Any] = Registry("env", builtins={"bfcl": "coevolve.envs.bfcl", "bfcl-lite": "coevolve.envs.bfcl_lite",
                                           "appworld": "coevolve.envs.appworld", "python": "coevolve.envs.python_env",
                                           "mcp": "coevolve.envs.mcp_env"})


def make_env(name: str, **options: Any) -> Env:
    return ENVS.get(name)(**options)


__all__ = ["ENVS", "Env", "Episode", "make_env"]
