"""What the typed bodies' tests share: /openapi.json's request schemas with their references resolved,
and a refusal checked in TEI's error shape."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jsonschema
import orjson
import pytest
from pydantic import BaseModel

from embedfleet.services.gateway.errors import ApiError


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


def served_schema(spec: dict[str, Any], path: str) -> dict[str, Any]:
    """The request schema of POST ``path`` in ``spec`` (as served: JSON), resolved."""
    schema = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return resolved(schema, spec["components"]["schemas"])


def generated_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s schema as pydantic generates it, resolved."""
    generated = model.model_json_schema()
    defs = generated.pop("$defs", {})
    return resolved(orjson.loads(orjson.dumps(generated).replace(b"#/$defs/", b"#/components/schemas/")), defs)


def assert_tei_refusal(parse: Callable[[], object], path: str, status: int, param: str | None, message: str) -> None:
    """``parse`` refuses with exactly this status, field and message, answered in TEI's error shape."""
    with pytest.raises(ApiError) as err:
        parse()
    assert (err.value.status, err.value.param, err.value.message) == (status, param, message)
    answer = err.value.response(path)
    assert answer.status_code == status
    assert orjson.loads(answer.body) == {"error": message, "error_type": "Validation"}


def assert_schema_agrees(schema: dict[str, Any], parse: Callable[[], object], doc: Any, param: str | None) -> None:
    """The route (``parse`` of ``doc``) agrees with its ``schema``: it accepts what the schema accepts
    (``param`` None) and refuses what the schema refuses, with a 400 naming ``param``."""
    if param is None:
        jsonschema.validate(doc, schema)
        parse()
        return
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, schema)
    with pytest.raises(ApiError) as err:
        parse()
    assert (err.value.status, err.value.param) == (400, param) and f"'{param}" in err.value.message
