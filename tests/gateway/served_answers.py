"""What the typed answers' tests share: a route's 200 JSON schema as /openapi.json serves it (resolved),
and an answer's keys changed one at a time, each of which its model must refuse."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from pydantic import BaseModel, ValidationError

from tests.gateway.typed_bodies import generated_schema, resolved, served_spec


def served_answer(path: str, method: str = "post") -> dict[str, Any]:
    """The 200 JSON schema of ``method`` ``path`` in /openapi.json as served, its references resolved."""
    spec = served_spec()
    schema = spec["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"]
    return resolved(schema, spec["components"]["schemas"])


def assert_served_answer_is(path: str, model: type[BaseModel], method: str = "post") -> None:
    assert served_answer(path, method) == generated_schema(model), path


def wrong_answers(answer: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``answer`` with one top-level key renamed, dropped, set to null, or one key added."""
    yield "extra added", {**answer, "extra": 1}
    for key in answer:
        rest = {k: v for k, v in answer.items() if k != key}
        yield f"{key} renamed", {**rest, f"{key}s": answer[key]}
        yield f"{key} dropped", rest
        yield f"{key} null", {**rest, key: None}


def assert_holds(model: type[BaseModel], body: bytes) -> dict[str, Any]:
    """``body`` (the bytes a route writes) is a ``model`` answer, strictly, and ``model`` refuses it with any
    top-level key renamed, dropped (where the key is required), null (where it may not be) or added; the answer is returned."""
    model.model_validate_json(body)
    answer: dict[str, Any] = orjson.loads(body)
    schema = model.model_json_schema()
    required = set(schema.get("required", answer))
    nullable = {k for k, p in schema.get("properties", {}).items() if {"type": "null"} in p.get("anyOf", [])}
    for change, wrong in wrong_answers(answer):
        key, how = change.split()
        if (how == "dropped" and key not in required) or (how == "null" and key in nullable):
            model.model_validate_json(orjson.dumps(wrong))  # an optional key may be left out, a nullable one null
            continue
        with pytest.raises(ValidationError):
            model.model_validate_json(orjson.dumps(wrong))
    return answer
