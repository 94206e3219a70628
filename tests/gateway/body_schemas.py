"""What a typed route's /openapi.json schema says, as values to send: a property's schema turned into
values it accepts and values it refuses, so a test can check that the route agrees with its schema."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from pydantic import BaseModel, create_model

from embedfleet.services.gateway import openapi
from tests.gateway.test_openai_body import _resolved as resolved


def served_body(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The request schema of ``path``'s POST as /openapi.json serves it (JSON), and the components' schemas."""
    spec = orjson.loads(orjson.dumps(openapi.openapi_spec("test")))
    schema = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return schema, spec["components"]["schemas"]


def is_generated(path: str, model: type[BaseModel]) -> bool:
    """Whether ``path``'s served request schema is what pydantic generates for ``model`` (references resolved)."""
    served, components = served_body(path)
    generated = model.model_json_schema()
    defs = generated.pop("$defs", {})
    ours = orjson.loads(orjson.dumps(generated).replace(b"#/$defs/", b"#/components/schemas/"))
    return bool(resolved(served, components) == resolved(ours, defs))


def added_field(monkeypatch: pytest.MonkeyPatch, path: str, name: str) -> Any:
    """The schema ``path`` serves for a field 'added' once openapi.py's model ``name`` has it (an integer)."""
    monkeypatch.setattr(openapi, name, create_model("Wider", __base__=getattr(openapi, name), added=(int, 0)))
    return served_body(path)[0]["properties"].get("added")


def scalar_cases(prop: dict[str, Any]) -> tuple[list[Any], list[Any]] | None:
    """Values a scalar property's schema accepts (its enum, its bounds, null where it is nullable) and
    values it refuses (past its bounds, other types, null where it is not); None for lists and objects."""
    branches = prop.get("anyOf", [prop])
    nullable = any(b.get("type") == "null" for b in branches)
    (branch,) = [b for b in branches if b.get("type") != "null"]
    kind = branch.get("type")
    accepted: list[Any] = [None] if nullable else []
    refused: list[Any] = [] if nullable else [None]
    if "enum" in branch:
        accepted += branch["enum"]
        refused += [f"not {branch['enum'][0]}", 1]
    elif kind == "integer":
        low, high = branch.get("minimum"), branch.get("maximum")
        accepted += [v for v in (low, high) if v is not None] or [0]
        refused += [v for v in (None if low is None else low - 1, None if high is None else high + 1) if v is not None]
        refused += [True, 1.5, "1"]
    elif kind == "string":
        short, long = branch.get("minLength", 0), branch.get("maxLength")
        accepted += ["x" * max(short, 1)] + ([] if long is None else ["x" * long])
        refused += [5, True] + (["x" * (short - 1)] if short else []) + ([] if long is None else ["x" * (long + 1)])
    elif kind == "boolean":
        accepted += [True, False]
        refused += [1, "true"]
    else:
        return None
    return accepted, refused
