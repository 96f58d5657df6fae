"""Config text into plain data, bounded: YAML documents (`read_yaml`) and `section.key=value` overrides
(`apply_overrides`). A config comes from a user or a shared file, so it is read as untrusted input: a size cap, a
depth cap and a cap on values with every YAML alias expanded, each failing with a one-line `ConfigError`.
`coevolve.config` turns the data into typed sections.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence


class ConfigError(ValueError):
    """A config file or override that cannot be used; the message names the key and the fix."""


MAX_CONFIG_BYTES = 1 << 20
MAX_YAML_VALUES = 100_000
"""Values a config may hold once its aliases are expanded: a 540-byte document of nested aliases (a "billion laughs")
would otherwise expand without bound when the config is copied or written back."""
MAX_YAML_DEPTH = 64


def read_yaml(text: str, where: str) -> Any:
    """YAML text -> plain data, bounded: at most MAX_YAML_VALUES values with every alias expanded, at most
    MAX_YAML_DEPTH levels deep, no alias that contains itself; anything else is a one-line ConfigError."""
    import yaml

    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{where}: {len(text)} characters; a config is at most {MAX_CONFIG_BYTES}")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"{where} is not valid YAML: {' '.join(str(error).split())[:300]}") from None
    except RecursionError:
        raise ConfigError(f"{where}: nested deeper than {MAX_YAML_DEPTH} levels") from None
    sizes: dict[int, int] = {}

    def size(node: Any, depth: int, open_nodes: set[int]) -> int:
        if depth > MAX_YAML_DEPTH:
            raise ConfigError(f"{where}: nested deeper than {MAX_YAML_DEPTH} levels")
        if not isinstance(node, (dict, list)):
            return 1
        key = id(node)
        if key in open_nodes:
            raise ConfigError(f"{where}: a YAML alias contains itself")
        if key not in sizes:  # an alias is the same object again: its size is counted at every use, computed once
            open_nodes.add(key)
            total = 1
            for item in (list(node.keys()) + list(node.values()) if isinstance(node, dict) else node):
                total += size(item, depth + 1, open_nodes)
                if total > MAX_YAML_VALUES:
                    raise ConfigError(f"{where}: expands to more than {MAX_YAML_VALUES} values (nested YAML "
                                      "aliases?); write the values out")
            open_nodes.discard(key)
            sizes[key] = total
        return sizes[key]

    if size(value, 0, set()) > MAX_YAML_VALUES:
        raise ConfigError(f"{where}: expands to more than {MAX_YAML_VALUES} values (nested YAML aliases?)")
    return value


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """`section.key=value` strings; the value is read as YAML (`4`, `1e-6`, `true`, `null`, `[a, b]`). A mapping
    field takes one more level: `env.options.root=/data/appworld`."""
    for name, values in data.items():
        if values is not None and not isinstance(values, Mapping):
            raise ConfigError(f"config section {str(name)[:40]!r} must be a mapping of keys (section: then key: "
                              f"value lines), got {type(values).__name__}")
    data = {name: dict(values or {}) for name, values in data.items()}
    for override in overrides:
        key, sep, text = override.partition("=")
        parts = key.strip().split(".")
        if not sep or len(parts) not in (2, 3) or not all(parts):
            raise ConfigError(f"override {override!r}: expected section.key=value, e.g. grpo.learning_rate=1e-6")
        value = read_yaml(text, f"override {override[:80]!r}") if text.strip() else ""
        section = data.setdefault(parts[0], {})
        if len(parts) == 3:
            inner = section.get(parts[1])
            if inner is not None and not isinstance(inner, Mapping):
                raise ConfigError(f"override {override!r}: {parts[0]}.{parts[1]} is not a mapping")
            section[parts[1]] = {**(inner or {}), parts[2]: value}
        else:
            section[parts[1]] = value
    return data
