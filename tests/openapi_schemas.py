"""Reading /openapi.json's request schemas in tests: references to components resolved."""

from __future__ import annotations

from typing import Any


def resolved(schema: Any, components: dict[str, Any]) -> Any:
    """``schema`` with each reference to components.schemas replaced by what it names."""
    if isinstance(schema, dict):
        ref = schema.get("$ref", "")
        if ref.startswith("#/components/schemas/"):
            return resolved(components[ref.rsplit("/", 1)[1]], components)
        return {k: resolved(v, components) for k, v in schema.items()}
    if isinstance(schema, list):
        return [resolved(v, components) for v in schema]
    return schema
