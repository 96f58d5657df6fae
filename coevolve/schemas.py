"""What the offline explorer can draw from a tool's JSON schema: one schema of a `$ref` / `anyOf` / `oneOf` / type
list (`schema_choice`), and the required arguments it cannot fill at all (`unfillable_arguments`), so that an env
whose tools it cannot explore is refused before anything slow (env mcp's check, `coevolve.run_setup`).
"""

from __future__ import annotations

import random
from typing import Any, Mapping, Sequence

FILLABLE_TYPES = ("string", "integer", "number", "float", "boolean", "array", "object")


def schema_choice(schema: Mapping[str, Any], defs: Mapping[str, Any], rng: random.Random | None = None
                  ) -> Mapping[str, Any] | None:
    """The schema a value is drawn from: a local `$ref` (`#/$defs/Card`) resolved, one option of an
    `anyOf`/`oneOf` or of a list of types other than null (drawn, or the first without `rng`); None when nothing
    can be drawn (null only, an unknown reference)."""
    for _ in range(8):
        reference = schema.get("$ref")
        if not isinstance(reference, str):
            break
        schema = defs.get(reference.rsplit("/", 1)[-1]) if reference.startswith("#/") else None
        if not isinstance(schema, Mapping):
            return None
    options = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(options, list):
        usable = [option for option in options if isinstance(option, Mapping) and option.get("type") != "null"]
        if not usable:
            return None
        merged = {key: value for key, value in schema.items() if key not in ("anyOf", "oneOf")}
        return schema_choice({**merged, **(rng.choice(usable) if rng else usable[0])}, defs, rng)
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [item for item in kind if item != "null"]
        return {**schema, "type": kinds[0]} if kinds else None
    return schema


def unfillable_arguments(docs: Sequence[Mapping[str, Any]]) -> list[str]:
    """`tool(argument)` for each required argument the offline explorer cannot draw a value for (a type it does
    not know, `allOf`/`not`, a reference it cannot resolve), so a run can refuse before anything slow."""
    found = []
    for doc in docs:
        parameters = doc.get("parameters") or {}
        defs = {**(parameters.get("definitions") or {}), **(parameters.get("$defs") or {})}
        for name in parameters.get("required") or ():
            schema = (parameters.get("properties") or {}).get(name)
            if not isinstance(schema, Mapping) or not _fillable(schema, defs, 0):
                found.append(f"{doc.get('name')}({name})")
    return found


def _fillable(schema: Mapping[str, Any], defs: Mapping[str, Any], depth: int) -> bool:
    chosen = schema_choice(schema, defs)
    if chosen is None or depth > 8 or "allOf" in chosen or "not" in chosen:
        return False
    if "const" in chosen or chosen.get("enum"):
        return True
    kind = chosen.get("type", "string")
    if kind == "array":
        items = chosen.get("items") or {}
        return not chosen.get("minItems") or (isinstance(items, Mapping) and _fillable(items, defs, depth + 1))
    if kind == "object":
        properties = chosen.get("properties") or {}
        return all(isinstance(properties.get(name), Mapping) and _fillable(properties[name], defs, depth + 1)
                   for name in chosen.get("required") or ())
    return kind in FILLABLE_TYPES
