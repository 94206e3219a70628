"""The response models every route shares hold what the routes write: each route's error body, in its
API's shape, for every error code; a chunk's place; a row as numbers or base64."""

from __future__ import annotations

import base64

import numpy as np
import orjson
import pytest
from pydantic import BaseModel, TypeAdapter, ValidationError

from embedfleet.services.gateway.chunking import chunk_places
from embedfleet.services.gateway.http.errors import error_response
from embedfleet.services.gateway.openapi import openapi_spec
from embedfleet.services.gateway.response_parts import (
    ChunkPlace,
    CohereError,
    OpenAIError,
    Row,
    TeiError,
    inline_schema,
)
from embedfleet.services.gateway.routes import ROUTES, Api
from embedfleet.shared.errors import ErrorCode
from embedfleet.shared.text_chunks import TextChunk

SHAPES: dict[Api, type[BaseModel]] = {
    Api.OPENAI: OpenAIError,
    Api.EMBEDFLEET: OpenAIError,
    Api.TEI: TeiError,
    Api.COHERE: CohereError,
}


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: f"{r.method} {r.path}")
def test_every_routes_errors_are_its_apis_error_model(route):
    model = SHAPES[route.api]
    for code in ErrorCode:
        for param in (None, "chunking.size"):
            answer = error_response(route.path, code, "a message", param)
            model.model_validate_json(answer.body)  # strict: every field named, of its type
            for other in {m for m in SHAPES.values() if m is not model}:
                with pytest.raises(ValidationError):
                    other.model_validate_json(answer.body)


def test_each_route_documents_its_apis_error_model():
    spec = orjson.loads(orjson.dumps(openapi_spec("test")))
    by_path = {(r.path, r.method.lower()): SHAPES[r.api] for r in ROUTES}
    # a health route's 503 is health's own body, not an error's (tests/gateway/http/test_health_answers.py)
    health = {(r.path, r.method.lower(), "503") for r in ROUTES if r.handler == "health"}
    checked = 0
    for path, methods in spec["paths"].items():
        for method, operation in methods.items():
            for status, response in operation["responses"].items():
                if (path, method, status) in health:
                    continue
                if status.startswith(("4", "5")) and "application/json" in response.get("content", {}):
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == orjson.loads(orjson.dumps(inline_schema(by_path[(path, method)]))), (path, status)
                    checked += 1
    assert checked > len(ROUTES)


def test_chunk_places_are_chunk_place_rows():
    chunks = [[TextChunk(0, 5, 0, 3), TextChunk(4, 9, 2, 5)], [], [TextChunk(0, 4, 0, 4)]]
    places = orjson.loads(orjson.dumps(chunk_places(chunks)))
    assert [ChunkPlace.model_validate(p, strict=True).model_dump() for p in places] == places
    with pytest.raises(ValidationError):
        ChunkPlace.model_validate({**places[0], "extra": 1})


def test_a_row_is_numbers_or_base64():
    rows = TypeAdapter(list[Row])
    floats = np.array([0.5, -1.25], np.float32)
    as_json = orjson.loads(orjson.dumps([floats.tolist(), [1, -2, 3], base64.b64encode(floats.tobytes()).decode()]))
    assert rows.validate_python(as_json, strict=True) == as_json
    with pytest.raises(ValidationError):
        rows.validate_python([{"a": 1}], strict=True)
