"""What the typed bodies' tests share: /openapi.json's request schemas (as served, resolved, as
generated, as validators), what a schema accepts and refuses as values to send, and a refusal checked
in the route's error shape."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jsonschema
import orjson
import pytest
from pydantic import BaseModel, create_model

from embedfleet.services.gateway import openapi
from embedfleet.services.gateway.http.errors import ApiError


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


def served_spec() -> dict[str, Any]:
    return orjson.loads(orjson.dumps(openapi.openapi_spec("test")))  # as served: JSON


def request_schema(spec: dict[str, Any], path: str) -> dict[str, Any]:
    """The request schema of POST ``path`` in ``spec``, its references as served."""
    return spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]


def served_schema(spec: dict[str, Any], path: str) -> dict[str, Any]:
    """The request schema of POST ``path`` in ``spec``, resolved."""
    return resolved(request_schema(spec, path), spec["components"]["schemas"])


def served_body(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The request schema of ``path``'s POST as /openapi.json serves it, and the components' schemas."""
    spec = served_spec()
    return request_schema(spec, path), spec["components"]["schemas"]


def generated_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s schema as pydantic generates it, resolved."""
    # as components, the models' references to each other too
    generated = orjson.loads(orjson.dumps(model.model_json_schema()).replace(b"#/$defs/", b"#/components/schemas/"))
    defs = generated.pop("$defs", {})
    return resolved(generated, defs)


def is_generated(path: str, model: type[BaseModel]) -> bool:
    """Whether ``path``'s served request schema is what pydantic generates for ``model``."""
    return bool(served_schema(served_spec(), path) == generated_schema(model))


def assert_served_is_generated(path: str, model: type[BaseModel]) -> dict[str, Any]:
    """``path``'s request schema in /openapi.json is ``model``'s generated one, references resolved; the
    served schema (as served) is returned."""
    spec = served_spec()
    assert served_schema(spec, path) == generated_schema(model)
    return request_schema(spec, path)


def added_field(monkeypatch: pytest.MonkeyPatch, path: str, name: str) -> Any:
    """The schema ``path`` serves for a field 'added' once openapi.py's model ``name`` has it (an integer)."""
    monkeypatch.setattr(openapi, name, create_model("Wider", __base__=getattr(openapi, name), added=(int, 0)))
    return served_body(path)[0]["properties"].get("added")


def schema_validator(path: str) -> jsonschema.Draft202012Validator:
    """A JSON-schema validator of ``path``'s request body (its references into components resolved)."""
    spec = served_spec()
    schema = {**request_schema(spec, path), "components": spec["components"]}
    return jsonschema.Draft202012Validator(schema)


def verdicts(path: str, parse: Callable[[bytes], object], doc: dict[str, Any]) -> tuple[bool, bool]:
    """Whether ``path``'s served schema accepts ``doc``, and whether the route's ``parse`` does (refusing
    with 400)."""
    schema_ok = schema_validator(path).is_valid(doc)
    try:
        parse(orjson.dumps(doc))
    except ApiError as err:
        assert err.status == 400, err.message
        return schema_ok, False
    return schema_ok, True


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


def assert_tei_refusal(parse: Callable[[], object], path: str, status: int, param: str | None, message: str) -> None:
    """``parse`` refuses with exactly this status, field and message, answered in TEI's error shape."""
    with pytest.raises(ApiError) as err:
        parse()
    assert (err.value.status, err.value.param, err.value.message) == (status, param, message)
    answer = err.value.response(path)
    assert answer.status_code == status
    assert orjson.loads(answer.body) == {"error": message, "error_type": "Validation"}


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
