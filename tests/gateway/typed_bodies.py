"""A typed body's route as /openapi.json serves it: its request schema, resolved or as a validator."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jsonschema
import orjson
from pydantic import BaseModel

from embedfleet.services.gateway.errors import ApiError
from embedfleet.services.gateway.openapi import openapi_spec
from tests.gateway.test_openai_body import _resolved


def served_spec() -> dict[str, Any]:
    return orjson.loads(orjson.dumps(openapi_spec("test")))  # as served: JSON


def request_schema(spec: dict[str, Any], path: str) -> dict[str, Any]:
    return spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]


def assert_served_is_generated(path: str, model: type[BaseModel]) -> dict[str, Any]:
    """``path``'s request schema in /openapi.json is ``model``'s generated one, references resolved; the
    served schema is returned."""
    spec = served_spec()
    served = request_schema(spec, path)
    # as components: the generated models' references to each other too
    generated = orjson.loads(orjson.dumps(model.model_json_schema()).replace(b"#/$defs/", b"#/components/schemas/"))
    defs = generated.pop("$defs", {})
    assert _resolved(served, spec["components"]["schemas"]) == _resolved(generated, defs)
    return served


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
