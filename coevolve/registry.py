"""Name -> factory registries (envs, generation backends, explorers, ...).

Like verl's decorator registries: registering a name twice is an error, so a plug-in cannot silently replace a
built-in. Built-ins are registered lazily by module path, so looking up `bfcl` does not import every other env
(AppWorld's client, torch-backed policies) and `coevolve eval` on replayed calls stays fast.
"""

from __future__ import annotations

import importlib
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str, builtins: dict[str, str] | None = None) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        # name -> module that registers it on import
        self._builtins: dict[str, str] = dict(builtins or {})

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered ({self._entries[name]!r})")
            self._entries[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        if name not in self._entries and name in self._builtins:
            importlib.import_module(self._builtins[name])
        if name not in self._entries:
            raise KeyError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}")
        return self._entries[name]

    def names(self) -> list[str]:
        return sorted(set(self._entries) | set(self._builtins))

    def __contains__(self, name: str) -> bool:
        return name in self._entries or name in self._builtins
